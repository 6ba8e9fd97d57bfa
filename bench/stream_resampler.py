"""Benchmark: the live stream's resampler, the project's short polyphase filter against soxr's streaming one.

A phone line's 8 kHz audio (SIP, Twilio, Telnyx) and a client's 24 or 48 kHz audio are resampled to the 16 kHz
the VAD and the recognizer hear, 20 ms at a time as the frames come. What a streaming resampler holds back is
heard that much later: the caller's last word, the pause after it, the end of turn. Side by side in one run, for
each input rate: how far the output lags the input after each 20 ms chunk (median), and the cost per chunk; and,
on the phone line, the recognizer's word error rate on the held-out callers (bench/noise_turns.py's "held"
split: flite, Piper and human voices, the long turns left out), each resampler's whole output transcribed by the
service's recognizer (whisper-tiny.en int8).

    .venv/bin/python bench/stream_resampler.py --json docs/bench/stream_resampler.json

With --draws N each phone-line turn is also transcribed N more times, dithered anew (one 16-bit step, as sox
dithers): whisper-tiny.en flips some transcripts on so small a difference, and the pass band's edge decides how
often ("How many days are there in a week?" through espeak-ng at 8 kHz, cut where the server cut it: "days"
heard as "day" 5 times in 16 with the pass band ending at 0.85, 0 in 16 through soxr-HQ; cut 0.4 s later, 26 in
30 and 1 in 30). Choose the pass band on --split tune, report on held.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import soxr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.asr_window import word_errors
from bench.noise_turns import questions
from bench.voices import RATE, Renderer
from models import cpu
from models.config import AsrConfig
from models.speech.asr_faster_whisper import FasterWhisperRecognizer
from pipeline.audio import StreamResampler, float_to_mulaw, mulaw_to_float, resample

RATES = (8000, 24000, 48000)


class Stream(Protocol):
    def __call__(self, samples: np.ndarray, last: bool = False) -> np.ndarray: ...


class SoxrStream:
    """soxr's streaming resampler at `quality`, as the service used it before (HQ)."""

    def __init__(self, in_rate: int, out_rate: int, quality: str = "HQ") -> None:
        self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality=quality)

    def __call__(self, samples: np.ndarray, last: bool = False) -> np.ndarray:
        out: np.ndarray = self._stream.resample_chunk(samples, last=last)
        return out


def make(name: str, in_rate: int) -> Stream:
    """`polyphase` (the service's), `polyphase-0.93` (its pass band ending elsewhere), `soxr-HQ`..."""
    kind, _, option = name.partition("-")
    if kind == "polyphase":
        return StreamResampler(in_rate, RATE, float(option)) if option else StreamResampler(in_rate, RATE)
    return SoxrStream(in_rate, RATE, option)


def phone_line(audio: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
    """16 kHz audio as a phone line carries it: 8 kHz mu-law; with `rng`, dithered first as sox dithers
    (triangular, one 16-bit step): a draw of the small differences two recordings of one voice have."""
    narrow = resample(audio, RATE, 8000)
    if rng is not None:
        narrow = narrow + (rng.random(len(narrow)) - rng.random(len(narrow))).astype(np.float32) / 32768
    return mulaw_to_float(float_to_mulaw(narrow))


def streamed(name: str, audio: np.ndarray, in_rate: int) -> tuple[np.ndarray, list[float], list[float]]:
    """The whole output, fed 20 ms chunks then ended; the lag after each chunk (ms); the cost of each (ms)."""
    stream, chunk = make(name, in_rate), in_rate // 50
    out, lags, costs, given = [], [], [], 0
    for i in range(0, len(audio), chunk):
        began = time.perf_counter()
        out.append(stream(audio[i:i + chunk]))
        costs.append((time.perf_counter() - began) * 1000)
        given += len(out[-1])
        lags.append((min(i + chunk, len(audio)) / in_rate - given / RATE) * 1000)
    out.append(stream(np.zeros(0, dtype=np.float32), last=True))
    return np.concatenate(out), lags[5:], costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resamplers", default="polyphase,soxr-HQ,soxr-LQ",
                        help="polyphase (the service's), polyphase-P (its pass band ending at P of the lower Nyquist), "
                             "soxr-Q (soxr's streaming resampler at quality Q)")
    parser.add_argument("--split", choices=("tune", "held"), default="held", help="bench/noise_turns.py's callers")
    parser.add_argument("--draws", type=int, default=0, help="also transcribe each phone-line turn this many more "
                        "times, dithered anew each time (seeded): how often a transcript flips on a difference "
                        "of one 16-bit step")
    parser.add_argument("--rates", default=",".join(map(str, RATES)))
    parser.add_argument("--json")
    args = parser.parse_args()
    names = args.resamplers.split(",")
    rates = [int(r) for r in args.rates.split(",")]
    print(f"CPU: {cpu.describe()}")
    print(f"split: {args.split}; dithered draws: {args.draws}")
    said = [(v, t, a) for v, t, a in questions(args.split, Renderer()) if not t.startswith("long: ")]
    rng = np.random.default_rng(7)
    draws = [[phone_line(a, None) for _, _, a in said]]
    draws += [[phone_line(a, rng) for _, _, a in said] for _ in range(args.draws)]
    lines = {8000: draws[0]}
    for rate in rates:
        if rate != 8000:
            lines[rate] = [resample(a, RATE, rate) for _, _, a in said]
    recognizer = FasterWhisperRecognizer(AsrConfig())
    summary: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    print("\n| input | resampler | lag after each 20 ms, median (max) | cost per 20 ms, median | WER (phone line) |")
    print("| --- | --- | ---: | ---: | ---: |")
    for rate in rates:
        for name in names:
            lags, costs, errors, words = [], [], 0, 0
            for i, ((voice, text, _), audio) in enumerate(zip(said, lines[rate], strict=True)):
                out, lag, cost = streamed(name, audio, rate)
                lags += lag
                costs += cost
                if rate != 8000:
                    continue
                heards = [recognizer.transcribe(out)]
                heards += [recognizer.transcribe(streamed(name, draw[i], rate)[0]) for draw in draws[1:]]
                for draw, heard in enumerate(heards):
                    e, n = word_errors(text, heard)
                    errors, words = errors + e, words + n
                    rows.append({"resampler": name, "voice": voice, "text": text, "draw": draw, "heard": heard,
                                 "errors": e})
            wer = errors / words if words else None
            summary[f"{rate} {name}"] = {"lag_ms_median": round(statistics.median(lags), 2),
                                         "lag_ms_max": round(max(lags), 2),
                                         "cost_ms_median": round(statistics.median(costs), 3), "wer": wer,
                                         "words": words}
            shown = f"{wer:.3f} ({errors}/{words})" if wer is not None else "-"
            print(f"| {rate} Hz | {name} | {statistics.median(lags):.1f} ({max(lags):.1f}) ms | "
                  f"{statistics.median(costs):.3f} ms | {shown} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), "split": args.split, "draws": args.draws,
                                               "questions": len(said), "summary": summary,
                                               "transcripts": rows}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
