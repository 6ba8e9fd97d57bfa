"""Benchmark: Opus packets reordered by jitter, decoded as they arrived (the server before the in-order decoding,
app/transports/webrtc/caller.py) and in sequence (now), side by side on the same packets (issue 37, item 5).

Each question (bench/noise_turns.py's voices and questions of the split, the long turns left out) is encoded with
aiortc's own Opus encoder in 20 ms packets, as a WebRTC caller's are. Each packet is delayed by a draw from
N(`--delay-ms`, `--jitter-ms`), clipped at 0 (bench/lossy_link.py's link: packets come out of order, as with
netem), and one libopus decoder (aiortc's) decodes them in arrival order or in sequence order; either way each
decoded packet is put in its own place. Printed: the signal-to-noise ratio of the arrival-order decoding against
the in-order one, and the recognizer's (whisper-tiny.en int8) word error rate for both.

    .venv/bin/python bench/opus_order.py --split held --json docs/bench/opus_order_held.json
"""

from __future__ import annotations

import argparse
import fractions
import itertools
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import av
import numpy as np
from aiortc.codecs.opus import OpusDecoder, OpusEncoder
from aiortc.jitterbuffer import JitterFrame

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.asr_window import word_errors
from bench.noise_turns import questions, trimmed
from bench.voices import RATE, Renderer
from models import cpu
from models.config import AsrConfig
from models.speech.asr_faster_whisper import FasterWhisperRecognizer
from pipeline.audio import resample

OPUS_RATE = 48000
PACKET = 960  # 20 ms at 48 kHz
MARGIN_S = 0.3


def encode(audio: np.ndarray) -> list[bytes]:
    encoder = OpusEncoder()
    pcm = (np.clip(resample(audio, RATE, OPUS_RATE), -1, 1) * 32767).astype(np.int16)
    packets: list[bytes] = []
    for k in range(0, len(pcm) - PACKET + 1, PACKET):
        frame = av.AudioFrame.from_ndarray(pcm[k:k + PACKET].reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = OPUS_RATE, k, fractions.Fraction(1, OPUS_RATE)
        packets += encoder.encode(frame)[0]
    return packets


def decode(packets: list[bytes], order: list[int]) -> np.ndarray:
    """One decoder through `order`; each packet's audio in its own place (as the server's reader puts it)."""
    decoder = OpusDecoder()
    placed: dict[int, np.ndarray] = {}
    for k in order:
        pieces = [f.to_ndarray().reshape(-1, 2).mean(axis=1) / 32768 for f in decoder.decode(
            JitterFrame(data=packets[k], timestamp=k * PACKET)) if isinstance(f, av.AudioFrame)]
        placed[k] = np.concatenate(pieces).astype(np.float32) if pieces else np.zeros(PACKET, np.float32)
    audio = np.concatenate([placed.get(k, np.zeros(PACKET, np.float32)) for k in range(len(packets))])
    return resample(audio, OPUS_RATE, RATE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", choices=("tune", "held"), default="held")
    parser.add_argument("--delay-ms", type=float, default=40.0)
    parser.add_argument("--jitter-ms", type=float, default=40.0)
    parser.add_argument("--limit", type=int, help="only every Nth question (a quick look)")
    parser.add_argument("--json")
    args = parser.parse_args()
    print(f"CPU: {cpu.describe()}")
    recognizer = FasterWhisperRecognizer(AsrConfig())
    cases = [c for c in questions(args.split, Renderer()) if not c[1].startswith("long: ")][::args.limit or 1]
    print(f"{len(cases)} questions; delay N({args.delay_ms:g} ms, {args.jitter_ms:g} ms), clipped at 0")
    rows: list[dict[str, Any]] = []
    for n, (voice, text, clean) in enumerate(cases):
        pad = np.zeros(int(MARGIN_S * RATE), dtype=np.float32)
        packets = encode(np.concatenate([pad, trimmed(clean.astype(np.float64)).astype(np.float32), pad]))
        delays = np.clip(np.random.default_rng(n).normal(args.delay_ms, args.jitter_ms, len(packets)), 0, None)
        arrival = [int(k) for k in np.argsort(np.arange(len(packets)) * 20 + delays, kind="stable")]
        swapped = sum(1 for a, b in itertools.pairwise(arrival) if b < a)
        in_order, as_arrived = decode(packets, list(range(len(packets)))), decode(packets, arrival)
        snr = 10 * np.log10(np.sum(in_order ** 2) / max(float(np.sum((as_arrived - in_order) ** 2)), 1e-12))
        row: dict[str, Any] = {"voice": voice, "text": text, "packets": len(packets), "out_of_order": swapped,
                               "snr_db": round(float(snr), 2)}
        for name, audio in (("in_order", in_order), ("as_arrived", as_arrived)):
            heard = recognizer.transcribe(audio)
            errors, words = word_errors(text, heard)
            row[name] = {"heard": heard, "errors": errors, "words": words}
        rows.append(row)
        print(f"  {voice}: {swapped}/{len(packets)} out of order, SNR {snr:5.1f} dB; as arrived: "
              f"{row['as_arrived']['heard']!r}", flush=True)
    words = sum(r["in_order"]["words"] for r in rows)
    summary = {name: sum(r[name]["errors"] for r in rows) / words for name in ("in_order", "as_arrived")}
    snrs = [r["snr_db"] for r in rows]
    print(f"\nSNR of arrival-order decoding against in-order: median {statistics.median(snrs):.1f} dB "
          f"(min {min(snrs):.1f}, max {max(snrs):.1f})")
    print(f"WER: decoded in sequence {summary['in_order']:.3f}, as arrived {summary['as_arrived']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), "split": args.split, "delay_ms": args.delay_ms,
                                               "jitter_ms": args.jitter_ms, "wer": summary,
                                               "snr_db_median": statistics.median(snrs), "rows": rows}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
