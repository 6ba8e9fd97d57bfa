"""Benchmark: Whisper's encoder window (asr.window_s) and phone audio, word error rate and time.

Every request of bench/turn_detection.py's labelled set, spoken whole by each of its voices (hibari's
neural voice in six renderings, the headline; two espeak-ng voices, robotic, reported apart),
transcribed by the service's own recognizer (models/speech/asr_faster_whisper.py, whisper-tiny.en int8,
beam 5) once per window in --windows and per input:
- 16 kHz: the clip as a browser sends it;
- 8 kHz mu-law: resampled to 8 kHz, mu-law encoded and decoded (G.711, as a phone call carries it),
  then resampled to 16 kHz, the phone path's input.
It prints the word error rate per voice group, input and window, and the median and p95 time per
transcript. The reference text spells numbers out while Whisper writes digits ("200"), so the few
numbers count as errors in every column alike: compare columns, not absolute figures.

    .venv/bin/python bench/asr_window.py --json docs/bench/asr_window.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.turn_set import REQUESTS, speech_span
from bench.voices import RATE, Renderer, Voice, families
from models import cpu
from models.config import AsrConfig
from models.speech.asr_faster_whisper import FasterWhisperRecognizer
from pipeline.audio import float_to_mulaw, mulaw_to_float, resample

INPUTS = ("16 kHz", "8 kHz mu-law")


def norm(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", " ", text.lower().replace("’", "'")).split()


def word_errors(reference: str, heard: str) -> tuple[int, int]:
    """(substitutions + deletions + insertions, reference words): edit distance over words."""
    ref, hyp = norm(reference), norm(heard)
    row = list(range(len(hyp) + 1))
    for i in range(1, len(ref) + 1):
        diagonal, row[0] = row[0], i
        for j in range(1, len(hyp) + 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (ref[i - 1] != hyp[j - 1]))
    return row[len(hyp)], len(ref)


def phone_line(audio: np.ndarray) -> np.ndarray:
    """16 kHz float -> 8 kHz mu-law and back -> 16 kHz float, as the phone path hears it."""
    return resample(mulaw_to_float(float_to_mulaw(resample(audio, RATE, 8000))), 8000, RATE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", default="10,30", help="asr.window_s values to compare")
    parser.add_argument("--limit", type=int, help="only the first N requests")
    parser.add_argument("--json", help="also write every transcript to this file")
    args = parser.parse_args()
    windows = [int(w) for w in args.windows.split(",")]
    print(f"CPU: {cpu.describe()}")
    recognizers = {w: FasterWhisperRecognizer(AsrConfig(window_s=w)) for w in windows}
    found = families()
    voices: list[Voice] = found.get("hibari", [])[:6] + found.get("espeak", [])[:2]
    speaker = Renderer(threads=cpu.cores())
    lead, tail = np.zeros(int(0.3 * RATE), np.float32), np.zeros(int(0.2 * RATE), np.float32)
    rows: list[dict[str, object]] = []
    for voice in voices:
        group = "neural" if voice.family == "hibari" else "robotic"
        for text in REQUESTS[:args.limit]:
            whole = speaker.say(voice, text)
            a, b = speech_span(whole)
            clip = np.concatenate([lead, whole[a:b], tail])
            for name, audio in zip(INPUTS, (clip, phone_line(clip)), strict=True):
                for window, recognizer in recognizers.items():
                    started = time.perf_counter()
                    heard = recognizer.transcribe(audio)
                    ms = 1000 * (time.perf_counter() - started)
                    errors, count = word_errors(text, heard)
                    rows.append({"voice": voice.name, "group": group, "input": name, "window_s": window,
                                 "text": text, "heard": heard, "errors": errors, "words": count, "ms": round(ms, 1)})
    summary: dict[str, dict[str, float]] = {}
    print(f"\n{len(REQUESTS[:args.limit])} requests x {len(voices)} voices; whisper-tiny.en int8, beam 5")
    print(f"{'voices':9} {'input':13} {'window':>6} {'WER':>7} {'median ms':>10} {'p95 ms':>7}")
    for group in ("neural", "robotic"):
        for name in INPUTS:
            for window in windows:
                mine = [r for r in rows if r["group"] == group and r["input"] == name and r["window_s"] == window]
                wer = sum(int(r["errors"]) for r in mine) / max(1, sum(int(r["words"]) for r in mine))  # type: ignore[call-overload]
                times = sorted(float(r["ms"]) for r in mine)  # type: ignore[arg-type]
                p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
                key = f"{group}/{name}/{window}"
                summary[key] = {"wer": round(wer, 4), "median_ms": round(statistics.median(times), 1), "p95_ms": p95}
                print(f"{group:9} {name:13} {window:>4} s {wer:7.3f} {statistics.median(times):10.0f} {p95:7.0f}")
    for window in windows:
        for group in ("neural", "robotic"):
            gap = summary[f"{group}/8 kHz mu-law/{window}"]["wer"] - summary[f"{group}/16 kHz/{window}"]["wer"]
            print(f"window {window} s, {group}: WER 8 kHz mu-law minus 16 kHz = {gap:+.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), "summary": summary, "rows": rows}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
