"""Benchmark: does the echo canceller's delay search (pipeline/echo.py, `cancel_echo`) find the bot's reply in
a caller's audio that holds none of it? Offline, no server, no models: the session's PlayedTrack gets a reply
(the fake synthesizer's: a 200 Hz tone, 1.5 s), then the caller's utterance (0.5 s of a 300 Hz tone, or of
broadband noise, then 0.6 s of silence, as 20 ms frames) arrives after a gap, either in real time or in a
burst, each frame late by up to `jitter` (uniform, seeded). Six such turns make a run. A run counts as a false
find where the search reported an echo, and as muted where a turn kept fewer than 4 of its 25 loud frames above
the fake VAD's level (0.1): such a turn is never heard.

This is what left the fuzz harness's well-behaved caller unanswered (tests/fuzz/harness.py).

    .venv/bin/python bench/echo_false_find.py --runs 10 --json docs/bench/echo_false_find.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models import cpu
from pipeline.config import EchoConfig
from pipeline.echo import PlayedTrack, cancel_echo
from pipeline.events import AudioFrame

RATE = 16000
FRAME = 320
TURNS = 6


def utterance(kind: str) -> list[np.ndarray]:
    n = RATE // 2
    if kind == "tone":
        loud = 0.5 * np.sin(2 * np.pi * 300 * np.arange(n) / RATE)
    else:
        loud = np.random.default_rng(300).uniform(-0.5, 0.5, n)
    audio = np.concatenate([loud, np.zeros(int(0.6 * RATE))]).astype(np.float32)
    return [audio[i:i + FRAME] for i in range(0, len(audio), FRAME)]


async def run(kind: str, gap_s: float, burst_s: float, jitter_s: float, rng: np.random.Generator) -> tuple[bool, bool]:
    """(a false find, a muted turn) in one run of TURNS turns."""
    track = PlayedTrack()
    reply = (0.3 * np.sin(np.arange(int(1.5 * RATE)) * 2 * np.pi * 200 / RATE)).astype(np.float32)
    frames: list[AudioFrame] = []
    t = 0.0
    said = utterance(kind)
    for _ in range(TURNS):
        for i in range(0, len(reply), FRAME):
            track.bot(reply[i:i + FRAME], RATE, t + i / RATE)
        t += len(reply) / RATE + gap_s
        spread = burst_s if burst_s > 0 else 0.0
        for j, samples in enumerate(said):
            frames.append(AudioFrame(samples, t + spread * j / len(said) + rng.uniform(0, jitter_s)))
        t += (spread or 0.0) + 0.05

    async def source() -> AsyncIterator[AudioFrame]:
        for frame in frames:
            yield frame

    kept = [float(np.abs(f.samples).mean()) > 0.1 async for f in cancel_echo(source(), track, EchoConfig())]
    per = len(said)
    loudest = min(sum(kept[i:i + per]) for i in range(0, len(kept), per))
    return track.echo_ms is not None, loudest < 4


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="runs per setting")
    parser.add_argument("--json", help="also write the counts here")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    print(f"CPU: {cpu.describe()}")
    print(f"{args.runs} runs of {TURNS} turns per setting; burst 1.1 s is real time (the utterance's own length)")
    print(f"{'utterance':>9} {'gap s':>6} {'burst s':>8} {'jitter s':>9} {'false finds':>12} {'muted runs':>11}")
    rows = []
    for kind in ("tone", "noise"):
        rng = np.random.default_rng(0)
        for gap in (0.0, 0.02, 0.1):
            for burst in (0.0, 0.05, 1.1):
                for jitter in (0.0, 0.05):
                    results = [await run(kind, gap, burst, jitter, rng) for _ in range(args.runs)]
                    found, muted = sum(r[0] for r in results), sum(r[1] for r in results)
                    rows.append({"utterance": kind, "gap_s": gap, "burst_s": burst, "jitter_s": jitter,
                                 "runs": args.runs, "false_finds": found, "muted_runs": muted})
                    print(f"{kind:>9} {gap:>6} {burst:>8} {jitter:>9} {found:>12} {muted:>11}")
    for kind in ("tone", "noise"):
        mine = [r for r in rows if r["utterance"] == kind]
        print(f"{kind}: false finds in {sum(r['false_finds'] for r in mine)} of {sum(r['runs'] for r in mine)} runs, "
              f"a turn muted in {sum(r['muted_runs'] for r in mine)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), "turns_per_run": TURNS, "rows": rows}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    asyncio.run(main())
