"""Benchmark: speculative decoding versus plain decoding on the embedded engine, side by side.

Runs voice-agent-style conversations (short questions, confirmations that repeat the caller's
words, longer explanations) through the same target in one run: plain, n-gram and draft-model
speculation, at temperature 0 and 0.8, and prints per case and per category the decode speed
(tokens/s after the first token), the speedup over plain, acceptance rate, mean acceptance length,
time to first token, and whether the temperature-0 outputs equal plain decoding's.

    .venv/bin/python bench/spec_decode.py                       # llama.cpp: 1.5B target, 0.5B draft, Q4_K_M
    .venv/bin/python bench/spec_decode.py --runtime torch-bfloat16 --max-tokens 48
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass

from llm_runtime import load  # bench/llm_runtime.py, beside this script

from core.clock import MonotonicClock
from models import cpu
from models.llm.generation import GenerationLoop
from models.llm.lm import CausalLM
from models.protocols import GenerationStats, SamplingParams, Speculation
from models.speculative.decoder import SpeculativeStrategy

VOICE = ("You are a friendly voice assistant on a phone call. Your replies are spoken aloud, so answer in "
         "two or three short, natural sentences, without lists or markdown.")
CONFIRM = ("You are a voice assistant taking orders and bookings by phone. Always confirm the request back "
           "to the caller in their own words, with every detail, then ask if it is correct.")
EXPLAIN = "You are a patient voice assistant. Explain things clearly in a short spoken paragraph."

CASES = [
    ("question", VOICE, "What is the capital of France?"),
    ("question", VOICE, "What time is it usually best to water plants?"),
    ("question", VOICE, "How many days are there in a leap year?"),
    ("confirmation", CONFIRM, "I'd like two large pepperoni pizzas, one garlic bread and a bottle of cola, "
                              "delivered to 42 Baker Street, apartment 5."),
    ("confirmation", CONFIRM, "Please book a table for four people at seven thirty tonight under the name "
                              "Johnson, by the window if possible."),
    ("confirmation", CONFIRM, "My phone number is 555 867 5309 and my email is jane dot doe at example dot com."),
    ("explanation", EXPLAIN, "Can you explain how refinancing a mortgage works?"),
    ("explanation", EXPLAIN, "How do vaccines train the immune system?"),
]
METHODS = ("off", "ngram", "draft_model")


@dataclass
class Run:
    category: str
    case: int
    method: str
    temperature: float
    tokens: list[int]
    stats: GenerationStats
    decode_tps: float


def run_one(strategy: SpeculativeStrategy, prompt: list[int], method: str, temperature: float,
            max_tokens: int, seed: int) -> tuple[list[int], GenerationStats, float]:
    params = SamplingParams(temperature=temperature, top_p=0.8, top_k=20, max_tokens=max_tokens, seed=seed,
                            speculation=Speculation(method))
    stats = GenerationStats()
    state = strategy.lm.new_state()
    session = strategy.new_session()
    loop = GenerationLoop(strategy.lm, session.decoder(state, params, stats), prompt, params, stats)
    start = time.perf_counter()
    loop.step()
    first = time.perf_counter()
    while not loop.done:
        loop.step()
    end = time.perf_counter()
    session.close()
    strategy.lm.release(state)
    stats.time_to_first_token_ms = (first - start) * 1000
    stats.duration_ms = (end - start) * 1000
    decode_tps = (len(loop.produced) - 1) / (end - first) if len(loop.produced) > 1 and end > first else 0.0
    return loop.produced, stats, decode_tps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct-q4_k_m")
    parser.add_argument("--runtime", default="llama.cpp",
                        choices=["llama.cpp", "torch-float32", "torch-int8", "torch-bfloat16"])
    parser.add_argument("--draft-runtime", help="the draft's runtime (default: the target's)")
    parser.add_argument("--threads", type=int, default=cpu.cores())
    parser.add_argument("--max-tokens", type=int, default=80)
    parser.add_argument("--temperatures", default="0,0.8")
    parser.add_argument("--json", help="also write every run to this file")
    parser.add_argument("--categories", default="question,confirmation,explanation")
    args = parser.parse_args()

    clock = MonotonicClock()
    target = load(args.runtime, args.target, args.threads)
    draft = load(args.draft_runtime or args.runtime, args.draft, args.threads)
    print(f"CPU: {cpu.describe()}\n{args.threads} threads; "
          f"target {args.target} ({target.runtime}, {target.precision}), "
          f"draft {args.draft} ({draft.runtime}, {draft.precision})")
    strategy = SpeculativeStrategy(target, clock, draft=draft)
    print("calibrated verify cost (ms) for 1..9 tokens:",
          [round(v * 1000) for v in strategy.costs["ngram"].verify],
          f"draft step {1000 * (strategy.costs['draft_model'].draft_step or 0):.0f} ms")

    runs: list[Run] = []
    for temperature in (float(t) for t in args.temperatures.split(",")):
        for i, (category, system, question) in enumerate(CASES):
            if category not in args.categories.split(","):
                continue
            prompt = target.chat_tokens([{"role": "system", "content": system}, {"role": "user", "content": question}])
            for method in METHODS:
                tokens, stats, tps = run_one(strategy, prompt, method, temperature, args.max_tokens, seed=i)
                runs.append(Run(category, i, method, temperature, tokens, stats, tps))
                print(f"  T={temperature:.1f} {category:12s} #{i} {method:11s} {tps:6.2f} tok/s "
                      f"ttft {stats.time_to_first_token_ms:5.0f} ms  accept {stats.acceptance_rate:4.2f} "
                      f"len {stats.mean_acceptance_length:4.2f}  tokens {len(tokens)}", flush=True)
    report(runs, target)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{**r.stats.as_dict(), "category": r.category, "case": r.case, "temperature": r.temperature,
                        "decode_tokens_per_second": r.decode_tps} for r in runs], f, indent=1)


def report(runs: list[Run], target: CausalLM) -> None:
    plain = {(r.case, r.temperature): r for r in runs if r.method == "off"}
    print("\nmedians per category (speedup = decode tok/s over plain's, per case, then the median)")
    header = (f"{'T':>3} {'category':12s} {'method':11s} {'tok/s':>6} {'speedup':>7} {'accept':>6} "
              f"{'mean len':>8} {'ttft ms':>7} {'T=0 same as plain':>17}")
    print(header)
    print("-" * len(header))
    groups: dict[tuple[float, str, str], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.temperature, r.category, r.method), []).append(r)
        groups.setdefault((r.temperature, "all", r.method), []).append(r)
    for (temperature, category, method), group in groups.items():
        speedups = [r.decode_tps / plain[(r.case, r.temperature)].decode_tps for r in group]
        same = "-"
        if temperature == 0 and method != "off":
            equal = sum(r.tokens == plain[(r.case, 0.0)].tokens for r in group)
            same = f"{equal}/{len(group)}"
        drafted = [r for r in group if r.stats.drafts]
        accept = statistics.median(r.stats.acceptance_rate for r in drafted) if drafted else 0.0
        mean_len = statistics.median(r.stats.mean_acceptance_length for r in drafted) if drafted else 0.0
        print(f"{temperature:3.1f} {category:12s} {method:11s} {statistics.median(r.decode_tps for r in group):6.2f} "
              f"{statistics.median(speedups):6.2f}x {accept:6.2f} {mean_len:8.2f} "
              f"{statistics.median(r.stats.time_to_first_token_ms for r in group):7.0f} {same:>17}")
    worst = min((r.decode_tps / plain[(r.case, r.temperature)].decode_tps, r) for r in runs if r.method != "off")
    print(f"\nslowest case against plain: {worst[0]:.2f}x ({worst[1].method}, {worst[1].category} "
          f"#{worst[1].case}, T={worst[1].temperature})")
    for r in runs:
        if r.temperature == 0 and r.method != "off" and r.tokens != plain[(r.case, 0.0)].tokens:
            p = plain[(r.case, 0.0)].tokens
            at = next((i for i, (a, b) in enumerate(zip(p, r.tokens, strict=False)) if a != b),
                      min(len(p), len(r.tokens)))
            ours, theirs = target.decode(p[at:at + 4]), target.decode(r.tokens[at:at + 4])
            print(f"T=0 parting: {r.method} case #{r.case} at token {at}: plain {ours!r} vs {theirs!r}")


if __name__ == "__main__":
    main()
