"""Benchmark: does the echo canceller's delay search (pipeline/echo.py, `cancel_echo`) find the bot's reply in
a caller's audio that holds none of it, and does it keep what it found? Offline, no server, no models: the
session's PlayedTrack gets a reply (the fake synthesizer's: a 200 Hz tone, 1.5 s), then the caller's utterance
(0.5 s of a 300 Hz tone, or of broadband noise, then 0.6 s of silence, as 20 ms frames) arrives after a gap,
either in real time or in a burst, each frame late by up to `jitter` (uniform, seeded). Six such turns make a
run. A run counts as a false find where the search reported an echo, as held where that echo was still
cancelled at the run's end, and as muted where a turn kept fewer than 4 of its 25 loud frames above the fake
VAD's level (0.1): such a turn is never heard.

Each run's frames go through three rules side by side: `old`, as before the drop rule (a find kept for the call,
a peak at the ends of the searched delays taken: `drop_after_s` 0, the estimator's `edge_ms` 0); `drop`, a find
dropped once unseen for `drop_after_s` (the default 2 s) of the bot playing; `new`, the defaults (that, and no
peak within `edge_ms`, 3 ms, of either end of the searched delays).

This is what left the fuzz harness's well-behaved caller unanswered (tests/fuzz/harness.py).

    .venv/bin/python bench/echo_false_find.py --runs 10 --json docs/bench/echo_false_find.json
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models import cpu
from pipeline.config import EchoConfig
from pipeline.echo import DelayEstimator, PlayedTrack, cancel_echo
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


class Finds(logging.Handler):
    """Counts cancel_echo's log lines saying it found the bot's echo."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += record.getMessage().endswith(": cancelling it")  # not "no longer cancelling it"


RULES = {"old": (0.0, 0), "drop": (EchoConfig().drop_after_s, 0), "new": (EchoConfig().drop_after_s, 3)}


def turns(kind: str, gap_s: float, burst_s: float, jitter_s: float, rng: np.random.Generator
          ) -> tuple[PlayedTrack, list[AudioFrame]]:
    """One run's played track and the caller's frames."""
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
    return track, frames


async def run(track: PlayedTrack, frames: list[AudioFrame], rule: str, finds: Finds) -> tuple[bool, bool, bool]:
    """(a false find, one held at the end, a muted turn) in one run of TURNS turns under `rule`."""
    drop_after_s, edge_ms = RULES[rule]
    track = copy.deepcopy(track)
    finds.count = 0

    async def source() -> AsyncIterator[AudioFrame]:
        for frame in frames:
            yield frame

    echo = cancel_echo(source(), track, EchoConfig(drop_after_s=drop_after_s),
                       DelayEstimator(EchoConfig().max_delay_ms, edge_ms=edge_ms))
    kept = [float(np.abs(f.samples).mean()) > 0.1 async for f in echo]
    per = len(utterance("tone"))
    loudest = min(sum(kept[i:i + per]) for i in range(0, len(kept), per))
    return finds.count > 0, track.echo_ms is not None, loudest < 4


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="runs per setting")
    parser.add_argument("--json", help="also write the counts here")
    args = parser.parse_args()
    finds = Finds()
    echo_log = logging.getLogger("pipeline.echo")
    echo_log.addHandler(finds)
    echo_log.setLevel(logging.INFO)
    echo_log.propagate = False
    print(f"CPU: {cpu.describe()}")
    print(f"{args.runs} runs of {TURNS} turns per setting; burst 1.1 s is real time (the utterance's own length); "
          f"per rule, runs with a false find / still held at the end / a turn muted")
    print(f"{'utterance':>9} {'gap s':>6} {'burst s':>8} {'jitter s':>9} " + " ".join(f"{r:>14}" for r in RULES))
    rows = []
    tally: dict[tuple[str, str], list[int]] = {(k, r): [0, 0, 0, 0] for k in ("tone", "noise") for r in RULES}
    for kind in ("tone", "noise"):
        rng = np.random.default_rng(0)
        for gap in (0.0, 0.02, 0.1):
            for burst in (0.0, 0.05, 1.1):
                for jitter in (0.0, 0.05):
                    runs = [turns(kind, gap, burst, jitter, rng) for _ in range(args.runs)]
                    row: dict[str, object] = {"utterance": kind, "gap_s": gap, "burst_s": burst,
                                              "jitter_s": jitter, "runs": args.runs}
                    cells = []
                    for rule in RULES:
                        results = [await run(track, frames, rule, finds) for track, frames in runs]
                        found, held, muted = (sum(r[i] for r in results) for i in range(3))
                        row[rule] = {"false_finds": found, "held_at_end": held, "muted_runs": muted}
                        cells.append(f"{found:>4} /{held:>3} /{muted:>3}")
                        for i, count in enumerate((args.runs, found, held, muted)):
                            tally[kind, rule][i] += count
                    rows.append(row)
                    print(f"{kind:>9} {gap:>6} {burst:>8} {jitter:>9} " + " ".join(f"{c:>14}" for c in cells))
    for (kind, rule), (total, found, held, muted) in tally.items():
        print(f"{kind}, {rule}: false finds in {found} of {total} runs, still held at the end in {held}, "
              f"a turn muted in {muted}")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), "turns_per_run": TURNS,
                                               "rules": {k: {"drop_after_s": d, "edge_ms": e}
                                                         for k, (d, e) in RULES.items()},
                                               "rows": rows}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    asyncio.run(main())
