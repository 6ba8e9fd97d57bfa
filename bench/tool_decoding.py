"""Benchmark: writing a tool call, plain decoding against the grammar with jump-forward and speculation.

For each request of bench/tool_set.py (tools shown in the prompt, tool_choice "auto", temperature 0)
the same model writes its reply these ways in one run:
- free: no grammar at all (what the model writes unguided: for Qwen2.5-Coder a markdown block or
  "{{...}}}", for reference only);
- plain: plain decoding under the grammar, one model step per token: the tokens the grammar forces
  are the same as jump-forward's, each paid for with a step (the baseline: the same call, the slow
  way);
- jump: the grammar's forced tokens emitted without a model step (jump-forward);
- jump+ngram, jump+draft (the 0.5B drafting for the 1.5B): the same, speculating.
The prompt (system, tools, request) is in the cache before the clock starts, so the time is the
call's own. Printed: the time to write the reply, tokens/s (the tokens of jump-forward's output over
each mode's time, so every mode is counted on the same tokens), the speed ratio to plain per request
(then the median), forced tokens' share, and whether each call equals plain's (name and arguments).

    .venv/bin/python bench/tool_decoding.py --json docs/bench/tool_decoding.json
    .venv/bin/python bench/tool_decoding.py --tools spoken --json docs/bench/tool_decoding_spoken.json

`--tools written` (the default): tool_set.py's TOOLS, free-text strings, and its 12 REQUESTS; `--tools
spoken`: the schemas of the labelled spoken set (SPOKEN_TOOLS: enums, patterns) and the written text
of its tool requests.
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

from tool_set import REQUESTS, SPOKEN, SPOKEN_TOOLS, SYSTEM, TOOLS  # bench/tool_set.py, beside this script

from core.clock import MonotonicClock
from models import cpu
from models.llm.generation import GenerationLoop, PlainDecoder
from models.llm.llama_cpp_lm import LlamaCppLM, system_info
from models.llm.lm import CausalLM
from models.llm.tool_calls import parse_tools
from models.llm.tool_guide import ReplyReader, ToolGuide
from models.packs.cache import resolve_gguf
from models.protocols import GenerationStats, SamplingParams, Speculation
from models.speculative.decoder import SpeculativeStrategy

MODES = ("free", "plain", "jump", "jump+ngram", "jump+draft")


def reply(lm: CausalLM, strategy: SpeculativeStrategy, prompt: list[int], mode: str, max_tokens: int,
          declared: list[dict[str, Any]]) -> dict[str, Any]:
    tools = parse_tools(declared)
    assert tools is not None
    method = {"free": "off", "plain": "off", "jump": "off", "jump+ngram": "ngram", "jump+draft": "draft_model"}[mode]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, speculation=Speculation(method))
    guide = ToolGuide(lm, tools, 1, jump_forward=mode != "plain") if mode != "free" else None
    state = lm.new_state()
    session = strategy.new_session() if method != "off" else None  # closed after: it holds a draft sequence
    try:
        lm.prefill(state, prompt[:-1])  # the prompt's cache, outside the clock
        stats = GenerationStats()
        decoder = (PlainDecoder(lm, state, params, stats, guide) if session is None
                   else session.decoder(state, params, stats, guide))
        loop = GenerationLoop(lm, decoder, prompt, params, stats)
        started = time.perf_counter()
        while not loop.done:
            loop.step()
        seconds = time.perf_counter() - started
    finally:
        lm.release(state)
        if session is not None:
            session.close()
    produced = loop.produced
    call: Any = None
    if guide is not None:
        reader = ReplyReader(guide)
        _, calls = reader.push(produced)
        call = [(c.name, json.loads(c.arguments)) for c in calls]
    else:
        text = lm.decode(produced).replace("<tool_call>", "").replace("</tool_call>", "").strip()
        try:
            body = json.loads(text)
            call = [(body["name"], body["arguments"])]
        except (ValueError, KeyError, TypeError):
            call = text
    return {"mode": mode, "tokens": len(produced), "seconds": seconds, "tokens_per_second": len(produced) / seconds,
            "forced": stats.forced_tokens, "drafted": stats.draft_tokens, "accepted": stats.accepted_tokens,
            "ids": produced, "call": call}


def chosen(which: str) -> tuple[list[dict[str, Any]], list[tuple[str, Any]]]:
    """The tools and requests of `--tools`."""
    if which == "spoken":
        return SPOKEN_TOOLS, [(s.text, s.call) for s in SPOKEN if s.kind == "tool"]
    return TOOLS, list(REQUESTS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct-q4_k_m")
    parser.add_argument("--threads", type=int, default=cpu.cores())
    parser.add_argument("--max-tokens", type=int, default=80)
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--tools", choices=("written", "spoken"), default="written",
                        help="which tools and requests (see above)")
    parser.add_argument("--sampled", type=int, default=0, metavar="N",
                        help="instead: N generations at temperature 1.0 on --target over varied prompts, counting "
                             "malformed calls (arguments that are not JSON or break the schema)")
    args = parser.parse_args()
    if args.sampled:
        sampled(args)
        return

    print(f"CPU: {cpu.describe()}\n{args.threads} threads; llama.cpp: {system_info()}")
    target = LlamaCppLM(resolve_gguf(args.target), threads=args.threads, context_tokens=2048, sequences=4,
                        name=args.target)
    draft = LlamaCppLM(resolve_gguf(args.draft), threads=args.threads, context_tokens=2048, sequences=4,
                       name=args.draft)
    strategy = SpeculativeStrategy(target, MonotonicClock(), method="ngram", draft=draft)
    declared, requests = chosen(args.tools)
    print(f"target {args.target} ({target.precision}), draft {args.draft} ({draft.precision}); temperature 0; "
          f"tools ({args.tools}): {', '.join(t['name'] for t in declared)}; {len(requests)} requests\n")
    offered = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in declared]
    system = target.chat_tokens([{"role": "system", "content": SYSTEM}], False, offered)
    target.remember_prefix(system, pinned=True)
    runs: list[dict[str, Any]] = []
    for i, (request, expected) in enumerate(requests):
        prompt = target.chat_tokens([{"role": "system", "content": SYSTEM}, {"role": "user", "content": request}],
                                    True, offered)
        by_mode = {mode: reply(target, strategy, prompt, mode, args.max_tokens, declared) for mode in MODES}
        for mode, run in by_mode.items():
            run.update(request=i, same_as_plain=run["call"] == by_mode["plain"]["call"],
                       ratio=by_mode["plain"]["seconds"] / run["seconds"],
                       tokens_per_second=by_mode["jump"]["tokens"] / run["seconds"])
            runs.append(run)
            print(f"#{i:2d} {mode:10s} {run['tokens']:3d} tok {run['seconds'] * 1000:6.0f} ms "
                  f"{run['tokens_per_second']:6.1f} tok/s "
                  f"x{run['ratio']:.2f} forced {run['forced']:2d} accepted {run['accepted']:2d}/{run['drafted']:2d} "
                  f"same {'yes' if run['same_as_plain'] else 'NO '} {run['call']}")
        print(f"    expected {expected}")

    print("\nmode       median ms  median tok/s  median speed ratio to plain  forced share  calls equal to plain's")
    summary = {}
    for mode in MODES:
        group = [r for r in runs if r["mode"] == mode]
        forced = sum(r["forced"] for r in group) / max(1, sum(r["tokens"] for r in group))
        summary[mode] = {"median_ms": statistics.median(r["seconds"] for r in group) * 1000,
                         "median_tokens_per_second": statistics.median(r["tokens_per_second"] for r in group),
                         "median_ratio": statistics.median(r["ratio"] for r in group), "forced_share": forced,
                         "same_as_plain": sum(r["same_as_plain"] for r in group), "requests": len(group)}
        s = summary[mode]
        print(f"{mode:10s} {s['median_ms']:9.0f}  {s['median_tokens_per_second']:12.1f}  {s['median_ratio']:27.2f}  "
              f"{forced:12.0%}  {s['same_as_plain']}/{len(group)}")
    if args.json:
        for r in runs:
            r.pop("ids")
        Path(args.json).write_text(json.dumps({
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "cpu": cpu.describe(),
            "threads": args.threads, "target": args.target, "draft": args.draft, "precision": target.precision,
            "tools": args.tools, "summary": summary, "runs": runs}, indent=1, default=str))


def sampled(args: argparse.Namespace) -> None:
    """N replies at temperature 1.0 (top_k 0, top_p 1: the whole distribution) over the requests of
    `--tools` (tool_set.py), each with a few words changed by the seed, with plain and n-gram decoding in turn."""
    import jsonschema

    print(f"CPU: {cpu.describe()}\n{args.threads} threads")
    lm = LlamaCppLM(resolve_gguf(args.target), threads=args.threads, context_tokens=2048, sequences=4,
                    name=args.target)
    declared, requests = chosen(args.tools)
    tools = parse_tools(declared)
    assert tools is not None
    schemas = {t.name: t.parameters for t in tools.tools}
    offered = [t.as_openai() for t in tools.tools]
    lm.remember_prefix(lm.chat_tokens([{"role": "system", "content": SYSTEM}], False, offered), pinned=True)
    strategy = SpeculativeStrategy(lm, MonotonicClock(), method="ngram")
    openers = ["", "Hi, ", "Hello there. ", "Um, ", "Quick question: ", "Sorry, ", "Good morning! ", "Yes, "]
    extra = ["Is it going to rain tomorrow?", "Tell me a joke.", "What's your name?", "Thanks, that's all."]
    prompts = [r for r, _ in requests] + extra
    counts = {"generations": 0, "calls": 0, "malformed": 0, "cut_at_limit": 0, "text_only": 0}
    failures: list[str] = []
    started = time.perf_counter()
    for i in range(args.sampled):
        request = openers[(i // len(prompts)) % len(openers)] + prompts[i % len(prompts)]
        method = "off" if i % 2 == 0 else "ngram"
        params = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=args.max_tokens, seed=i,
                                speculation=Speculation(method))
        prompt = lm.chat_tokens([{"role": "system", "content": SYSTEM}, {"role": "user", "content": request}],
                                True, offered)
        guide = ToolGuide(lm, tools, 64)
        state = lm.new_state()
        stats = GenerationStats()
        decoder = (PlainDecoder(lm, state, params, stats, guide) if method == "off"
                   else strategy.new_session().decoder(state, params, stats, guide))
        loop = GenerationLoop(lm, decoder, prompt, params, stats)
        reader = ReplyReader(guide)
        calls = []
        try:
            while not loop.done:
                calls += reader.push(loop.step().tokens)[1]
        except Exception as exc:  # a call the reader could not parse: malformed
            counts["malformed"] += 1
            failures.append(f"#{i}: {exc}")
        finally:
            lm.release(state)
        counts["generations"] += 1
        counts["calls"] += len(calls)
        counts["text_only"] += not calls
        if stats.finish_reason == "length" and reader.state.mode == "call":
            counts["cut_at_limit"] += 1
        for call in calls:
            try:
                jsonschema.validate(json.loads(call.arguments), schemas[call.name])
            except (ValueError, jsonschema.ValidationError) as exc:
                counts["malformed"] += 1
                failures.append(f"#{i} {call.name}: {exc}")
        if (i + 1) % 50 == 0:
            print(f"  {i + 1}/{args.sampled} ({time.perf_counter() - started:.0f} s): {counts}", flush=True)
            if args.json:  # so far, in case the run is stopped
                write_sampled(args, lm.precision, counts, failures)
    print(f"\n{args.target} ({lm.precision}), temperature 1.0, top_k 0, top_p 1.0, max {args.max_tokens} tokens, "
          f"plain and n-gram in turn: {counts}")
    for failure in failures[:20]:
        print("  ", failure)
    if args.json:
        write_sampled(args, lm.precision, counts, failures)


def write_sampled(args: argparse.Namespace, precision: str, counts: dict[str, int], failures: list[str]) -> None:
    Path(args.json).write_text(json.dumps({
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "cpu": cpu.describe(),
        "threads": args.threads, "model": args.target, "precision": precision, "max_tokens": args.max_tokens,
        "tools": args.tools,
        "asked": args.sampled, "counts": counts, "failures": failures}, indent=1))


if __name__ == "__main__":
    main()
