"""Benchmark: the caller's turns in noise, through the real Silero VAD and the endpointer, noise floor on and off.

Each case is `LEAD_S` of noise, a question in a voice, and `TAIL_S` more noise, mixed at an SNR (bench/noise_set.py),
fed in 32 ms windows to the VAD and the endpointer as a call's audio would be (the end-of-turn rule at its fixed
silence, `endpointing.end_silence_ms`: the decision at a pause is another benchmark's). Per noise family, SNR and
setting:
- heard: the turn ended within TAIL_S of the true end of speech (the last sound above -40 dBFS of the clean
  question); else the VAD took the noise for the caller still talking, and the reply waits for the noise to stop;
- end: ms from the true end of speech to the end of the turn (the moment the endpointer ends it; p50 / p90 of those
  heard);
- opening turn: a turn began in the line's first `noise_floor.first_s`, where the VAD decides alone;
- early start: a turn began in the noise after that and before the question;
- cut: the turn ended while the caller was still talking; end clipped: the silence that ended it began more than
  CLIPPED_MS before the question's last sound (its last syllable was taken for silence);
- caller at once: the same questions with no lead, the caller talking as the line opens (clean, and each noise at
  10 dB): the line's first sound is the caller, not their background;
- noise only: `NOISE_ONLY_S` of each noise alone at the level of the 10 dB case: turns begun per minute, and the
  share of the time the endpointer was in a turn (while the bot talks, the time its audio would be paused).
Each voice also says one long turn, its questions one after another `LONG_GAP_MS` apart (12-20 s of talk: a
caller's own long turn must not become the floor). The clean row is the same turns without noise. Noise families
and caller voices are split: tune on `--split tune` (espeak-ng babble, brown, pink; espeak-ng and hibari callers),
report on `--split held` (flite babble, a television, white noise, music; flite, piper and human callers where
installed).

    .venv/bin/python bench/noise_turns.py --split tune --json docs/bench/noise_turns_tune.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.noise_set import HELD, TUNE, mix, noise
from bench.turn_set import pick_voices
from bench.voice_latency import pct
from bench.voices import RATE, Renderer, Voice, families, human_utterances
from models import cpu
from models.speech.vad_silero import WINDOW, SileroVad
from pipeline.config import CallerLevelConfig, EndpointingConfig, NoiseConfig, NoiseFloorConfig
from pipeline.denoise import make
from pipeline.endpointing import replay

LEAD_S = 3.0
TAIL_S = 8.0
NOISE_ONLY_S = 60.0
SNRS = (15.0, 10.0, 5.0)
AUDIBLE = 10 ** (-40 / 20)
LONG_GAP_MS = 120  # between the sentences of a long turn: shorter than endpointing.early_final_ms
QUIETER_DB = (3.0, 6.0, 9.0)  # a second question this much quieter than the first
CLIPPED_MS = 100  # a turn whose silence began this long before the question's last sound lost its end
WINDOW_MS = 1000 * WINDOW / RATE
TUNE_QUESTIONS = [
    "What is the capital of France?",
    "Can you book a table for two at eight tonight?",
    "How do I reset my password?",
    "What time does the last train to Boston leave tonight?",
    "Is there a pharmacy near the station that is open after ten at night?",
    "How many tablespoons are in a quarter of a cup?",
]
HELD_QUESTIONS = [
    "Could you tell me how far it is to the airport?",
    "I would like to change my delivery address, please.",
    "What's the best way to keep basil fresh?",
    "Do you have any tables free on Friday evening?",
    "How much does the monthly plan cost?",
    "My card was declined at the shop this morning.",
]
TUNE_VOICES = ["espeak-en-us-160", "espeak-en-gb+m3-140", "hibari-heart", "hibari-heart-fast"]
HELD_VOICES = ["flite-slt", "flite-kal16", "piper-joe", "piper-joe-slow"]


@dataclass(frozen=True)
class Setting:
    name: str
    noise_floor: NoiseFloorConfig
    suppressor: str = "off"  # pipeline/denoise.py's noise suppression before the VAD (session.noise)
    caller_level: CallerLevelConfig = field(default_factory=lambda: CallerLevelConfig(enabled=False))


def run_audio(audio: np.ndarray, vad: SileroVad, config: EndpointingConfig, suppressor: str = "off"
              ) -> list[tuple[str, float]]:
    """The endpointer's decisions on `audio` (16 kHz float32): (kind, ms into the audio). With a `suppressor` (a
    session.noise setting, at its default min_floor_dbfs) the audio goes through it first, fed in 20 ms frames; its
    delay is kept, as on a call."""
    made = make(suppressor, NoiseConfig().min_floor_dbfs)
    if made is not None:
        audio = np.concatenate([made.process(audio[i:i + 320]) for i in range(0, len(audio), 320)])
    probs = vad.new_stream().probabilities(audio)
    return [(d.kind, d.audio_ms) for d in replay(probs, audio, config, WINDOW, WINDOW_MS)]


def variants(families: tuple[str, ...]) -> list[tuple[str, float | None, float, float | None]]:
    """(noise family, SNR or None for clean, lead in seconds, None or how many dB quieter than an earlier question of
    the caller's this one is) of each case: after LEAD_S of the line, at every SNR; the caller speaking at once, as the
    line opens (no lead: clean, and each noise at 10 dB), where the start of the line is the caller and not their
    background; and the caller's second question, `LEAD_S` after their first (clean, and each noise at 10 dB), where
    their level is known from the first, and on a clean line asked QUIETER_DB quieter (the caller's level gate's other
    side: pipeline/caller_level.py)."""
    cases: list[tuple[str, float | None, float, float | None]] = [("clean", None, LEAD_S, None)]
    cases += [(family, snr, LEAD_S, None) for family in families for snr in SNRS]
    cases += [("clean", None, 0.0, None)] + [(family, 10.0, 0.0, None) for family in families]
    cases += [("clean", None, LEAD_S, quieter) for quieter in (0.0, *QUIETER_DB)]
    return cases + [(family, 10.0, LEAD_S, 0.0) for family in families]


def one_case(decisions: list[tuple[str, float]], start_ms: float, end_ms: float, config: EndpointingConfig,
             since_ms: float = 0.0) -> dict[str, Any]:
    """The case's figures; `since_ms`: where the caller's earlier question (if any) ended."""
    opening = any(k == "start" and at < config.noise_floor.first_s * 1000 for k, at in decisions)
    quiet_from = max(since_ms, config.noise_floor.first_s * 1000)
    early = any(k == "start" and quiet_from <= at < start_ms - config.min_speech_ms for k, at in decisions)
    # a turn ends when its silence has lasted end_silence_ms: the decision's moment, after the silence began
    ends = [at + config.end_silence_ms for k, at in decisions if k == "stop" and at > start_ms]
    cut = bool(ends) and ends[0] < end_ms
    after = [at for at in ends if at >= end_ms]
    clipped = bool(after) and after[0] - config.end_silence_ms < end_ms - CLIPPED_MS
    # a turn begun in the noise after the caller's ended: on a call, their words would wait for it (the noise talks on)
    later = bool(after) and any(k == "start" and at > after[0] for k, at in decisions)
    return {"opening_turn": opening, "early_start": early, "cut": cut, "clipped": clipped, "later_start": later,
            "end_ms": after[0] - end_ms if after else None}


def trimmed(audio: np.ndarray) -> np.ndarray:
    loud = np.flatnonzero(np.abs(audio) > AUDIBLE)
    return audio[loud[0]:loud[-1] + 1] if len(loud) else audio


def questions(split: str, renderer: Renderer) -> list[tuple[str, str, np.ndarray]]:
    """(voice, text, clean audio) for the split's callers."""
    found = families(say=lambda line: print(f"  {line}"))
    voices: list[Voice] = pick_voices(found, TUNE_VOICES if split == "tune" else HELD_VOICES)
    texts = TUNE_QUESTIONS if split == "tune" else HELD_QUESTIONS
    out = [(v.name, t, renderer.say(v, t)) for v in voices for t in texts]
    for v in voices:  # one long turn per voice: its questions one after another, LONG_GAP_MS apart
        parts = [trimmed(renderer.say(v, t)) for t in texts]
        gap = np.zeros(int(RATE * LONG_GAP_MS / 1000), dtype=np.float32)
        out.append((v.name, "long: " + " ".join(texts), np.concatenate([x for p in parts for x in (p, gap)])))
    if split == "held":
        try:
            humans = human_utterances()
        except Exception as exc:  # the recordings come in a wheel fetched on first use
            print(f"  human: left out: {exc}")
            humans = {}
        for name, utterances in humans.items():
            out += [(f"human-{name}", u.text, u.audio) for u in utterances[:len(texts)]]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", choices=("tune", "held"), default="tune")
    parser.add_argument("--margins", default="6/3", help="noise_floor settings to try beside the floor off, each "
                        "start_margin_db/stop_margin_db[/window_s[/percentile]]")
    parser.add_argument("--caller", default="off,7/10", help="with each noise floor setting, the caller's level gate "
                        "off or at start_margin_db/stop_margin_db[/percentile[/turns]] (pipeline/caller_level.py)")
    parser.add_argument("--suppressor", default="off", help="also run every noise floor setting with the VAD behind "
                        "this noise suppressor (a session.noise setting, e.g. speex-25; pipeline/denoise.py). The "
                        "service does not: its VAD hears the audio as it came, the recognizer the suppressed")
    parser.add_argument("--families", help="noise families, comma-separated (default: the split's; tv-espeak is a "
                        "tune family apart, bench/noise_set.py)")
    parser.add_argument("--json")
    args = parser.parse_args()
    print(f"CPU: {cpu.describe()}")
    renderer = Renderer()
    vad = SileroVad()
    settings = [Setting("floor off", NoiseFloorConfig(enabled=False))]
    for pair in args.margins.split(","):
        start, stop, *rest = (float(m) for m in pair.split("/"))
        more = dict(zip(("window_s", "percentile", "first_turn_s"), rest, strict=False))
        floor = NoiseFloorConfig(enabled=True, start_margin_db=start, stop_margin_db=stop, **more)
        for level in args.caller.split(","):
            if level == "off":
                settings.append(Setting(f"floor {pair}", floor))
                continue
            start, stop, *rest = (float(m) for m in level.split("/"))
            extra = dict(zip(("percentile", "turns"), rest, strict=False))
            caller = CallerLevelConfig(enabled=True, start_margin_db=start, stop_margin_db=stop,
                                       percentile=extra.get("percentile", 90.0), turns=int(extra.get("turns", 3)))
            settings.append(Setting(f"floor {pair}, caller {level}", floor, caller_level=caller))
    if args.suppressor != "off":
        settings += [Setting(f"{s.name}, {args.suppressor}", s.noise_floor, args.suppressor, s.caller_level)
                     for s in list(settings)]
    cases = questions(args.split, renderer)
    fams = tuple(args.families.split(",")) if args.families else TUNE if args.split == "tune" else HELD
    print(f"{len(cases)} questions in {len({v for v, _, _ in cases})} voices; noise: "
          f"{', '.join(fams)}")
    rows: list[dict[str, Any]] = []
    noise_only: list[dict[str, Any]] = []
    for setting in settings:
        config = EndpointingConfig(noise_floor=setting.noise_floor, caller_level=setting.caller_level)
        for n, (voice, text, clean) in enumerate(cases):
            for family, snr, lead_s, quieter in variants(fams):
                said, since = clean, 0
                if quieter is not None:  # after the voice's previous question, LEAD_S before
                    pool = [c for v, t, c in cases if v == voice and not t.startswith("long: ")]
                    earlier = pool[next((i for i, c in enumerate(pool) if c is clean), 0) - 1]
                    said = np.concatenate([trimmed(earlier), np.zeros(int(LEAD_S * RATE), dtype=np.float32),
                                           clean * np.float32(10 ** (-quieter / 20))])
                    since = len(trimmed(earlier))
                loud = np.flatnonzero(np.abs(said) > AUDIBLE)
                last = loud[-1] + 1 if len(loud) else len(said)
                first = len(said) - len(clean) + (np.flatnonzero(np.abs(clean) > AUDIBLE)[:1].tolist() or [0])[0]
                at = int(lead_s * RATE)
                length = at + len(said) + int(TAIL_S * RATE)
                start_ms, end_ms = 1000 * float(at + first) / RATE, 1000 * float(at + last) / RATE
                base = np.zeros(length) if snr is None else noise(family, length / RATE, n, renderer)
                audio = mix(said.astype(np.float64), base, snr if snr is not None else 0.0, at)
                row = one_case(run_audio(audio, vad, config, setting.suppressor), start_ms, end_ms, config,
                               1000 * float(at + since) / RATE)
                label = family if lead_s else f"{family}, caller at once"
                if quieter is not None:
                    label += f", second question{f' {quieter:.0f} dB quieter' if quieter else ''}"
                rows.append({"setting": setting.name, "family": label, "snr": snr, "voice": voice,
                             "text": text, **row})
        for family in fams:
            # alone, and after each voice's first question (its level known): NOISE_ONLY_S of the noise at its
            # level in the 10 dB case
            firsts = {v: c for v, t, c in reversed(cases) if not t.startswith("long: ")}
            for voice, clean in [("", np.zeros(0, dtype=np.float32)), *reversed(firsts.items())]:
                said = trimmed(clean)
                audio = mix(said.astype(np.float64), noise(family, NOISE_ONLY_S + len(said) / RATE, 1000, renderer),
                            10.0, 0) if len(said) else (noise(family, NOISE_ONLY_S, 1000, renderer)
                                                        * 10 ** (-10 / 20) * 0.1).astype(np.float32)
                decisions = run_audio(audio, vad, config, setting.suppressor)
                ends = [at for k, at in decisions if k == "stop"]
                quiet_ms = 1000.0 * len(said) / RATE + (config.end_silence_ms if len(said) else 0)
                if len(said) and ends:
                    quiet_ms = max(quiet_ms, ends[0] + config.end_silence_ms)  # not the question's own turn
                starts = [at for k, at in decisions if k == "start" and at >= quiet_ms]
                stops = [at for k, at in decisions if k == "stop" and at > quiet_ms]
                total = len(audio) * 1000 / RATE
                in_turn = sum(stop - start for start, stop in zip(starts, [*stops, total], strict=False))
                noise_only.append({"setting": setting.name, "family": family, "after": voice or None,
                                   "starts_per_min": len(starts) * 60_000 / (total - quiet_ms),
                                   "in_turn_share": in_turn / (total - quiet_ms)})
    summary = report(rows, noise_only)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), "split": args.split, "summary": summary,
                                               "noise_only": noise_only, "cases": rows}, indent=1))
        print(f"wrote {args.json}")


def report(rows: list[dict[str, Any]], noise_only: list[dict[str, Any]]) -> list[dict[str, Any]]:
    summary = []
    print("\n| setting | noise | SNR dB | heard | end p50 / p90 ms | opening turn | early start | cut | end clipped | "
          "turn after |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for key in dict.fromkeys((r["setting"], r["family"], r["snr"]) for r in rows):
        mine = [r for r in rows if (r["setting"], r["family"], r["snr"]) == key]
        ends = [r["end_ms"] for r in mine if r["end_ms"] is not None]
        line = {"setting": key[0], "family": key[1], "snr": key[2], "n": len(mine), "heard": len(ends),
                "end_p50": statistics.median(ends) if ends else None, "end_p90": pct(ends, 0.9) if ends else None,
                "opening_turn": sum(r["opening_turn"] for r in mine),
                "early_start": sum(r["early_start"] for r in mine), "cut": sum(r["cut"] for r in mine),
                "clipped": sum(r["clipped"] for r in mine), "later_start": sum(r["later_start"] for r in mine)}
        summary.append(line)
        p = f"{line['end_p50']:.0f} / {line['end_p90']:.0f}" if ends else "-"
        print(f"| {key[0]} | {key[1]} | {'' if key[2] is None else f'{key[2]:.0f}'} | {len(ends)}/{len(mine)} | {p} | "
              f"{line['opening_turn']} | {line['early_start']} | {line['cut']} | {line['clipped']} | "
              f"{line['later_start']} |")
    print("\n| setting | noise alone (10 dB level) | after | turns begun per minute | time in a turn |")
    print("| --- | --- | --- | ---: | ---: |")
    for r in noise_only:
        print(f"| {r['setting']} | {r['family']} | {r['after'] or 'nothing'} | {r['starts_per_min']:.1f} | "
              f"{100 * r['in_turn_share']:.1f} % |")
    return summary


if __name__ == "__main__":
    main()
