"""Benchmark: WebRTC against the WebSocket on a bad network, side by side in one run.

Every question goes to one server over each transport, taking turns at going first: the native
protocol over /ws (TCP) and over WebRTC (/webrtc/calls: Opus over UDP, the same wire), each a fresh
call, on a clean link and on links with packet loss and jitter (bench/lossy_link.py: the kernel here
has no netem, so the bench drops and delays the packets itself, through an NFQUEUE). The server and
the callers run in a network namespace of their own (the bench re-runs itself under `unshare --net`;
it needs root), and both directions of the caller's link are impaired while a call runs.

Per link and transport it prints the true voice-to-voice latency p50 / p90 (the end of speech in the
caller's audio to the reply's first audible sample as the caller plays it: as it arrives), the gaps
heard in replies played as they arrive (a wait for late audio, or audio that never came), and the
recognizer's word error rate on the questions (as the server heard them, against their text).

    .venv/bin/python bench/webrtc_network.py --repeat 2 --json docs/bench/webrtc_network.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench.voice_latency as latency
from bench.asr_window import word_errors
from bench.lossy_link import Impairment, lossy
from models import cpu
from tests.e2e.conftest import Server, start_server, stop_server

INSIDE = "VOICE_AGENT_BENCH_NETNS"  # set when the bench runs in its own network namespace
LINKS = {
    "clean": Impairment(),
    "loss 2 %, jitter 40 ms": Impairment(loss=0.02, delay_ms=40, jitter_ms=40, seed=2),
    "loss 5 %, jitter 40 ms": Impairment(loss=0.05, delay_ms=40, jitter_ms=40, seed=5),
}
TRANSPORTS = ("webrtc", "ws")


async def one(transport: str, server: Server, question: str, tmp: Path, link: Impairment) -> dict[str, Any]:
    port = int(server.base_url.rsplit(":", 1)[1])
    async with lossy(port, link) if link.loss or link.delay_ms or link.jitter_ms else contextlib.nullcontext():
        if transport == "ws":
            result = await latency.one_call(server.ws_url, question, tmp, 16000)
        else:
            result = await latency.one_webrtc_call(server, question, tmp)
    errors, words = word_errors(question, result["heard"])
    return {**result, "transport": transport, "word_errors": errors, "words": words}


async def run(server: Server, repeat: int, tmp: Path,
              links: dict[str, Impairment]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    results: dict[str, dict[str, list[dict[str, Any]]]] = {name: {t: [] for t in TRANSPORTS} for name in links}
    for name, link in links.items():
        print(f"\nlink: {name} ({link.describe()})", flush=True)
        for round_ in range(repeat):
            for i, question in enumerate(latency.QUESTIONS):
                order = TRANSPORTS if (round_ + i) % 2 == 0 else TRANSPORTS[::-1]
                for transport in order:
                    r = await one(transport, server, question, tmp, link)
                    results[name][transport].append(r)
                    print(f"  {transport:6s} {r['true_v2v'] or float('nan'):6.0f} ms  gaps {r['gaps']:2d} "
                          f"({r['gap_ms']:5.0f} ms)  heard {r['heard']!r}", flush=True)
    return results


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(turns: list[dict[str, Any]]) -> dict[str, float | None]:
    v2v = [t["true_v2v"] for t in turns if t["true_v2v"] is not None]
    errors, words = sum(t["word_errors"] for t in turns), sum(t["words"] for t in turns)
    return {
        "turns": len(turns), "v2v_p50": statistics.median(v2v) if v2v else None,
        "v2v_p90": pct(v2v, 0.9) if v2v else None,
        "gaps_per_reply": statistics.mean(t["gaps"] for t in turns) if turns else None,
        "gap_ms_per_reply": statistics.mean(t["gap_ms"] for t in turns) if turns else None,
        "wer": errors / words if words else None,
    }


def table(results: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, dict[str, dict[str, float | None]]]:
    figures = {name: {t: summary(turns) for t, turns in by.items()} for name, by in results.items()}
    print(f"\n{'link':24s} {'transport':9s} {'v2v p50':>8} {'v2v p90':>8} {'gaps/reply':>10} {'gap ms/reply':>12} "
          f"{'WER':>6}")
    for name, by in figures.items():
        for transport, f in by.items():
            def ms(v: float | None) -> str:
                return "-" if v is None else f"{v:.0f}"
            wer = "-" if f["wer"] is None else f"{f['wer']:.3f}"
            gaps = "-" if f["gaps_per_reply"] is None else f"{f['gaps_per_reply']:.1f}"
            print(f"{name:24s} {transport:9s} {ms(f['v2v_p50']):>8} {ms(f['v2v_p90']):>8} {gaps:>10} "
                  f"{ms(f['gap_ms_per_reply']):>12} {wer:>6}")
    return figures


def reexec_in_namespace() -> None:
    """Run this bench again in a network namespace of its own (and wait for it)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("iptables") is None:
        sys.exit("the bad-network bench needs root, unshare and iptables (a network namespace of its own)")
    env = {**os.environ, INSIDE: "1"}
    sys.exit(subprocess.run(["unshare", "--net", sys.executable, *sys.argv], env=env, check=False).returncode)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=2, help="rounds of the 8 questions per link")
    parser.add_argument("--voice", default="hibari", help="the caller's voice (bench/voice_latency.py --voice)")
    parser.add_argument("--json", help="also write every turn and the table to this file")
    parser.add_argument("--link", action="append", choices=list(LINKS), help="only these links (default: all)")
    parser.add_argument("--set", action="append", default=[], metavar="VOICE_AGENT_X=Y",
                        help="a server setting, e.g. VOICE_AGENT_WEBRTC__REORDER_MS=200")
    args = parser.parse_args()
    if os.environ.get(INSIDE) != "1":
        return reexec_in_namespace()
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    # ICE leaves out loopback: an address of another interface for its host candidates (a bridge with no
    # ports: these kernels have no dummy interface); packets to it still go over loopback, impaired
    subprocess.run(["ip", "link", "add", "va0", "type", "bridge"], check=True)
    subprocess.run(["ip", "addr", "add", "10.99.0.1/24", "dev", "va0"], check=True)
    subprocess.run(["ip", "link", "set", "va0", "up"], check=True)
    latency.VOICE = args.voice
    print(f"CPU: {cpu.describe()}; caller voice: {args.voice}; WebRTC caller plays packets as they arrive")
    with tempfile.TemporaryDirectory() as tmp:
        settings = {"VOICE_AGENT_LLM__TEMPERATURE": "0", **dict(s.split("=", 1) for s in args.set)}
        print("server settings:", settings)
        server, proc = start_server(Path(tmp), env=settings)
        links = {name: LINKS[name] for name in args.link or LINKS}
        try:
            results = asyncio.run(run(server, args.repeat, Path(tmp), links))
        finally:
            stop_server(proc)
    figures = table(results)
    if args.json:
        described = {name: {k: v for k, v in vars(link).items() if k != "rng"} for name, link in links.items()}
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), "voice": args.voice, "links": described,
                                               "settings": settings,
                                               "figures": figures, "turns": results}, indent=1, default=str))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
