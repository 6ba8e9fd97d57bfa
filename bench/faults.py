"""Time to recover from each injected fault (tests/app/fault_scenarios.py: the real transport,
session, LLM backend over HTTP and call store; scripted LLM server; fake VAD/ASR/TTS, named as
fakes, so the times are the service's own fault handling, not model speed).

For each fault, from the end of the caller's speech: the error event, the first audio heard (the
apology, or the reply), and the next good reply's first audio (the caller speaks again as soon as
the faulty turn is over: the whole recovery). For a caller who vanished or stopped reading: the
time until the call was ended and its slot freed.

    .venv/bin/python bench/faults.py --runs 3 --out docs/bench/faults
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import publish
from models import cpu
from tests.app.fault_scenarios import FAULTS, READ_TIMEOUT_S, run_fault


def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


async def measure(runs: int) -> list[dict[str, Any]]:
    rows = []
    for fault in FAULTS:
        outcomes = [await asyncio.wait_for(run_fault(fault), 60) for _ in range(runs)]
        first = outcomes[0]
        rows.append({
            "fault": fault.name, "what": fault.what, "runs": runs,
            "caller_gets": first.error_code or ("reply" if first.first_status == "completed" else "call ended"),
            "error_s": median([o.error_s for o in outcomes]),
            "first_audio_s": median([o.first_audio_s for o in outcomes]),
            "ended_s": median([o.ended_s for o in outcomes]),
            "next_good_reply_s": median([o.next_good_s for o in outcomes]),
            "server_up": all(o.server_up for o in outcomes),
            "records_intact": all(not o.notes and (o.kept_turns == o.sent_turns or fault.caller) for o in outcomes),
            "outcomes": [asdict(o) for o in outcomes],
        })
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    def cell(v: Any) -> str:
        return "-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)
    head = (f"{'fault':32s} {'caller gets':16s} {'error s':>8s} {'audio s':>8s} {'ended s':>8s} {'next ok s':>9s}"
            "  up  kept")
    lines = [head, "-" * len(head)]
    for r in rows:
        up, kept = "yes" if r["server_up"] else "NO", "yes" if r["records_intact"] else "NO"
        lines.append(f"{r['fault']:32s} {r['caller_gets']:16s} {cell(r['error_s']):>8s} "
                     f"{cell(r['first_audio_s']):>8s} {cell(r['ended_s']):>8s} {cell(r['next_good_reply_s']):>9s}"
                     f"  {up:3s} {kept}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per fault (medians are reported)")
    parser.add_argument("--out", help="write OUT.json and OUT.txt")
    args = parser.parse_args()
    logging.basicConfig(level=logging.CRITICAL)
    rows = asyncio.run(measure(args.runs))
    header = (f"machine: {cpu.describe()}\nllm.read_timeout_s={READ_TIMEOUT_S}, llm.retries_before_first_token=1; "
              f"median of {args.runs} runs; times in seconds from the end of the caller's speech")
    text = header + "\n\n" + table(rows)
    publish(text, rows, args.out)


if __name__ == "__main__":
    main()
