"""Benchmark: the embedded LLM's runtimes on this CPU, side by side in one run.

For every runtime available here (llama.cpp over the packs' Q4_K_M GGUF; PyTorch in float32, with
int8 linear layers, and in bfloat16 where the CPU computes it natively) and for the Qwen2.5 0.5B and
1.5B packs it prints the cost of a 200-token prefill, of one token, and of one pass over K tokens
after a 200-token context (what verifying K - 1 drafted tokens costs), as medians. Then, on
llama.cpp, plain versus speculative decoding (n-gram, and the 0.5B drafting for the 1.5B) on
voice-style turns at temperature 0, through the project's own engine, with the K controller on
`auto` as the service runs it: decode tokens/s, the ratio to plain, and whether outputs equal.

    .venv/bin/python bench/llm_runtime.py --json docs/bench/llm_runtime.json
    .venv/bin/python bench/llm_runtime.py --runtimes llama.cpp --models qwen2.5-coder-0.5b-instruct-q4_k_m
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.clock import MonotonicClock
from models import cpu
from models.llm.generation import GenerationLoop
from models.llm.lm import CausalLM
from models.protocols import GenerationStats, SamplingParams, Speculation
from models.speculative.decoder import SpecSession, SpeculativeStrategy

MODELS = ("qwen2.5-coder-0.5b-instruct-q4_k_m", "qwen2.5-coder-1.5b-instruct-q4_k_m")
PASSES = (1, 2, 3, 5, 9)
SYSTEM = ("You are a friendly voice assistant on a phone call. Answer in one to three short, natural "
          "sentences. When the caller asks for something, confirm it back in their own words.")
TURNS = [
    ("question", "What is the capital of France?"),
    ("question", "How many days are there in a leap year?"),
    ("question", "Why is the sky blue?"),
    ("repeat-back", "I'd like two large pepperoni pizzas, one garlic bread and a bottle of cola, delivered to "
                    "42 Baker Street, apartment 5."),
    ("repeat-back", "Please book a table for four people at seven thirty tonight under the name Johnson."),
    ("repeat-back", "My phone number is 555 867 5309 and my email is jane dot doe at example dot com."),
]


def median_ms(samples: list[float]) -> float:
    return round(1000 * statistics.median(samples), 1)


def costs(lm: CausalLM, repeats: int) -> dict[str, Any]:
    """Prefill 200 tokens; then passes over k tokens after that 200-token context."""
    prompt = [(1000 + 7 * i) % 20000 + 200 for i in range(200)]
    prefill = []
    for _ in range(max(2, repeats // 2)):
        state = lm.new_state()
        started = time.perf_counter()
        lm.extend(state, prompt)
        prefill.append(time.perf_counter() - started)
        lm.release(state)
    state = lm.new_state()
    lm.extend(state, prompt)
    passes: dict[str, float] = {}
    for k in PASSES:
        seconds = []
        for _ in range(repeats + 1):
            started = time.perf_counter()
            lm.extend(state, prompt[:k], keep_logits=k)
            seconds.append(time.perf_counter() - started)
            lm.truncate(state, len(prompt))
        passes[str(k)] = median_ms(seconds[1:])
    lm.release(state)
    return {"prefill_200_ms": median_ms(prefill), "pass_ms": passes,
            "pass_over_one": {k: round(v / passes["1"], 2) for k, v in passes.items()}}


def generate(strategy: SpeculativeStrategy, session: SpecSession, prompt: list[int], method: str,
             max_tokens: int) -> tuple[list[int], GenerationStats, float]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, seed=0, speculation=Speculation(method))
    stats = GenerationStats()
    state = strategy.lm.new_state()
    loop = GenerationLoop(strategy.lm, session.decoder(state, params, stats), prompt, params, stats)
    loop.step()
    first = time.perf_counter()
    while not loop.done:
        loop.step()
    end = time.perf_counter()
    strategy.lm.release(state)
    tps = (len(loop.produced) - 1) / (end - first) if len(loop.produced) > 1 and end > first else 0.0
    return loop.produced, stats, tps


def speculation(target: CausalLM, draft: CausalLM | None, max_tokens: int, rounds: int) -> dict[str, Any]:
    """Each round is one call per method (its session, K controller and draft cache kept across the
    turns, as in the service); the methods take turns within a round, so that a slow moment of the
    machine hits them alike, and each turn's figure is its median over the rounds."""
    strategy = SpeculativeStrategy(target, MonotonicClock(), draft=draft)
    verify = [round(1000 * (v or 0), 1) for v in strategy.costs["ngram"].verify]
    print(f"    calibrated: verify 1..{len(verify)} tokens {verify} ms"
          + (f", draft step {1000 * (strategy.costs['draft_model'].draft_step or 0):.1f} ms" if draft else ""))
    methods = ["off", "ngram"] + (["draft_model"] if draft else [])
    prompts = [target.chat_tokens([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
               for _, q in TURNS]
    generate(strategy, strategy.new_session(), prompts[0], "off", max_tokens)  # warm the weights' pages
    tps: dict[tuple[int, str], list[float]] = {}
    last: dict[tuple[int, str], tuple[list[int], GenerationStats]] = {}
    for r in range(rounds):
        sessions = {m: strategy.new_session() for m in methods}
        for i, prompt in enumerate(prompts):
            order = methods[r % len(methods):] + methods[: r % len(methods)]
            for method in order:
                tokens, stats, speed = generate(strategy, sessions[method], prompt, method, max_tokens)
                tps.setdefault((i, method), []).append(speed)
                last[(i, method)] = (tokens, stats)
        for session in sessions.values():
            session.close()
    rows: list[dict[str, Any]] = []
    for i, (category, question) in enumerate(TURNS):
        plain_tps = statistics.median(tps[(i, "off")])
        for method in methods:
            tokens, stats = last[(i, method)]
            speed = statistics.median(tps[(i, method)])
            ratio = speed / plain_tps if plain_tps else 0.0
            same = tokens == last[(i, "off")][0]
            rows.append({"category": category, "question": question, "method": method,
                         "decode_tps": round(speed, 2), "decode_tps_rounds": [round(t, 2) for t in tps[(i, method)]],
                         "ratio_to_plain": round(ratio, 3), "same_as_plain": same, "tokens": len(tokens),
                         "k_chosen": sorted(set(stats.k_chosen)), **{
                             k: v for k, v in stats.as_dict().items()
                             if k in ("drafts", "draft_tokens", "accepted_tokens", "acceptance_rate")}})
            print(f"    {category:11s} {method:11s} {speed:6.1f} tok/s  x{ratio:4.2f}  drafts {stats.drafts:3d} "
                  f"accepted {stats.accepted_tokens:3d}/{stats.draft_tokens:3d}  K {sorted(set(stats.k_chosen))} "
                  f"{'same' if same else 'DIFFERS'}", flush=True)
    summary = {}
    for method in methods[1:]:
        mine = [r for r in rows if r["method"] == method]
        summary[method] = {
            "median_ratio": round(statistics.median(r["ratio_to_plain"] for r in mine), 3),
            "min_ratio": round(min(r["ratio_to_plain"] for r in mine), 3),
            "median_ratio_repeat_back": round(statistics.median(
                r["ratio_to_plain"] for r in mine if r["category"] == "repeat-back"), 3),
            "same_as_plain": f"{sum(r['same_as_plain'] for r in mine)}/{len(mine)}",
        }
    plain = [r["decode_tps"] for r in rows if r["method"] == "off"]
    return {"calibrated_verify_ms": verify, "rounds": rounds,
            "plain_decode_tps_median": round(statistics.median(plain), 2), "summary": summary, "turns": rows}


def load(runtime: str, ref: str, threads: int) -> CausalLM:
    from models.packs.cache import resolve_gguf, resolve_torch

    if runtime == "llama.cpp":
        from models.llm.llama_cpp_lm import LlamaCppLM

        return LlamaCppLM(resolve_gguf(ref), threads=threads, context_tokens=2048, sequences=4, name=ref)
    from models.llm.torch_lm import TorchLM

    kind = runtime.removeprefix("torch-")
    quantize = "int8" if kind == "int8" else "none"
    dtype = "float32" if kind in ("int8", "float32") else "bfloat16"
    return TorchLM.load(resolve_torch(ref), dtype=dtype, threads=threads, quantize=quantize)


def available_runtimes() -> list[str]:
    found = []
    try:
        import llama_cpp  # noqa: F401

        found.append("llama.cpp")
    except ImportError:
        pass
    try:
        import torch  # noqa: F401

        found += ["torch-float32", "torch-int8"]
        if any(f in cpu.flags() for f in ("avx512_bf16", "amx_bf16")):
            found.append("torch-bfloat16")
    except ImportError:
        pass
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtimes", default=",".join(available_runtimes()))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--threads", type=int, default=cpu.cores())
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="calls per method, taking turns")
    parser.add_argument("--no-speculation", action="store_true", help="only the cost table")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()

    header: dict[str, Any] = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                              "cpu": cpu.describe(), "threads": args.threads}
    if "llama.cpp" in args.runtimes:
        from models.llm.llama_cpp_lm import system_info

        header["llama_cpp"] = system_info().strip()
    print(f"CPU: {header['cpu']}\nthreads: {args.threads}\n" + (f"llama.cpp: {header.get('llama_cpp')}\n"
                                                                   if "llama_cpp" in header else ""))
    results: list[dict[str, Any]] = []
    for runtime in args.runtimes.split(","):
        loaded: dict[str, CausalLM] = {}
        for ref in args.models.split(","):
            lm = load(runtime, ref, args.threads)
            loaded[ref] = lm
            row = {"runtime": runtime, "model": ref, "precision": lm.precision, **costs(lm, args.repeats)}
            print(f"{runtime:15s} {ref:22s} {lm.precision:18s} prefill 200: {row['prefill_200_ms']:8.1f} ms  "
                  f"passes (ms) {row['pass_ms']}  (x one token: {row['pass_over_one']})", flush=True)
            if runtime == "llama.cpp" and not args.no_speculation:
                draft = loaded.get(MODELS[0]) if ref == MODELS[1] else None
                print(f"  {ref}: plain vs speculative, temperature 0, {args.max_tokens} tokens at most"
                      + (f", draft {MODELS[0]}" if draft else ""))
                row["speculation"] = speculation(lm, draft, args.max_tokens, args.rounds)
            results.append(row)
            if runtime != "llama.cpp":
                loaded.pop(ref)  # PyTorch models are big in float: one at a time
        loaded.clear()

    print("\n| runtime | model | precision | prefill 200 | 1 token | 2 | 3 | 5 | 9 tokens, one pass | plain tok/s |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        p = r["pass_ms"]
        tps = r.get("speculation", {}).get("plain_decode_tps_median", "")
        print(f"| {r['runtime']} | {r['model']} | {r['precision']} | {r['prefill_200_ms']} | {p['1']} | {p['2']} | "
              f"{p['3']} | {p['5']} | {p['9']} | {tps} |")
    spec_rows = [r for r in results if "speculation" in r]
    if spec_rows:
        print("\n| model (llama.cpp) | method | median x plain | slowest turn | repeat-back median | T=0 same |")
        print("| --- | --- | ---: | ---: | ---: | ---: |")
        for r in spec_rows:
            for method, s in r["speculation"]["summary"].items():
                print(f"| {r['model']} | {method} | {s['median_ratio']} | {s['min_ratio']} | "
                      f"{s['median_ratio_repeat_back']} | {s['same_as_plain']} |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"header": header, "results": results}, indent=1))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
