"""Benchmark: which model judges the honesty gate (pipeline/honesty.py), at which threshold.

Each judging pack is asked the gate's question for the later tune requests of bench/honesty_set.py
(UNCHECKABLE_TUNE_MORE, ANSWERABLE_TUNE_MORE, and the demo bakery's tune questions with its facts as
what the agent was told; the caller's steering of the call and look-ups asked in a conversation, after
earlier words), none of which are among the gate's examples. For each threshold it prints the
uncheckable requests the gate would miss and the answerable ones it would gate (needless refusals),
and the time each question took. The held-out requests asked in a conversation (CONTROLS_HELD,
LOOKUPS_AFTER_HELD) are reported apart ("held"): nothing was chosen on them.

    .venv/bin/python bench/honesty_judge.py --json docs/bench/honesty_judge_tune.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.settings import Settings
from bench.honesty import DEMO_FACTS
from bench.honesty_set import (
    ANSWERABLE_TUNE_MORE,
    CONTROLS_HELD,
    CONTROLS_TUNE,
    FACTS_TUNE,
    FACTS_UNCHECKABLE,
    LOOKUPS_AFTER_HELD,
    LOOKUPS_AFTER_TUNE,
    UNCHECKABLE_TUNE_MORE,
)
from bench.voice_latency import pct
from core.clock import MonotonicClock
from models import cpu
from models.registry import load_llm
from pipeline import honesty

THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def requests(facts: str, told_always: bool) -> list[tuple[str, bool, str, str, str]]:
    """(words, needs a look-up or an action, what the agent was told, the caller's earlier words, split).
    `told_always`: the general requests are judged with the bakery's facts told too, as in the demo
    (scripts/serve.sh starts it with them)."""
    general = facts if told_always else ""
    shown = {request for request, _, _ in honesty.EXAMPLES}
    return [*((t, True, general, "", "tune") for t in UNCHECKABLE_TUNE_MORE),
            *((t, False, general, "", "tune") for t, _ in ANSWERABLE_TUNE_MORE),
            *((t, False, facts, "", "tune") for t, _ in FACTS_TUNE),
            *((t, True, facts, "", "tune") for t, split in FACTS_UNCHECKABLE if split == "tune"),
            *((t, False, general, e, "tune") for t, e in CONTROLS_TUNE if t not in shown),
            *((t, True, general, e, "tune") for t, e in LOOKUPS_AFTER_TUNE if t not in shown),
            *((t, False, general, e, "held") for t, e in CONTROLS_HELD),
            *((t, True, general, e, "held") for t, e in LOOKUPS_AFTER_HELD)]


async def judge_with(pack: str, settings: Settings, facts: str, told_always: bool,
                     told_last: bool = False) -> list[dict[str, Any]]:
    llm: Any = load_llm(settings.llm.model_copy(update={"model": pack}), MonotonicClock(), sequences=1)
    rows = []
    try:
        await llm.next_word_probabilities(honesty.messages("Hello.", []), ("yes",))  # the examples, once
        for words, uncheckable, told, earlier, split in requests(facts, told_always):
            started = time.perf_counter()
            chance = await honesty.cannot_answer(llm, words, [earlier] if earlier else [], told,  # both asked
                                                 told_last=told_last)
            rows.append({"pack": pack, "told_always": told_always, "told_last": told_last, "split": split,
                         "request": words,
                         "earlier": earlier, "uncheckable": uncheckable, "facts": bool(told),
                         "chance": round(chance, 4), "ms": round((time.perf_counter() - started) * 1000, 1)})
            print(f"  {pack[:24]:24s} {split} {chance:.3f} {'needs' if uncheckable else 'can  '} "
                  f"{'(facts) ' if told else ''}{f'[{earlier}] ' if earlier else ''}{words}", flush=True)
    finally:
        await llm.aclose()
    return rows


def report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    print("\n| judge | split | threshold | uncheckable missed | answerable gated | question p50 / p90 |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    def key(r: dict[str, Any]) -> tuple[str, bool, bool, str]:
        return r["pack"], r["told_always"], r.get("told_last", False), r["split"]

    for pack, told_always, told_last, split in dict.fromkeys(key(r) for r in rows):
        mine = [r for r in rows if key(r) == (pack, told_always, told_last, split)]
        name = f"{pack}, the facts told for every request" if told_always else pack
        name += ", told after the examples" if told_last else ""
        ms = [r["ms"] for r in mine]
        need = [r for r in mine if r["uncheckable"]]
        can = [r for r in mine if not r["uncheckable"]]
        out.setdefault(name, {})[split] = {}
        for t in THRESHOLDS:
            missed = sum(r["chance"] < t for r in need)
            gated = sum(r["chance"] >= t for r in can)
            out[name][split][str(t)] = {"missed": [missed, len(need)], "gated": [gated, len(can)]}
            print(f"| {name} | {split} | {t} | {missed}/{len(need)} | {gated}/{len(can)} | "
                  f"{statistics.median(ms):.0f} / {pct(ms, 0.9):.0f} ms |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--packs", default="qwen2.5-coder-0.5b-instruct-q4_k_m,qwen2.5-coder-1.5b-instruct-q4_k_m")
    parser.add_argument("--told", default="apart,always", help="apart: the facts told only for the bakery's "
                        "questions; always: for every request too (the demo); both, side by side")
    parser.add_argument("--told-at", default="instructions", help="instructions: what the agent was told is in "
                        "the question's instructions (the operator's facts); request: after the examples, with the "
                        "request (a client's own instructions); both, side by side")
    parser.add_argument("--json")
    args = parser.parse_args()
    print(f"CPU: {cpu.describe()}")
    settings = Settings()
    facts = DEMO_FACTS.read_text().strip()
    rows = []
    for pack in args.packs.split(","):
        for told in args.told.split(","):
            for at in args.told_at.split(","):
                rows += asyncio.run(judge_with(pack, settings, facts, told == "always", at == "request"))
    summary = report(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), "instructions": honesty.INSTRUCTIONS,
                                               "summary": summary, "questions": rows}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
