"""Benchmark: the recognizer's word error rate in noise, with each noise suppressor and without (issue 36, item 2).

Each question (bench/noise_turns.py's voices and questions of the split, the long turns left out) gets `LEAD_S` of
noise before it and `TAIL_S` after, mixed at 15, 10 and 5 dB SNR (bench/noise_set.py), as 16 kHz audio and through
the phone line (8 kHz mu-law and back, at 10 dB only). The suppressor runs over the whole stream, as it would on a
call (it learns the noise before the caller talks), and what comes out is aligned by its fixed delay; the
recognizer (the service's own, whisper-tiny.en int8, models/speech/asr_faster_whisper.py; another with
--asr-model) then hears the turn: the question and `MARGIN_S` either side. Printed per suppressor, input, noise and
SNR: WER, and the cost of each suppressor per 20 ms frame on this machine. Suppressors: `off`, the service's own
(`speex-N`, pipeline/denoise.py) and two it does not ship (`webrtcN`, `rnnoise`: bench/denoisers.py, `pip install
-e '.[bench-noise]'`). Digits count as errors where the reference spells them out, alike in every column: compare
columns. Tune on `--split tune` (espeak-ng babble, brown and pink noise; espeak-ng and hibari callers), report on
`--split held` (flite babble, a television, white noise, music; flite, Piper and human callers).

    .venv/bin/python bench/noise_asr.py --split tune --denoisers off,speex-8,speex-15,speex-25,speex-40,webrtc2 \
        --json docs/bench/noise_asr_tune.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.asr_window import phone_line, word_errors
from bench.denoisers import make
from bench.noise_set import HELD, TUNE, mix, noise
from bench.noise_turns import questions, trimmed
from bench.voices import RATE, Renderer
from models import cpu
from models.config import AsrConfig
from models.speech.asr_faster_whisper import FasterWhisperRecognizer
from pipeline.config import NoiseConfig

LEAD_S = 2.0
TAIL_S = 0.5
MARGIN_S = 0.3
SNRS = (15.0, 10.0, 5.0)
FEED = 320  # the stream is fed in 20 ms chunks, as a call's frames come


def denoised(name: str, audio: np.ndarray, min_floor_dbfs: float | None) -> np.ndarray:
    if name == "off":
        return audio.astype(np.float32)
    denoiser = make(name, min_floor_dbfs)
    samples = audio.astype(np.float32)
    out = np.concatenate([denoiser.process(samples[i:i + FEED]) for i in range(0, len(samples), FEED)])
    out = out[denoiser.delay:]  # aligned with what went in
    return np.concatenate([out, np.zeros(len(samples) - len(out), dtype=np.float32)])


def cost_ms(name: str) -> float:
    """Median ms per 20 ms frame over 10 s of noise, one call's suppressor."""
    if name == "off":
        return 0.0
    denoiser = make(name)
    samples = (np.random.default_rng(0).standard_normal(RATE * 10) * 0.05).astype(np.float32)
    times = []
    for i in range(0, len(samples), FEED):
        started = time.perf_counter()
        denoiser.process(samples[i:i + FEED])
        times.append(1000 * (time.perf_counter() - started))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", choices=("tune", "held"), default="tune")
    parser.add_argument("--denoisers", default="off,speex-15,webrtc2,rnnoise",
                        help="off, speexN (the shipped suppressor at N dB), webrtc1-4, rnnoise (bench/denoisers.py)")
    parser.add_argument("--limit", type=int, help="only every Nth question (a quick look)")
    parser.add_argument("--min-floor-dbfs", type=float, default=NoiseConfig().min_floor_dbfs,
                        help="session.noise.min_floor_dbfs for speex-N (-100: always on)")
    parser.add_argument("--asr-model", default=AsrConfig().model, help="asr.model: a pack name, a local folder "
                        "(another Whisper's CTranslate2 files) or a Hugging Face id")
    parser.add_argument("--json")
    args = parser.parse_args()
    names = args.denoisers.split(",")
    print(f"CPU: {cpu.describe()}")
    costs = {name: cost_ms(name) for name in names}
    for name, ms in costs.items():
        print(f"{name}: {ms:.3f} ms per 20 ms frame")
    renderer = Renderer()
    recognizer = FasterWhisperRecognizer(AsrConfig(model=args.asr_model))
    print(f"recognizer: {args.asr_model}")
    fams = TUNE if args.split == "tune" else HELD
    cases = [c for c in questions(args.split, renderer) if not c[1].startswith("long: ")][::args.limit or 1]
    conditions: list[tuple[str, str, float | None]] = [("16 kHz", "clean", None)]
    conditions += [("16 kHz", family, snr) for family in fams for snr in SNRS]
    conditions += [("8 kHz mu-law", "clean", None)] + [("8 kHz mu-law", family, 10.0) for family in fams]
    print(f"{len(cases)} questions; noise: {', '.join(fams)}; suppressors: {', '.join(names)}")
    rows: list[dict[str, Any]] = []
    for n, (voice, text, clean) in enumerate(cases):
        speech = trimmed(clean.astype(np.float64))
        at, length = int(LEAD_S * RATE), int((LEAD_S + TAIL_S) * RATE) + len(speech)
        turn = slice(at - int(MARGIN_S * RATE), at + len(speech) + int(MARGIN_S * RATE))
        for line, family, snr in conditions:
            base = np.zeros(length) if snr is None else noise(family, length / RATE, n, renderer)
            audio = mix(speech, base, snr if snr is not None else 0.0, at)
            if line != "16 kHz":
                audio = phone_line(audio.astype(np.float32))[:length]
            for name in names:
                heard = recognizer.transcribe(denoised(name, audio, args.min_floor_dbfs)[turn])
                errors, words = word_errors(text, heard)
                rows.append({"voice": voice, "text": text, "line": line, "family": family, "snr": snr,
                             "denoiser": name, "heard": heard, "errors": errors, "words": words})
    summary = report(rows, names, costs)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), "split": args.split, "asr_model": args.asr_model,
                                               "min_floor_dbfs": args.min_floor_dbfs,
                                               "cost_ms": costs,
                                               "summary": summary, "rows": rows}, indent=1))
        print(f"wrote {args.json}")


def report(rows: list[dict[str, Any]], names: list[str], costs: dict[str, float]) -> list[dict[str, Any]]:
    summary = []
    print("\n| line | noise | SNR dB | " + " | ".join(f"WER {n}" for n in names) + " |")
    print("| --- | --- | ---: | " + " | ".join("---:" for _ in names) + " |")
    for key in dict.fromkeys((r["line"], r["family"], r["snr"]) for r in rows):
        cells = []
        for name in names:
            mine = [r for r in rows if (r["line"], r["family"], r["snr"], r["denoiser"]) == (*key, name)]
            wer = sum(r["errors"] for r in mine) / max(1, sum(r["words"] for r in mine))
            summary.append({"line": key[0], "family": key[1], "snr": key[2], "denoiser": name, "wer": round(wer, 4),
                            "n": len(mine)})
            cells.append(f"{wer:.3f}")
        snr = "" if key[2] is None else f"{key[2]:.0f}"
        print(f"| {key[0]} | {key[1]} | {snr} | " + " | ".join(cells) + " |")
    print("| cost per 20 ms frame, ms | | | " + " | ".join(f"{costs[n]:.3f}" for n in names) + " |")
    return summary


if __name__ == "__main__":
    main()
