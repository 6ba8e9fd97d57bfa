"""Benchmark: what a silent call costs the server's CPU, by transport.

One call at a time is opened and held for `--seconds` while the caller sends silence in real time
(the /ws client 20 ms PCM frames; the WebRTC caller, an aiortc peer on /webrtc/calls, Opus both ways,
the server's track sending silence back); the server process's CPU time over that stretch (user and
system, from /proc), less that of the same stretch with no call, is the call's cost: the transport,
the resampling, the VAD. Nobody speaks, so the recognizer and the LLM do nothing.

    .venv/bin/python bench/call_cpu.py --seconds 20 --json docs/bench/call_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.client import VoiceClient
from models import cpu
from tests.e2e.conftest import Server, start_server, stop_server
from tests.webrtc_caller import WebRTCCaller

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


async def measured(pid: int, seconds: float, during: Callable[[float], Awaitable[None]]) -> float:
    """The server's CPU seconds per second of wall time while `during(seconds)` runs."""
    start_cpu, start = cpu_seconds(pid), time.monotonic()
    await during(seconds)
    return (cpu_seconds(pid) - start_cpu) / (time.monotonic() - start)


async def idle(seconds: float) -> None:
    await asyncio.sleep(seconds)


def ws_call(server: Server) -> Callable[[float], Awaitable[None]]:
    async def run(seconds: float) -> None:
        client = VoiceClient(server.ws_url, 16000)
        await client.connect()
        await client.stream(np.zeros(int(seconds * 16000), dtype=np.int16), 20)
        await client.close()
    return run


def webrtc_call(server: Server) -> Callable[[float], Awaitable[None]]:
    async def run(seconds: float) -> None:
        caller = WebRTCCaller(server.base_url, channel="events", as_arrived=True)
        try:
            await caller.call(path="/webrtc/calls")
            await asyncio.wait_for(caller.opened.wait(), 30)
            caller.send(type="session.start", audio={"sample_rate": 16000})
            await caller.wait_for("session.started", 30)
            await asyncio.sleep(seconds)
        finally:
            await caller.close()
    return run


async def run(server: Server, pid: int, seconds: float, rounds: int) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {"no call": [], "ws": [], "webrtc": []}
    for _ in range(rounds):
        for name, during in (("no call", idle), ("ws", ws_call(server)), ("webrtc", webrtc_call(server))):
            figures[name].append(await measured(pid, seconds, during))
            print(f"  {name:8s} {100 * figures[name][-1]:5.1f} % of a core", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    print(f"CPU: {cpu.describe()}")
    with tempfile.TemporaryDirectory() as tmp:
        server, proc = start_server(Path(tmp))
        try:
            figures = asyncio.run(run(server, proc.pid, args.seconds, args.rounds))
        finally:
            stop_server(proc)
    base = min(figures["no call"])
    print(f"\nthe server's CPU, % of one core, median of {args.rounds} stretches of {args.seconds:g} s:")
    summary = {}
    for name, values in figures.items():
        median = sorted(values)[len(values) // 2]
        summary[name] = {"median": median, "over_no_call": median - base}
        print(f"  {name:8s} {100 * median:5.1f} %   (the call: {100 * (median - base):+5.1f} %)")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), "seconds": args.seconds, "figures": figures,
                                               "summary": summary}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
