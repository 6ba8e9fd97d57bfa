"""Benchmark: prefill per turn over a 40-turn call, with the prompt window sliding a message at a
time (the old behaviour) and dropping old messages in blocks (the default), side by side.

The embedded LLM (llama.cpp, Qwen2.5-Coder-0.5B-Instruct Q4_K_M) answers 40 short spoken-style
turns in one conversation with the default `max_history_messages` (24); per turn it prints the
prompt tokens it computed (the rest came from the conversation's cache) and the time to the first
token.

    .venv/bin/python bench/prompt_prefix.py --json docs/bench/prompt_prefix.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.clock import MonotonicClock
from models import cpu
from models.config import LlmConfig, SpeculativeConfig
from models.llm.llm_factory import load_embedded
from models.protocols import ChatMessage, GenerationDone, SamplingParams, TextDelta
from pipeline.config import DEFAULT_SYSTEM_PROMPT, SessionConfig
from pipeline.history import prompt_window

QUESTIONS = ["What time do you open tomorrow?", "Do you have a table for two tonight?",
             "Can I bring my dog?", "Is there parking nearby?", "What is on the menu today?"]


async def run_call(llm: Any, turns: int, limit: int, block: int) -> list[dict[str, Any]]:
    conversation = llm.conversation()
    history = [ChatMessage("system", DEFAULT_SYSTEM_PROMPT)]
    await conversation.prepare(history)
    rows = []
    for i in range(turns):
        history.append(ChatMessage("user", f"{QUESTIONS[i % len(QUESTIONS)]} (question {i + 1})"))
        reply = ""
        async for out in conversation.stream(prompt_window(history, limit, block),
                                             SamplingParams(temperature=0.0, max_tokens=24)):
            if isinstance(out, TextDelta):
                reply += out.text
            elif isinstance(out, GenerationDone):
                rows.append({"turn": i + 1, "prompt_tokens": out.stats.prompt_tokens,
                             "prefill_tokens": out.stats.prefill_tokens,
                             "ttft_ms": round(out.stats.time_to_first_token_ms, 1)})
        history.append(ChatMessage("assistant", reply))
    await conversation.aclose()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--json")
    args = parser.parse_args()
    print(f"CPU: {cpu.describe()}")
    session = SessionConfig()
    llm = load_embedded(LlmConfig(speculative=SpeculativeConfig(method="off")), MonotonicClock(), sequences=2)
    llm.warm_up(DEFAULT_SYSTEM_PROMPT)
    results = {}
    for name, block in (("sliding", 1), ("blocks", session.history_drop_block)):
        rows = asyncio.run(run_call(llm, args.turns, session.max_history_messages, block))
        results[name] = {"block": block, "turns": rows,
                         "total_prefill_tokens": sum(r["prefill_tokens"] for r in rows),
                         "median_ttft_ms": statistics.median(r["ttft_ms"] for r in rows)}
    print(f"max_history_messages {session.max_history_messages}; prefill tokens (ttft ms) per turn")
    print(f"{'turn':>4} {'sliding':>16} {'blocks of ' + str(session.history_drop_block):>16}")
    for a, b in zip(results["sliding"]["turns"], results["blocks"]["turns"], strict=True):
        print(f"{a['turn']:4d} {a['prefill_tokens']:7d} ({a['ttft_ms']:5.0f}) "
              f"{b['prefill_tokens']:7d} ({b['ttft_ms']:5.0f})")
    for name, r in results.items():
        print(f"{name}: {r['total_prefill_tokens']} prefill tokens in all, median first token {r['median_ttft_ms']} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), **results}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
