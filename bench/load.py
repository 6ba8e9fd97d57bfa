"""Load: N callers at once, each streaming real-time audio (20 ms PCM16 frames at 16 kHz) to a real
server process over real sockets. The server runs fake instant engines (tests/app/fake_server.py,
named as fakes: the VAD hears a tone, the ASR says "hello", the LLM answers at once, the TTS makes
0.1 s of tone a word), so what is measured is the service's own overhead: sockets, resampling,
endpointing, the session's stages, pacing, the call store.

Per caller, one turn: 1 s of tone, then silence until the reply's first audio. Reported:
- added latency: first reply audio minus the end of the tone minus endpointing.end_silence_ms (the
  silence the server must wait for by design), p50/p99;
- dropped frames: `audio_backlog` errors (the server's queue was over max_audio_backlog_ms);
- failed calls: no reply within 20 s, or an error;
- server CPU per call (% of one core, over the run), and how late the callers' own frames went out
  (the load generator shares the 2 cores: when it lags, the figures are the machine's, not the server's).

    .venv/bin/python bench/load.py --callers 50 100 200 --out docs/bench/load

With --replicas (e.g. `--replicas 1 2`), each count of replicas in turn runs behind a real HAProxy
(tests/haproxy_server.py, as docs/deployment.md configures it: /readyz checks, round robin), sharing
a real Redis (limits, call counts) and PostgreSQL (the call store), as a multi-replica deployment
does; the callers all go through the balancer. Server CPU is the replicas' together; HAProxy's is
its own column. The table also gives, per count of replicas, the fewest callers in the sweep at
which the added latency's p99 passed 100 ms.

    .venv/bin/python bench/load.py --replicas 0 1 2 --callers 10 20 30 40 50 60 80 100 --repeat 3 \\
        --out docs/bench/load_replicas
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import publish
from models import cpu
from pipeline.config import EndpointingConfig
from tests.app.test_shutdown import start_fake_server

FRAME_S = 0.02
SPEECH_S = 1.0
END_SILENCE_MS = EndpointingConfig().end_silence_ms
START = json.dumps({"type": "session.start", "audio": {"sample_rate": 16000}})


def frames() -> tuple[list[bytes], bytes]:
    t = np.arange(int(SPEECH_S * 16000)) / 16000
    tone = (0.5 * np.sin(2 * np.pi * 300 * t) * 32767).astype(np.int16)
    speech = [tone[i:i + 320].tobytes() for i in range(0, len(tone), 320)]
    return speech, np.zeros(320, dtype=np.int16).tobytes()


async def caller(base: str, start_at: float) -> dict[str, Any]:
    speech, silence = frames()
    result: dict[str, Any] = {"ok": False, "backlog": 0, "lag_ms": [], "errors": []}
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    try:
        async with websockets.connect(f"ws://{base}/ws", open_timeout=30) as ws:
            await ws.send(START)
            first_audio = asyncio.get_running_loop().create_future()
            done = asyncio.get_running_loop().create_future()

            async def read() -> None:
                async for message in ws:
                    if isinstance(message, bytes):
                        if not first_audio.done():
                            first_audio.set_result(time.monotonic())
                        continue
                    event = json.loads(message)
                    if event["type"] == "error":
                        if event["code"] == "audio_backlog":
                            result["backlog"] += 1
                        else:
                            result["errors"].append(event["code"])
                    elif event["type"] == "response.done" and not done.done():
                        done.set_result(event)

            reader = asyncio.create_task(read())
            t0 = time.monotonic()
            speech_end = 0.0
            for i in range(int(20 / FRAME_S)):  # real time: frame i is due at t0 + i * 20 ms
                due = t0 + i * FRAME_S
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                result["lag_ms"].append(1000 * (time.monotonic() - due))
                await ws.send(speech[i] if i < len(speech) else silence)
                if i == len(speech) - 1:
                    speech_end = time.monotonic()
                if first_audio.done() and done.done():
                    break
            if first_audio.done():
                result["added_ms"] = 1000 * (first_audio.result() - speech_end) - END_SILENCE_MS
                result["ok"] = done.done() and done.result()["status"] == "completed"
            await ws.send(json.dumps({"type": "session.end"}))
            reader.cancel()
    except (OSError, websockets.WebSocketException, TimeoutError) as exc:
        result["errors"].append(type(exc).__name__)
    return result


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return round(float(np.percentile(values, q)), 1)


def cpu_seconds(processes: list[psutil.Process]) -> float:
    return sum(t.user + t.system for t in (p.cpu_times() for p in processes))


async def run(base: str, n: int, servers: list[psutil.Process],
              balancer: psutil.Process | None = None, repeat: int = 1) -> dict[str, Any]:
    """`repeat` waves of `n` callers, one after the other; the figures pool every wave's calls."""
    cpu0, lb0 = cpu_seconds(servers), cpu_seconds([balancer] if balancer else [])
    results: list[dict[str, Any]] = []
    busy = 0.0  # seconds with calls in progress (the waits between waves left out)
    for _ in range(repeat):
        t0 = time.monotonic()
        starts = [t0 + 2.0 * i / n for i in range(n)]  # spread over 2 s, as calls arrive
        results += await asyncio.gather(*(caller(base, s) for s in starts))
        busy += time.monotonic() - t0
    wall = busy
    cpu_s = cpu_seconds(servers) - cpu0
    balancer_s = cpu_seconds([balancer] if balancer else []) - lb0
    added = [r["added_ms"] for r in results if "added_ms" in r]
    lags = [lag for r in results for lag in r["lag_ms"]]
    errors: dict[str, int] = {}
    for r in results:
        for code in r["errors"]:
            errors[code] = errors.get(code, 0) + 1
    return {
        "replicas": len(servers), "balancer_cpu_total_pct": round(100 * balancer_s / wall, 1) if balancer else None,
        "callers": n, "waves": repeat, "calls": len(results),
        "completed": sum(r["ok"] for r in results), "failed": sum(not r["ok"] for r in results),
        "added_ms_p50": pct(added, 50), "added_ms_p99": pct(added, 99),
        "dropped_frames_warnings": sum(r["backlog"] for r in results), "errors": errors,
        "server_cpu_s": round(cpu_s, 2), "wall_s": round(wall, 1),
        "server_cpu_per_call_pct": round(100 * cpu_s / wall / n, 2),
        "server_cpu_total_pct": round(100 * cpu_s / wall, 1),
        "client_send_lag_ms_p50": pct(lags, 50), "client_send_lag_ms_p99": pct(lags, 99),
    }


SERVER_ENV = {"FAKE_TOKEN_DELAY_S": "0", "VOICE_AGENT_SERVER__MAX_SESSIONS": "10000",
              "VOICE_AGENT_SERVER__MAX_CALLS_PER_CLIENT": "10000",
              "VOICE_AGENT_SERVER__MAX_CONNECTIONS_PER_MINUTE": "1000000", "VOICE_AGENT_SERVER__LOG_LEVEL": "warning"}


@contextlib.contextmanager
def replicas(tmp: Path, count: int) -> Iterator[tuple[str, list[psutil.Process], psutil.Process]]:
    """`count` fake-engine replicas sharing a real Redis and PostgreSQL, behind a real HAProxy."""
    from tests.haproxy_server import haproxy
    from tests.postgres_server import postgres_server
    from tests.redis_server import redis_server

    with contextlib.ExitStack() as stack:
        redis_url = stack.enter_context(redis_server(tmp))
        database = stack.enter_context(postgres_server())
        env = {**SERVER_ENV, "VOICE_AGENT_SERVER__REDIS_URL": redis_url, "VOICE_AGENT_STORAGE__URL": database,
               "VOICE_AGENT_SERVER__TOKEN_SECRET": "load-benchmark-secret-0123456789",
               "VOICE_AGENT_SERVER__TRUSTED_PROXIES": '["127.0.0.1"]'}
        procs: list[subprocess.Popen[bytes]] = []
        ports: dict[str, int] = {}
        try:
            for i in range(count):
                folder = tmp / f"replica-{count}-{i}"
                folder.mkdir()
                base, proc, _ = start_fake_server(folder, **env)
                procs.append(proc)
                ports[f"r{i}"] = int(base.rsplit(":", 1)[1])
            (tmp / f"balancer-{count}").mkdir()
            balancer = stack.enter_context(haproxy(tmp / f"balancer-{count}", ports))
            yield (balancer.url.removeprefix("http://"), [psutil.Process(p.pid) for p in procs],
                   psutil.Process(balancer.process.pid))
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(30)


def crossing(rows: list[dict[str, Any]], replicas: int) -> tuple[int | None, int | None]:
    """The fewest callers in the sweep at which the added latency's p99 passed 100 ms, and the
    fewest from which it stayed past 100 ms for every larger count."""
    mine = sorted((r for r in rows if r["replicas_asked"] == replicas), key=lambda r: r["callers"])
    over = [r["added_ms_p99"] is None or r["added_ms_p99"] > 100 for r in mine]
    first = next((r["callers"] for r, o in zip(mine, over, strict=True) if o), None)
    stays = None
    for i in range(len(mine) - 1, -1, -1):
        if not over[i]:
            break
        stays = mine[i]["callers"]
    return first, stays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--callers", type=int, nargs="+", default=[50, 100, 200])
    parser.add_argument("--replicas", type=int, nargs="+",
                        help="run each count of replicas behind HAProxy with Redis and PostgreSQL; 0 is one server "
                             "called directly (the default)")
    parser.add_argument("--repeat", type=int, default=1, help="waves of each count of callers, pooled (default 1)")
    parser.add_argument("--out", help="write OUT.json and OUT.txt")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for count in args.replicas or [0]:
            if count:
                with replicas(Path(tmp), count) as (base, servers, balancer):
                    rows += [{"replicas_asked": count, **asyncio.run(run(base, n, servers, balancer, args.repeat))}
                             for n in args.callers]
                continue
            folder = Path(tmp) / "direct"
            folder.mkdir()
            base, proc, _ = start_fake_server(folder, **SERVER_ENV)
            try:
                server = [psutil.Process(proc.pid)]
                rows += [{"replicas_asked": 0, **asyncio.run(run(base, n, server, repeat=args.repeat))}
                         for n in args.callers]
            finally:
                proc.terminate()
                proc.wait(30)
    setup = (f"replicas {', '.join(map(str, args.replicas))} behind HAProxy, sharing Redis and PostgreSQL (0: one "
             "server called directly, SQLite, no Redis)" if args.replicas else "one server, called directly")
    lines = [f"machine: {cpu.describe()}",
             f"fake instant engines; endpointing.end_silence_ms={END_SILENCE_MS} subtracted; {setup}; one process "
             "of callers on the same cores", ""]
    head = (f"{'replicas':>8s} {'callers':>7s} {'ok':>5s} {'failed':>6s} {'added p50':>9s} {'added p99':>9s} "
            f"{'dropped':>7s} {'cpu/call %':>10s} {'cpu total %':>11s} {'haproxy %':>9s} {'client lag p99':>14s}  "
            "errors")
    lines += [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['replicas_asked']:8d} {r['callers']:7d} {r['completed']:5d} {r['failed']:6d} "
                     f"{r['added_ms_p50']!s:>9s} {r['added_ms_p99']!s:>9s} {r['dropped_frames_warnings']:7d} "
                     f"{r['server_cpu_per_call_pct']:10.2f} {r['server_cpu_total_pct']:11.1f} "
                     f"{r['balancer_cpu_total_pct'] if r['balancer_cpu_total_pct'] is not None else '-'!s:>9s} "
                     f"{r['client_send_lag_ms_p99']!s:>14s}  {r['errors'] or '-'}")
    lines.append("")
    for count in args.replicas or [0]:
        first, stays = crossing(rows, count)
        label = f"{count} replica(s) behind HAProxy" if count else "one server, direct"
        lines.append(f"{label}: added p99 first passed 100 ms at {first} callers, and stayed past it from {stays}"
                     if first else f"{label}: added p99 stayed within 100 ms up to {max(args.callers)} callers")
    text = "\n".join(lines)
    publish(text, rows, args.out)


if __name__ == "__main__":
    main()
