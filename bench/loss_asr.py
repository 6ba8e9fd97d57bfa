"""Benchmark: the recognizer's word error rate when the caller's packets are lost, with the lost ones filled
with silence (as before) and concealed (pipeline/conceal.py), side by side on the same losses (issue 37, item 5).

Each question (bench/noise_turns.py's voices and questions of the split, the long turns left out) is cut into
20 ms packets with `MARGIN_S` of silence either side; packets are lost at random (independently, each draw seeded
by the question and the draw, so both fills lose the same packets), and the recognizer (the service's own,
whisper-tiny.en int8) hears the result. As 16 kHz audio (WebRTC's path: the server decodes Opus and feeds the
session 16 kHz) and through the phone line (8 kHz mu-law, concealed at 8 kHz as the SIP path does, then back to
16 kHz). Opus's own coding is not simulated: this measures the fill, not the codec. Printed: WER per line, loss
rate and fill, and the concealer's cost per 20 ms packet on this machine. Tune on `--split tune` (espeak-ng and
hibari callers), report on `--split held` (flite, Piper and human callers).

    .venv/bin/python bench/loss_asr.py --split held --json docs/bench/loss_asr_held.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.asr_window import phone_line, word_errors
from bench.noise_turns import questions, trimmed
from bench.voices import RATE, Renderer
from models import cpu
from models.config import AsrConfig
from models.speech.asr_faster_whisper import FasterWhisperRecognizer
from pipeline.audio import resample
from pipeline.conceal import Concealer

MARGIN_S = 0.3
PACKET_S = 0.02
FILLS = ("silence", "concealed")


def lose(audio: np.ndarray, rate: int, loss: float, seed: int, fill: str) -> np.ndarray:
    """`audio` as the session would get it with each 20 ms packet lost at `loss`, the lost ones filled."""
    size = int(PACKET_S * rate)
    lost = np.random.default_rng(seed).random(len(audio) // size + 1) < loss
    concealer = Concealer(rate)
    out = []
    for k in range(0, len(audio), size):
        packet = audio[k:k + size].astype(np.float32)
        if lost[k // size]:
            out.append(concealer.fill(len(packet)) if fill == "concealed" else np.zeros(len(packet), np.float32))
        else:
            concealer.heard(packet)
            out.append(packet)
    return np.concatenate(out)


def cost_ms(rate: int) -> float:
    """The concealer's cost per lost 20 ms packet (the pitch search), on a voiced history."""
    concealer = Concealer(rate)
    t = np.arange(int(0.06 * rate)) / rate
    concealer.heard((0.3 * np.sin(2 * np.pi * 140 * t)).astype(np.float32))
    size, runs = int(PACKET_S * rate), 200
    start = time.perf_counter()
    for _ in range(runs):
        concealer.filled = 0
        concealer.fill(size)
    return (time.perf_counter() - start) / runs * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", choices=("tune", "held"), default="tune")
    parser.add_argument("--losses", default="0.02,0.05,0.1", help="packet loss rates, comma-separated")
    parser.add_argument("--draws", type=int, default=2, help="loss patterns per question and rate")
    parser.add_argument("--limit", type=int, help="only every Nth question (a quick look)")
    parser.add_argument("--json")
    args = parser.parse_args()
    losses = [float(x) for x in args.losses.split(",")]
    print(f"CPU: {cpu.describe()}")
    costs = {"16 kHz": cost_ms(16000), "8 kHz mu-law": cost_ms(8000)}
    print("concealer: " + ", ".join(f"{line} {ms:.3f} ms per lost 20 ms packet" for line, ms in costs.items()))
    renderer = Renderer()
    recognizer = FasterWhisperRecognizer(AsrConfig())
    cases = [c for c in questions(args.split, renderer) if not c[1].startswith("long: ")][::args.limit or 1]
    print(f"{len(cases)} questions; losses {losses}; {args.draws} draws each")
    rows: list[dict[str, Any]] = []
    for n, (voice, text, clean) in enumerate(cases):
        pad = np.zeros(int(MARGIN_S * RATE), dtype=np.float32)
        turn = np.concatenate([pad, trimmed(clean.astype(np.float64)).astype(np.float32), pad])
        for line in ("16 kHz", "8 kHz mu-law"):
            rate = RATE if line == "16 kHz" else 8000
            audio = turn if line == "16 kHz" else resample(phone_line(turn), RATE, 8000)

            def heard(samples: np.ndarray, rate: int = rate) -> str:
                return recognizer.transcribe(samples if rate == RATE else resample(samples, rate, RATE))

            said = heard(audio)
            errors, words = word_errors(text, said)
            rows.append({"voice": voice, "text": text, "line": line, "loss": 0.0, "draw": 0, "fill": "none",
                         "heard": said, "errors": errors, "words": words})
            for loss in losses:
                for draw in range(args.draws):
                    seed = n * 1000 + draw * 10 + int(loss * 100)
                    for fill in FILLS:
                        said = heard(lose(audio, rate, loss, seed, fill))
                        errors, words = word_errors(text, said)
                        rows.append({"voice": voice, "text": text, "line": line, "loss": loss, "draw": draw,
                                     "fill": fill, "heard": said, "errors": errors, "words": words})
        print(f"  {n + 1}/{len(cases)} {voice}: {text}", flush=True)
    summary = report(rows, losses)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), "split": args.split, "losses": losses,
                                               "draws": args.draws, "cost_ms": costs, "summary": summary,
                                               "rows": rows}, indent=1))
        print(f"wrote {args.json}")


def report(rows: list[dict[str, Any]], losses: list[float]) -> list[dict[str, Any]]:
    summary = []
    print(f"\n{'line':<14} {'loss':>5}  " + "  ".join(f"{f:>10}" for f in FILLS))
    for line in ("16 kHz", "8 kHz mu-law"):
        clean = [r for r in rows if r["line"] == line and r["fill"] == "none"]
        wer = sum(r["errors"] for r in clean) / max(1, sum(r["words"] for r in clean))
        summary.append({"line": line, "loss": 0.0, "fill": "none", "wer": round(wer, 4), "turns": len(clean)})
        print(f"{line:<14} {0:>5.0%}  {wer:>10.3f}  (no loss)")
        for loss in losses:
            cells = []
            for fill in FILLS:
                some = [r for r in rows if r["line"] == line and r["loss"] == loss and r["fill"] == fill]
                wer = sum(r["errors"] for r in some) / max(1, sum(r["words"] for r in some))
                summary.append({"line": line, "loss": loss, "fill": fill, "wer": round(wer, 4), "turns": len(some)})
                cells.append(f"{wer:>10.3f}")
            print(f"{line:<14} {loss:>5.0%}  " + "  ".join(cells))
    return summary


if __name__ == "__main__":
    main()
