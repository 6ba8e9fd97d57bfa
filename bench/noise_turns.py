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
from dataclasses import dataclass
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
from pipeline.config import EndpointingConfig, NoiseConfig, NoiseFloorConfig
from pipeline.denoise import make
from pipeline.endpointing import replay

LEAD_S = 3.0
TAIL_S = 8.0
NOISE_ONLY_S = 60.0
SNRS = (15.0, 10.0, 5.0)
AUDIBLE = 10 ** (-40 / 20)
LONG_GAP_MS = 120  # between the sentences of a long turn: shorter than endpointing.early_final_ms
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


def variants(families: tuple[str, ...]) -> list[tuple[str, float | None, float]]:
    """(noise family, SNR or None for clean, lead in seconds) of each case: after LEAD_S of the line, at every SNR;
    and the caller speaking at once, as the line opens (no lead: clean, and each noise at 10 dB), where the start of
    the line is the caller and not their background."""
    cases: list[tuple[str, float | None, float]] = [("clean", None, LEAD_S)]
    cases += [(family, snr, LEAD_S) for family in families for snr in SNRS]
    return cases + [("clean", None, 0.0)] + [(family, 10.0, 0.0) for family in families]


def one_case(decisions: list[tuple[str, float]], start_ms: float, end_ms: float, config: EndpointingConfig
             ) -> dict[str, Any]:
    opening = any(k == "start" and at < config.noise_floor.first_s * 1000 for k, at in decisions)
    early = any(k == "start" and config.noise_floor.first_s * 1000 <= at < start_ms - config.min_speech_ms
                for k, at in decisions)
    # a turn ends when its silence has lasted end_silence_ms: the decision's moment, after the silence began
    ends = [at + config.end_silence_ms for k, at in decisions if k == "stop" and at > start_ms]
    cut = bool(ends) and ends[0] < end_ms
    after = [at for at in ends if at >= end_ms]
    clipped = bool(after) and after[0] - config.end_silence_ms < end_ms - CLIPPED_MS
    return {"opening_turn": opening, "early_start": early, "cut": cut, "clipped": clipped,
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
    parser.add_argument("--suppressor", default="off", help="also run every noise floor setting with the VAD behind "
                        "this noise suppressor (a session.noise setting, e.g. speex-25; pipeline/denoise.py). The "
                        "service does not: its VAD hears the audio as it came, the recognizer the suppressed")
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
        settings.append(Setting(f"floor {pair}", floor))
    if args.suppressor != "off":
        settings += [Setting(f"{s.name}, {args.suppressor}", s.noise_floor, args.suppressor) for s in list(settings)]
    cases = questions(args.split, renderer)
    print(f"{len(cases)} questions in {len({v for v, _, _ in cases})} voices; noise: "
          f"{', '.join(TUNE if args.split == 'tune' else HELD)}")
    rows: list[dict[str, Any]] = []
    noise_only: list[dict[str, Any]] = []
    fams = TUNE if args.split == "tune" else HELD
    for setting in settings:
        config = EndpointingConfig(noise_floor=setting.noise_floor)
        for n, (voice, text, clean) in enumerate(cases):
            loud = np.flatnonzero(np.abs(clean) > AUDIBLE)
            first, last = (loud[0], loud[-1] + 1) if len(loud) else (0, len(clean))
            for family, snr, lead_s in variants(fams):
                at = int(lead_s * RATE)
                length = at + len(clean) + int(TAIL_S * RATE)
                start_ms, end_ms = 1000 * float(at + first) / RATE, 1000 * float(at + last) / RATE
                base = np.zeros(length) if snr is None else noise(family, length / RATE, n, renderer)
                audio = mix(clean.astype(np.float64), base, snr if snr is not None else 0.0, at)
                row = one_case(run_audio(audio, vad, config, setting.suppressor), start_ms, end_ms, config)
                label = family if lead_s else f"{family}, caller at once"
                rows.append({"setting": setting.name, "family": label, "snr": snr, "voice": voice,
                             "text": text, **row})
        for family in fams:
            level = 10 ** (-10 / 20) * 0.1  # the 10 dB case's noise under a caller whose active RMS is 0.1
            audio = (noise(family, NOISE_ONLY_S, 1000, renderer) * level).astype(np.float32)
            decisions = run_audio(audio, vad, config, setting.suppressor)
            starts = [at for k, at in decisions if k == "start"]
            stops = [at for k, at in decisions if k == "stop"]
            in_turn = sum(stop - start for start, stop in zip(starts, [*stops, NOISE_ONLY_S * 1000], strict=False))
            noise_only.append({"setting": setting.name, "family": family,
                               "starts_per_min": len(starts) * 60 / NOISE_ONLY_S,
                               "in_turn_share": in_turn / (NOISE_ONLY_S * 1000)})
    summary = report(rows, noise_only)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), "split": args.split, "summary": summary,
                                               "noise_only": noise_only, "cases": rows}, indent=1))
        print(f"wrote {args.json}")


def report(rows: list[dict[str, Any]], noise_only: list[dict[str, Any]]) -> list[dict[str, Any]]:
    summary = []
    print("\n| setting | noise | SNR dB | heard | end p50 / p90 ms | opening turn | early start | cut | end clipped |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for key in dict.fromkeys((r["setting"], r["family"], r["snr"]) for r in rows):
        mine = [r for r in rows if (r["setting"], r["family"], r["snr"]) == key]
        ends = [r["end_ms"] for r in mine if r["end_ms"] is not None]
        line = {"setting": key[0], "family": key[1], "snr": key[2], "n": len(mine), "heard": len(ends),
                "end_p50": statistics.median(ends) if ends else None, "end_p90": pct(ends, 0.9) if ends else None,
                "opening_turn": sum(r["opening_turn"] for r in mine),
                "early_start": sum(r["early_start"] for r in mine), "cut": sum(r["cut"] for r in mine),
                "clipped": sum(r["clipped"] for r in mine)}
        summary.append(line)
        p = f"{line['end_p50']:.0f} / {line['end_p90']:.0f}" if ends else "-"
        print(f"| {key[0]} | {key[1]} | {'' if key[2] is None else f'{key[2]:.0f}'} | {len(ends)}/{len(mine)} | {p} | "
              f"{line['opening_turn']} | {line['early_start']} | {line['cut']} | {line['clipped']} |")
    print("\n| setting | noise alone (10 dB level) | turns begun per minute | time in a turn |")
    print("| --- | --- | ---: | ---: |")
    for r in noise_only:
        print(f"| {r['setting']} | {r['family']} | {r['starts_per_min']:.1f} | {100 * r['in_turn_share']:.1f} % |")
    return summary


if __name__ == "__main__":
    main()
