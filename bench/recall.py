"""Benchmark: does the agent say back exactly what the caller told it, at once and four turns later?

Per LLM pack, system prompt and temperature, side by side: repeat-back (one turn: "My order number
is 4 5 2 1. Can you repeat it back to me?") and five-turn recall (the item in turn 1, three other
requests, then "what was the number I gave you at the start?"), each call one conversation of the
embedded engine with its cache kept between turns as in a call, every reply kept in the history. A
reply is right when it holds the item exactly: its digits and letters in order (number words read
as digits, spacing and punctuation ignored), or the name. It also prints the time to each reply's
first token (the turn's own prefill; the system prompt is computed once, as the server does), so
the packs' cost is seen in the same run.

    .venv/bin/python bench/recall.py --split held --json docs/bench/recall_heldout.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.settings import Settings
from bench.honesty import prompt_named
from bench.recall_set import HELD_ITEMS, MIDDLE, RECALL_ASK, REPEAT_ASK, TUNE_ITEMS, Item
from bench.voice_latency import pct
from core.clock import MonotonicClock
from models import cpu
from models.protocols import ChatMessage, SamplingParams, TextDelta
from models.registry import load_llm
from pipeline import honesty

WORDS = {"zero": "0", "oh": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
         "seven": "7", "eight": "8", "nine": "9"}


def collapsed(text: str) -> str:
    """Letters and digits only, lower case, each number word as its digit: "Four, five-2 1" -> "4521"."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return "".join(WORDS.get(w, w) for w in words)


def holds(item: Item, reply: str) -> bool:
    if item.kind == "name":
        return re.search(rf"\b{re.escape(item.value.lower())}\b", reply.lower()) is not None
    return item.value.lower() in collapsed(reply)


class Call:
    """One conversation, its history kept as the server keeps it."""

    def __init__(self, llm: Any, system: str, sampling: SamplingParams, judge: Any = None,
                 settings: Settings | None = None) -> None:
        self.conversation = llm.conversation()
        self.history: list[ChatMessage] = [ChatMessage("system", system)]
        self.sampling = sampling
        self.first_token_ms: list[float] = []
        self.judge, self.settings = judge, settings or Settings()  # the honesty gate's judge (None: no gate)
        self.gated: list[float] = []  # the gate's chance for each turn it asked

    async def start(self) -> None:
        await self.conversation.prepare(tuple(self.history))

    async def say(self, words: str, clock: MonotonicClock) -> str:
        self.history.append(ChatMessage("user", words))
        reply, asked = "", clock.now()
        prompt = tuple(self.history)
        if self.judge is not None:  # as the server does (pipeline/session/replies.py)
            config = self.settings.session.honesty
            prompt, chance = await honesty.checked(self.judge, config, prompt, self.settings.session.system_prompt)
            self.gated.append(chance)
            reply = prompt[-1].content if prompt[-1].unfinished else ""
        first = True
        async for out in self.conversation.stream(prompt, self.sampling):
            if isinstance(out, TextDelta):
                if first:  # from the words' arrival: the gate's question included
                    self.first_token_ms.append((clock.now() - asked) * 1000)
                    first = False
                reply += out.text
        reply = reply.strip()
        self.history.append(ChatMessage("assistant", reply))
        return reply

    async def aclose(self) -> None:
        await self.conversation.aclose()


async def run(pack: str, prompts: dict[str, str], temperatures: list[float], items: list[Item],
              settings: Settings, gates: list[bool]) -> list[dict[str, Any]]:
    clock = MonotonicClock()
    llm = load_llm(settings.llm.model_copy(update={"model": pack}), clock, sequences=2)
    judged_by = settings.llm.tools_model or pack  # the gate's judge, as the server picks it
    judge = None
    if any(gates):
        judge = llm if judged_by == pack else load_llm(settings.llm.model_copy(update={"model": judged_by}),
                                                       clock, sequences=1, worker=getattr(llm, "worker", None))
    rows: list[dict[str, Any]] = []
    try:
        for (prompt_name, prompt), gate in itertools.product(prompts.items(), gates):
            name = f"{prompt_name}+gate" if gate else prompt_name
            await asyncio.to_thread(llm.warm_up, prompt)
            for temperature in temperatures:
                sampling = replace(settings.sampling(), temperature=temperature)
                for n, item in enumerate(items):
                    for test in ("repeat_back", "five_turn"):
                        call = Call(llm, prompt, sampling, judge if gate else None, settings)
                        await call.start()
                        try:
                            if test == "repeat_back":
                                turns = [f"{item.given} {REPEAT_ASK[item.kind]}"]
                            else:
                                turns = [item.given, *MIDDLE[n % len(MIDDLE)], RECALL_ASK[item.kind]]
                            replies = [await call.say(t, clock) for t in turns]
                        finally:
                            await call.aclose()
                        right = holds(item, replies[-1])
                        rows.append({"pack": pack, "prompt": name, "temperature": temperature, "test": test,
                                     "item": item.value, "kind": item.kind, "turns": turns, "replies": replies,
                                     "right": right, "first_token_ms": call.first_token_ms,
                                     "honesty": call.gated})
                        print(f"  {pack[:22]:22s} {name:9s} T={temperature:<4} {test:11s} "
                              f"{'right' if right else 'WRONG'} {item.value!r}: {replies[-1][:90]!r}", flush=True)
    finally:
        await llm.aclose()
        if judge is not None and judge is not llm:
            await judge.aclose()
    return rows


def report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    print("\n| pack | prompt | temperature | repeat-back exact | five-turn recall | first token p50 / p90 |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    out: dict[str, Any] = {}
    for key in sorted({(r["pack"], r["prompt"], r["temperature"]) for r in rows}):
        mine = [r for r in rows if (r["pack"], r["prompt"], r["temperature"]) == key]
        repeat = [r["right"] for r in mine if r["test"] == "repeat_back"]
        recall = [r["right"] for r in mine if r["test"] == "five_turn"]
        firsts = [ms for r in mine for ms in r["first_token_ms"]]
        p50, p90 = statistics.median(firsts), pct(firsts, 0.9)
        out[" / ".join(map(str, key))] = {"repeat_back": [sum(repeat), len(repeat)],
                                          "five_turn": [sum(recall), len(recall)],
                                          "first_token_ms_p50": round(p50, 1), "first_token_ms_p90": round(p90, 1)}
        print(f"| {key[0]} | {key[1]} | {key[2]} | {sum(repeat)}/{len(repeat)} ({sum(repeat) / len(repeat):.0%}) | "
              f"{sum(recall)}/{len(recall)} ({sum(recall) / len(recall):.0%}) | {p50:.0f} / {p90:.0f} ms |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", choices=["tune", "held"], default="held")
    parser.add_argument("--packs", default="qwen2.5-coder-0.5b-instruct-q4_k_m")
    parser.add_argument("--prompts", default="default", help="default, examples and/or candidate")
    parser.add_argument("--candidate", help="a system prompt to try, named 'candidate'")
    parser.add_argument("--temperatures", default="0.7", help="comma-separated")
    parser.add_argument("--gate", default="on,off", help="the honesty gate (pipeline/honesty.py): on, off or both")
    parser.add_argument("--json")
    args = parser.parse_args()
    print(f"CPU: {cpu.describe()}")
    settings = Settings()
    prompts = {name: prompt_named(name, settings, args.candidate) for name in args.prompts.split(",")}
    temperatures = [float(t) for t in args.temperatures.split(",")]
    items = TUNE_ITEMS if args.split == "tune" else HELD_ITEMS
    rows = []
    for pack in args.packs.split(","):
        rows += asyncio.run(run(pack, prompts, temperatures, items, settings,
                                [g == "on" for g in args.gate.split(",")]))
    summary = report(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), "prompts": prompts, "summary": summary,
                                               "calls": rows}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
