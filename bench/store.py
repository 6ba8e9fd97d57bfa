"""Benchmark: what keeping calls costs the audio path, and how fast an export is.

(a) The audio path's share, per turn: a realistic turn hands the call recorder 5 s of caller audio in
    20 ms frames (16 kHz, 250 calls of `caller()`) and 5 s of reply audio in 40 ms chunks (24 kHz, as
    the TTS makes it, 125 calls of `bot()`), then the turn's record to the store (`turn_ended()`).
    Each of those calls is timed on its own, and a turn's cost is their sum; p50/p99 over 1000 turns.
    The event loop runs between the calls, as on a live call, so the store's writer (SQLite, WAL) and
    the recorder's thread (resampling, writing the spilled audio) work meanwhile and compete for the
    CPU and the GIL. Target: at most 1 ms per turn at p99.
(b) An export of 100 calls of 10 turns each through the HTTP API (jsonl and csv; the API's router
    served by uvicorn on a local port, SQLite), timed from the request to the last byte, 5 times
    each. Target: under a second.
(c) The database's share (with --postgres, or --database-url): 200 calls of 20 turns handed to one
    CallStore as fast as it takes them, then flushed; the records a second one replica's writer
    puts into the database (SQLite and PostgreSQL side by side), and for PostgreSQL the server's own
    CPU seconds per turn (its processes, read with psutil): how many turns a second a core of the
    database takes, for docs/deployment.md's sizing.

    .venv/bin/python bench/store.py --postgres --json docs/bench/store.json > docs/bench/store.txt
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.store import CallRecord, CallStore, StorageConfig, TurnRecord
from models import cpu

T0 = dt.datetime(2025, 3, 1, 12, tzinfo=dt.UTC)


def a_turn(turn_id: int, start: dt.datetime) -> TurnRecord:
    return TurnRecord(
        turn_id=turn_id, at=start + dt.timedelta(seconds=10 * turn_id + 5), offset_s=10.0 * turn_id + 5,
        status="completed", user_text="Could you book me a table for two at eight tonight?",
        generated_text="Sure, I can book a table for two at eight. Which restaurant would you like?",
        sent_text="Sure, I can book a table for two at eight. Which restaurant would you like?",
        heard_text="Sure, I can book a table for two at eight. Which restaurant would you like?",
        latency_ms={"speech_end": 0.0, "asr_final": 92.4, "llm_first_token": 171.0, "first_phrase": 233.8,
                    "tts_first_audio": 301.5, "first_audio_sent": 305.2},
        voice_to_voice_ms=512.7,
        spec={"method": "draft_model", "drafts": 9, "draft_tokens": 36, "accepted_tokens": 22,
              "accepted_per_position": [8, 6, 5, 3], "k_chosen": [4] * 9, "tokens_per_second": 48.2,
              "acceptance_rate": 0.6111, "completion_tokens": 31, "time_to_first_token_ms": 84.0})


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


async def audio_path(turns: int, folder: Path, turns_per_call: int = 20) -> dict[str, Any]:
    """Calls of turns_per_call turns one after another; each call's recording is written when it ends,
    in the background, while the next call's audio goes on."""
    store = CallStore(StorageConfig(data_dir=str(folder), recordings=True, retention_days=0))
    await store.open()
    rng = np.random.default_rng(0)
    caller_frames = [(0.1 * rng.standard_normal(320)).astype(np.float32) for _ in range(250)]
    bot_chunks = [(0.1 * rng.standard_normal(960)).astype(np.float32) for _ in range(125)]
    costs, caller_costs, bot_costs, record_costs = [], [], [], []
    clock = time.perf_counter
    calls = [f"bench-{c:03d}" for c in range((turns + turns_per_call - 1) // turns_per_call)]
    for c, call_id in enumerate(calls):
        clock0 = time.monotonic()
        store.call_started(CallRecord(call_id, "ws", T0 + dt.timedelta(hours=c)))
        recorder = store.recorder(call_id, started_at=clock0)
        assert recorder is not None
        for n in range(min(turns_per_call, turns - c * turns_per_call)):
            base = clock0 + 10.0 * n  # the turn's place on the call's timeline: caller 0-5 s, bot 5-10 s
            spent = 0.0
            for i, frame in enumerate(caller_frames):
                start = clock()
                recorder.caller(frame, 16000, base + 0.02 * (i + 1))
                took = clock() - start
                caller_costs.append(took)
                spent += took
                if i % 5 == 0:
                    await asyncio.sleep(0)  # the loop runs: the writer and other tasks get their turn
            for i, chunk in enumerate(bot_chunks):
                start = clock()
                recorder.bot(chunk, 24000, base + 5.0 + 0.04 * i)
                took = clock() - start
                bot_costs.append(took)
                spent += took
                if i % 3 == 0:
                    await asyncio.sleep(0)
            record = a_turn(n, T0 + dt.timedelta(hours=c))
            start = clock()
            store.turn_ended(call_id, record)
            took = clock() - start
            record_costs.append(took)
            costs.append(spent + took)
            await asyncio.sleep(0)
        store.call_ended(call_id, T0 + dt.timedelta(hours=c, seconds=10 * turns_per_call), "hangup",
                         recorder=recorder)
    wrote = time.perf_counter()
    await store.flush()
    drain_s = time.perf_counter() - wrote
    found = await store.get_call(calls[0])
    dropped = store.dropped
    await store.close()
    assert found is not None and found[0].turns_count == min(turns, turns_per_call) and found[0].recording
    wav = folder / found[0].recording
    us = 1e6

    def spread(values: list[float], digits: int) -> dict[str, float]:
        return {"p50": round(percentile(values, 50) * us, digits), "p99": round(percentile(values, 99) * us, digits)}

    return {
        "turns": turns,
        "calls": len(calls),
        "per_turn_us": {**spread(costs, 1), "max": round(max(costs) * us, 1),
                        "mean": round(statistics.mean(costs) * us, 1)},
        "caller_call_us": spread(caller_costs, 2),
        "bot_call_us": spread(bot_costs, 2),
        "turn_ended_us": spread(record_costs, 2),
        "calls_per_turn": len(caller_frames) + len(bot_chunks) + 1,
        "final_drain_s": round(drain_s, 3),
        "recording_mb_per_call": round(wav.stat().st_size / 1e6, 1),
        "dropped": dropped,
    }


async def fill(folder: Path, calls: int, turns: int) -> None:
    store = CallStore(StorageConfig(data_dir=str(folder), retention_days=0))
    await store.open()
    for c in range(calls):
        start = T0 + dt.timedelta(minutes=c)
        store.call_started(CallRecord(f"call-{c:03d}", "ws", start, fingerprint="0123456789abcdef",
                                      settings={"llm": {"model": "qwen2.5-coder-0.5b-instruct-q4_k_m"}}))
        for t in range(turns):
            store.turn_ended(f"call-{c:03d}", a_turn(t, start))
        store.call_ended(f"call-{c:03d}", start + dt.timedelta(seconds=10 * turns + 5), "hangup")
    await store.close()


async def export(folder: Path, calls: int, turns: int, repeats: int) -> dict[str, Any]:
    """The QA API's router served by uvicorn on a local port (no models: the export needs none), and
    an HTTP client reading each export to its last byte."""
    import httpx
    import uvicorn
    from fastapi import FastAPI

    from app import qa_api
    from app.runtime import Runtime
    from app.settings import Settings
    from core.clock import MonotonicClock

    await fill(folder, calls, turns)
    runtime = Runtime(Settings(storage=StorageConfig(data_dir=str(folder), retention_days=0)), MonotonicClock())
    await runtime.open_store()
    app = FastAPI()
    app.state.runtime = runtime
    app.include_router(qa_api.router)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    results: dict[str, Any] = {"calls": calls, "turns_per_call": turns}
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            for fmt in ("jsonl", "csv"):
                times, size = [], 0
                for _ in range(repeats):
                    start = time.perf_counter()
                    async with client.stream("GET", f"/api/calls/export?format={fmt}") as response:
                        assert response.status_code == 200
                        size = 0
                        async for chunk in response.aiter_bytes():
                            size += len(chunk)
                    times.append(time.perf_counter() - start)
                results[fmt] = {"seconds": [round(t, 3) for t in times],
                                "median_s": round(statistics.median(times), 3), "bytes": size}
    finally:
        server.should_exit = True
        await serving
        await runtime.aclose()
    return results


def postgres_cpu_s() -> float:
    """CPU seconds of every PostgreSQL process on the machine (the benchmark's own server)."""
    import psutil

    total = 0.0
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] == "postgres":
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                pass
    return total


async def writes(url: str, folder: Path, calls: int = 200, turns: int = 20) -> dict[str, Any]:
    """Records a second one writer puts into the database at `url` (empty: SQLite in `folder`)."""
    store = CallStore(StorageConfig(url=url, data_dir=str(folder), retention_days=0, max_pending=calls * (turns + 2)))
    await store.open()
    cpu0 = postgres_cpu_s() if url else 0.0
    start = time.perf_counter()
    for c in range(calls):
        call_id = f"w-{c:04d}-{int(start * 1000)}"
        at = T0 + dt.timedelta(minutes=c)
        store.call_started(CallRecord(call_id, "ws", at))
        for t in range(turns):
            store.turn_ended(call_id, a_turn(t, at))
        store.call_ended(call_id, at + dt.timedelta(seconds=10 * turns + 5), "hangup")
        await asyncio.sleep(0)
    await store.flush()
    took = time.perf_counter() - start
    db_cpu = postgres_cpu_s() - cpu0 if url else None
    dropped = store.dropped
    await store.close()
    return {"database": "postgresql" if url else "sqlite", "calls": calls, "turns": calls * turns,
            "records": calls * (turns + 2), "seconds": round(took, 3),
            "turns_per_s": round(calls * turns / took, 1), "records_per_s": round(calls * (turns + 2) / took, 1),
            "db_cpu_ms_per_turn": round(1000 * db_cpu / (calls * turns), 3) if db_cpu is not None else None,
            "dropped": dropped}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--export-calls", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--postgres", action="store_true",
                        help="(c) also against a throwaway PostgreSQL (Debian's, as the tests start it)")
    parser.add_argument("--database-url", default="", help="(c) also against this PostgreSQL")
    parser.add_argument("--json")
    args = parser.parse_args()
    print(f"CPU: {cpu.describe()}")
    with tempfile.TemporaryDirectory() as tmp:
        path = asyncio.run(audio_path(args.turns, Path(tmp) / "audio"))
        report = asyncio.run(export(Path(tmp) / "export", args.export_calls, 10, args.repeats))
        written = [asyncio.run(writes("", Path(tmp) / "writes"))]
        if args.database_url:
            written.append(asyncio.run(writes(args.database_url, Path(tmp) / "writes")))
        elif args.postgres:
            from tests.postgres_server import postgres_server

            with postgres_server() as url:
                written.append(asyncio.run(writes(url, Path(tmp) / "writes")))
    p = path["per_turn_us"]
    print(f"(a) audio path, per turn ({path['calls_per_turn']} calls: 250 caller frames, 125 bot chunks, "
          f"turn_ended), {path['turns']} turns: p50 {p['p50'] / 1000:.3f} ms, p99 {p['p99'] / 1000:.3f} ms, "
          f"max {p['max'] / 1000:.3f} ms (target p99 <= 1 ms)")
    print(f"    one call: caller() p50 {path['caller_call_us']['p50']} us / p99 {path['caller_call_us']['p99']} us, "
          f"bot() p50 {path['bot_call_us']['p50']} us / p99 {path['bot_call_us']['p99']} us, "
          f"turn_ended() p50 {path['turn_ended_us']['p50']} us / p99 {path['turn_ended_us']['p99']} us")
    print(f"    {path['calls']} calls of {path['turns'] // path['calls']} turns, each one's "
          f"{path['recording_mb_per_call']} MB recording written in the background as it ended; after the last "
          f"turn the writer and the recordings were done in {path['final_drain_s']} s; "
          f"{path['dropped']} records dropped")
    for fmt in ("jsonl", "csv"):
        r = report[fmt]
        print(f"(b) export of {report['calls']} calls x {report['turns_per_call']} turns as {fmt}: median "
              f"{r['median_s']:.3f} s ({r['bytes'] / 1000:.0f} kB; runs {r['seconds']}) (target < 1 s)")
    for w in written:
        db_cpu = f", the server's CPU {w['db_cpu_ms_per_turn']} ms a turn" if w["db_cpu_ms_per_turn"] else ""
        print(f"(c) {w['database']}: {w['calls']} calls of {w['turns'] // w['calls']} turns ({w['records']} records) "
              f"written in {w['seconds']} s by one writer: {w['turns_per_s']} turns/s, {w['records_per_s']} "
              f"records/s{db_cpu}; {w['dropped']} dropped")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), "audio_path": path, "export": report,
                                               "writes": written}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
