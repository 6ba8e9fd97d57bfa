"""Tool calls on the real embedded model (Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF on llama.cpp):
requests get well-formed calls through the conversation API, sampled calls are never malformed,
and greedy n-gram speculation under the grammar writes what plain decoding writes (or parts at a
near-tie of the allowed tokens' logits, as in test_llama_cpp.py: llama.cpp rounds a pass over
several tokens differently from a pass over one)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from core.clock import MonotonicClock
from models.llm.llama_cpp_lm import LlamaCppLM
from models.llm.llm_embedded import EmbeddedLLM
from models.llm.tool_calls import ToolCall, Tools, parse_tools
from models.llm.tool_guide import ToolGuide
from models.packs.cache import resolve_gguf
from models.protocols import (
    ChatMessage,
    GenerationDone,
    SamplingParams,
    Speculation,
    TextDelta,
    ToolCallDelta,
    ToolCallOutput,
)
from models.speculative.decoder import SpeculativeStrategy
from tests.models.spec_helpers import generate

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from tool_set import REQUESTS, SYSTEM, TOOLS

pytestmark = pytest.mark.slow
PACK = "qwen2.5-coder-0.5b-instruct-q4_k_m"
NEAR_TIE = 1.0  # logits, as in test_llama_cpp.py


@pytest.fixture(scope="module")
def lm() -> Iterator[LlamaCppLM]:
    model = LlamaCppLM(resolve_gguf(PACK), threads=2, context_tokens=2048, sequences=4, name=PACK)
    tools = parse_tools(TOOLS)
    assert tools is not None
    system = model.chat_tokens([{"role": "system", "content": SYSTEM}], False, [t.as_openai() for t in tools.tools])
    model.remember_prefix(system, pinned=True)  # each prompt then computes only its request
    yield model
    model.close()


@pytest.fixture(scope="module")
def tools() -> Tools:
    parsed = parse_tools(TOOLS)
    assert parsed is not None
    return parsed


def check(call: ToolCall, tools: Tools) -> dict[str, Any]:
    schema = next(t.parameters for t in tools.tools if t.name == call.name)
    arguments = json.loads(call.arguments)
    jsonschema.validate(arguments, schema)
    return arguments  # type: ignore[no-any-return]


def ask(llm: EmbeddedLLM, request: str, tools: Tools, params: SamplingParams) -> tuple[str, list[ToolCall], str]:
    async def run() -> tuple[str, list[ToolCall], str]:
        conversation = llm.conversation()
        text, calls, finish = "", [], ""
        pieces: dict[str, str] = {}
        async for out in conversation.stream([ChatMessage("system", SYSTEM), ChatMessage("user", request)],
                                             params, tools):
            if isinstance(out, ToolCallOutput):
                calls.append(out.call)
            elif isinstance(out, ToolCallDelta):
                pieces[out.call_id] = pieces.get(out.call_id, "") + out.delta
            elif isinstance(out, GenerationDone):
                finish = out.stats.finish_reason
            else:
                text += out.text
        await conversation.aclose()
        # each call's arguments also came in pieces before it, as written; they join to them exactly
        assert all(pieces.get(c.call_id) == c.arguments for c in calls), (pieces, calls)
        return text, calls, finish

    return asyncio.run(run())


def test_spoken_requests_get_well_formed_calls_with_the_callers_details(lm: LlamaCppLM, tools: Tools) -> None:
    llm = EmbeddedLLM(lm, MonotonicClock())
    try:
        _, calls, finish = ask(llm, "Where is my order 4 5 1 2?", tools, SamplingParams(temperature=0, max_tokens=60))
        assert finish == "tool_calls" and [c.name for c in calls] == ["order_status"]
        assert check(calls[0], tools)["order_number"].replace(" ", "") == "4512"
        _, calls, _ = ask(llm, "Please cancel my appointment on March third.", tools,
                          SamplingParams(temperature=0, max_tokens=60))
        assert [c.name for c in calls] == ["cancel_appointment"]
        check(calls[0], tools)
        text, calls, finish = ask(llm, "Hi there, how are you doing today?", tools,
                                  SamplingParams(temperature=0, max_tokens=40))
        assert calls == [] and finish == "stop" and text
    finally:
        asyncio.run(llm.aclose())


def test_sampled_calls_at_temperature_one_are_never_malformed(lm: LlamaCppLM, tools: Tools) -> None:
    """bench/tool_decoding.py --sampled runs the same over 1 000 generations."""
    llm = EmbeddedLLM(lm, MonotonicClock())
    made = 0
    try:
        for seed, (request, _) in enumerate(REQUESTS):
            params = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=60, seed=seed)
            _, calls, finish = ask(llm, request, tools, params)
            for call in calls:
                check(call, tools)
            made += len(calls)
            assert finish in ("tool_calls", "stop", "length")
    finally:
        asyncio.run(llm.aclose())
    assert made >= len(REQUESTS) // 2  # most of these requests are for a tool


def test_greedy_ngram_speculation_under_the_grammar_writes_what_plain_decoding_writes(
        lm: LlamaCppLM, tools: Tools, record_property: pytest.RecordProperty) -> None:
    strategy = SpeculativeStrategy(lm, MonotonicClock(), calibrate=False)
    gaps = []
    for request, _ in REQUESTS[:6]:
        prompt = lm.chat_tokens([{"role": "system", "content": SYSTEM}, {"role": "user", "content": request}],
                                True, [t.as_openai() for t in tools.tools])
        outputs = {}
        for method in ("off", "ngram"):
            params = SamplingParams(temperature=0, max_tokens=60, speculation=Speculation(method, 4))
            session = strategy.new_session()
            state = lm.new_state()
            guide = ToolGuide(lm, tools, 1)
            original = session.decoder
            session.decoder = lambda s, p, st, g=guide, o=original: o(s, p, st, g)  # type: ignore[method-assign]
            outputs[method], _, state = generate(strategy, prompt, params, session, state)
            lm.release(state)
        plain, fast = outputs["off"], outputs["ngram"]
        parting = next((i for i, (a, b) in enumerate(zip(plain, fast, strict=False)) if a != b), None)
        if parting is None:
            assert plain == fast, request
            continue
        # the two best allowed tokens at the parting, from plain decoding's own logits (one token a step)
        guide = ToolGuide(lm, tools, 2)
        position = guide.start()
        for token in plain[:parting]:
            nxt = guide.advance(position, token)
            assert nxt is not None
            position = nxt
        check_state = lm.new_state()
        logits, _ = lm.prefill(check_state, prompt + plain[:parting])
        lm.release(check_state)
        masked = guide.mask(position, logits)
        top2 = np.sort(masked[np.isfinite(masked)])[-2:]
        gap = float(top2[1] - top2[0])
        gaps.append((request, parting, round(gap, 3)))
        assert gap <= NEAR_TIE, (request, parting, gap, lm.decode(plain), lm.decode(fast))
    record_property("partings (request, token, allowed logit gap)", gaps)


def test_the_follow_up_answers_from_the_tools_result_and_computes_little_more_than_the_result() -> None:
    """On Qwen2.5-Coder-1.5B-Instruct (Q4_K_M): after the call and its result, the reply says what
    the result says (each result is said with the tool that gave it, see llm_embedded); and with
    the prompt prefilled up to the result while the tool ran (prepare(open_last=True)), the
    follow-up computes only the result's tokens and the template's few closing ones."""
    pack = "qwen2.5-coder-1.5b-instruct-q4_k_m"
    model = LlamaCppLM(resolve_gguf(pack), threads=2, context_tokens=2048, sequences=2, name=pack)
    llm = EmbeddedLLM(model, MonotonicClock())
    tools = parse_tools(TOOLS)
    assert tools is not None
    call = ToolCall("call_1", "order_status", '{"order_number": "4512"}')
    history = [ChatMessage("system", SYSTEM), ChatMessage("user", "Where is my order 4512?"),
               ChatMessage("assistant", "", (call,)),
               ChatMessage("tool", json.dumps({"status": "shipped", "shipped_on": "Monday"}), tool_call_id="call_1")]

    async def follow_up() -> tuple[str, list[ToolCall], int]:
        conversation = llm.conversation()
        await conversation.prepare([*history[:-1], replace(history[-1], content="")], tools, open_last=True)
        text, calls, computed = "", [], -1
        async for out in conversation.stream(history, SamplingParams(temperature=0, max_tokens=40), tools):
            if isinstance(out, ToolCallOutput):
                calls.append(out.call)
            elif isinstance(out, TextDelta):
                text += out.text
            elif isinstance(out, GenerationDone):
                computed = out.stats.prefill_tokens
        await conversation.aclose()
        return text, calls, computed

    try:
        text, calls, computed = asyncio.run(follow_up())
        result = len(model.encode(history[-1].content))
    finally:
        asyncio.run(llm.aclose())
        model.close()
    assert calls == [] and "monday" in text.lower(), text
    # "\nAnswer the caller from this result.\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    # and the one token left open: about 18
    assert result <= computed <= result + 20, (computed, result)
