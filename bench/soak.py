"""Soak: many calls one after another against one real server process (fake instant engines,
tests/app/fake_server.py, named as fakes), then calls that vanish mid-reply (the socket is cut
without a close frame). The server's resident memory, open file descriptors and asyncio tasks are
printed at the start, the middle and the end of each phase: they must stay flat.

    .venv/bin/python bench/soak.py --calls 1000 --abrupt 100 --out docs/bench/soak
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import publish
from models import cpu
from tests.app.test_shutdown import start_fake_server

START = json.dumps({"type": "session.start", "audio": {"sample_rate": 16000}})


def utterance() -> list[bytes]:
    t = np.arange(int(0.4 * 16000)) / 16000
    tone = (0.5 * np.sin(2 * np.pi * 300 * t) * 32767).astype(np.int16)
    audio = np.concatenate([tone, np.zeros(int(0.6 * 16000), dtype=np.int16)])
    return [audio[i:i + 1600].tobytes() for i in range(0, len(audio), 1600)]  # 100 ms frames, sent at once


async def call(base: str, abrupt: bool) -> bool:
    """One call: speak, then wait for the whole reply (or cut the socket at its first audio)."""
    async with websockets.connect(f"ws://{base}/ws") as ws:
        await ws.send(START)
        for frame in utterance():
            await ws.send(frame)
        async for message in ws:
            if abrupt and isinstance(message, bytes):
                ws.transport.abort()  # no close frame: as a dropped network does
                return True
            if isinstance(message, str) and json.loads(message)["type"] == "response.done":
                await ws.close()
                return True
    return False


def sample(base: str, server: psutil.Process, label: str, done: int) -> dict[str, Any]:
    tasks = httpx.get(f"http://{base}/fake/tasks", timeout=10).json()["tasks"]
    health = httpx.get(f"http://{base}/healthz", timeout=10).json()
    return {"at": label, "calls_done": done, "rss_mb": round(server.memory_info().rss / 2**20, 1),
            "open_fds": server.num_fds(), "asyncio_tasks": tasks, "sessions": health["sessions"]}


async def phase(base: str, server: psutil.Process, name: str, n: int, abrupt: bool) -> list[dict[str, Any]]:
    rows = [sample(base, server, f"{name} start", 0)]
    failed = 0
    t0 = time.monotonic()
    for i in range(n):
        failed += not await asyncio.wait_for(call(base, abrupt), 30)
        if i + 1 == n // 2:
            await asyncio.sleep(1.0)  # let the server finish closing the last call
            rows.append(sample(base, server, f"{name} middle", i + 1))
    await asyncio.sleep(1.0)
    rows.append(sample(base, server, f"{name} end", n))
    rows[-1]["failed"] = failed
    rows[-1]["seconds"] = round(time.monotonic() - t0, 1)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--abrupt", type=int, default=100)
    parser.add_argument("--out", help="write OUT.json and OUT.txt")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base, proc, _ = start_fake_server(
            Path(tmp), FAKE_TOKEN_DELAY_S="0", FAKE_REPLY="Hi.", VOICE_AGENT_SERVER__LOG_LEVEL="warning",
            VOICE_AGENT_SERVER__MAX_CONNECTIONS_PER_MINUTE="1000000")
        server = psutil.Process(proc.pid)
        try:
            rows = asyncio.run(phase(base, server, "sequential", args.calls, abrupt=False))
            rows += asyncio.run(phase(base, server, "abrupt", args.abrupt, abrupt=True))
        finally:
            proc.terminate()
            proc.wait(30)
    lines = [f"machine: {cpu.describe()}", "fake instant engines; reply 'Hi.' (0.1 s of audio); call store on", "",
             f"{'at':18s} {'calls':>6s} {'RSS MB':>7s} {'fds':>5s} {'tasks':>6s} {'sessions':>8s}"]
    for r in rows:
        extra = f"  failed {r['failed']} in {r['seconds']} s" if "failed" in r else ""
        lines.append(f"{r['at']:18s} {r['calls_done']:6d} {r['rss_mb']:7.1f} {r['open_fds']:5d} "
                     f"{r['asyncio_tasks']:6d} {r['sessions']:8d}{extra}")
    text = "\n".join(lines)
    publish(text, rows, args.out)


if __name__ == "__main__":
    main()
