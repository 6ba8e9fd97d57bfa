"""Tool declarations, the JSON Schema automaton, and the guide that keeps a reply's tool calls
well-formed, in plain and speculative decoding (on FakeByteLM, a fake LM whose logits are exact
functions of the tokens, so plain and speculative outputs can be compared token for token)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.clock import MonotonicClock
from core.errors import ConfigError
from models.llm.generation import GenerationLoop, PlainDecoder
from models.llm.json_nfa import arguments_nfa
from models.llm.json_pattern import ends_anchored
from models.llm.tool_calls import ToolCall, Tools, parse_tools
from models.llm.tool_guide import ReplyReader, ToolGuide
from models.protocols import GenerationStats, SamplingParams, Speculation
from models.speculative.decoder import SpeculativeStrategy
from tests.models.fake_lm import FakeByteLM

BOOKING = {
    "type": "object",
    "properties": {
        "party_size": {"type": "integer"},
        "time": {"type": "string"},
        "day": {"type": "string", "enum": ["today", "tomorrow"]},
        "outdoor": {"type": "boolean"},
    },
    "required": ["party_size", "time"],
}
ORDER = {"type": "object", "properties": {"order_number": {"type": "string"}, "items": {
    "type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string"}, "qty": {"type": "number"}},
                               "required": ["sku"]}}}, "required": ["order_number"]}
TOOLS = [{"type": "function", "name": "book_table", "description": "Book a table.", "parameters": BOOKING},
         {"type": "function", "function": {"name": "order_status", "parameters": ORDER}}]


def accepts(schema: dict[str, Any], value: Any) -> bool:
    nfa = arguments_nfa(schema, "test")
    return nfa.accepts(nfa.walk(nfa.start(), json.dumps(value).encode()))


# -- the automaton -------------------------------------------------------------------------------
def test_valid_arguments_in_the_canonical_layout_are_accepted() -> None:
    assert accepts(BOOKING, {"party_size": 2, "time": "19:00"})
    assert accepts(BOOKING, {"party_size": -10, "time": "7 \"pm\"\n", "day": "tomorrow", "outdoor": False})
    assert accepts(ORDER, {"order_number": "A-1", "items": [{"sku": "x", "qty": 1.5e3}, {"sku": "y"}]})
    assert accepts(ORDER, {"order_number": "Zoë", "items": []})


@pytest.mark.parametrize("value", [
    {"time": "19:00"},  # a required member missing
    {"party_size": "2", "time": "19:00"},  # a string for an integer
    {"party_size": 2.5, "time": "19:00"},
    {"party_size": 2, "time": "19:00", "day": "friday"},  # not in the enum
    {"party_size": 2, "time": "19:00", "smoking": True},  # not declared
    {"time": "19:00", "party_size": 2},  # another order than declared
])
def test_arguments_the_schema_does_not_allow_are_refused(value: dict[str, Any]) -> None:
    assert not accepts(BOOKING, value)


def test_the_layout_fixes_what_it_can_so_it_is_forced() -> None:
    nfa = arguments_nfa(BOOKING, "test")
    assert nfa.forced(nfa.start()) == b'{"party_size": '
    after_time = nfa.walk(nfa.start(), b'{"party_size": 2, "time": "7"')
    assert nfa.forced(after_time) == b""  # "}" or ", " and the next optional member: a choice


@pytest.mark.parametrize("schema, word", [
    ({"type": "object", "properties": {"a": {"$ref": "#/x"}}}, "$ref"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=a)b"}}}, "lookarounds"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "(a)\\1"}}}, "backreferences"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "a{1,500}"}}}, "over 64"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "a^b"}}}, "start"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "[é]"}}}, "outside ASCII"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "(ab"}}}, "not closed"),
    ({"type": "object", "properties": {"a": {"type": "date"}}}, "date"),
    ({"type": "object", "required": ["b"], "properties": {"a": {"type": "string"}}}, "'b'"),
])
def test_schemas_it_cannot_follow_are_refused_by_name(schema: dict[str, Any], word: str) -> None:
    with pytest.raises(ConfigError, match=word.replace("$", r"\$")):
        arguments_nfa(schema, "tool 'x' parameters")


PATTERNS = ["^[0-9]+$", "^([01][0-9]|2[0-3]):[0-5][0-9]$", "^[A-Z]{2}-\\d{3,5}$", "ab", "^a.c", "x$",
            '^[^ "]*$', "^(?:\\w+ )*\\w+$", "^\\S{2}\\s?\\S$", "^[a-c\\d_]{0,3}z?$", '^\\"q\\\\$', "^é+$"]


def accepts_string(pattern: str, text: str) -> bool:
    """In the canonical layout: characters outside ASCII as themselves, not as \\u escapes."""
    nfa = arguments_nfa({"type": "string", "pattern": pattern}, "test")
    return nfa.accepts(nfa.walk(nfa.start(), json.dumps(text, ensure_ascii=False).encode()))


def matches(pattern: str, text: str) -> bool:
    """ECMA-262's answer through Python's re: \\d \\w \\s are ASCII there, and $ is the very end."""
    python = pattern[:-1] + "\\Z" if ends_anchored(pattern) else pattern
    return re.search(python, text, re.ASCII) is not None


@pytest.mark.parametrize("pattern, anchored", [("a$", True), ("a\\$", False), ("a\\\\$", True), ("a", False),
                                               ("$", True)])
def test_only_an_unescaped_dollar_at_the_end_anchors(pattern: str, anchored: bool) -> None:
    assert ends_anchored(pattern) is anchored  # the oracle below relies on it too


@pytest.mark.parametrize("pattern", PATTERNS)
@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet='ab019:AZ-xz _"\\\n\té.', max_size=7))
def test_a_string_pattern_accepts_exactly_what_the_regular_expression_matches(pattern: str, text: str) -> None:
    assert accepts_string(pattern, text) == matches(pattern, text)


@pytest.mark.parametrize("pattern, value", [
    ("^[0-9]+$", "41773"), ("^([01][0-9]|2[0-3]):[0-5][0-9]$", "21:00"), ("^[A-Z]{2}-\\d{3,5}$", "AB-1234"),
    ("^(?:\\w+ )*\\w+$", "two words"), ('^[^ "]*$', "naïve"), ("^é+$", "éé"), ("x$", 'a "quoted" x'),
])
def test_values_that_match_are_accepted(pattern: str, value: str) -> None:  # what the random texts rarely hit
    assert matches(pattern, value) and accepts_string(pattern, value)


def test_a_pattern_forces_what_it_fixes() -> None:
    nfa = arguments_nfa({"type": "object", "properties": {"code": {"type": "string", "pattern": "^AB-[0-9]{2}$"}},
                         "required": ["code"]}, "test")
    assert nfa.forced(nfa.start()) == b'{"code": "AB-'
    assert nfa.forced(nfa.walk(nfa.start(), b'{"code": "AB-12')) == b'"}'


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["party_size", "time", "day",
                                                                                 "outdoor", "x"]), inner, max_size=4),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_whatever_the_automaton_accepts_the_schema_allows(value: Any) -> None:
    for schema in (BOOKING, ORDER):
        if accepts(schema, value):
            jsonschema.validate(value, schema)


# -- declarations --------------------------------------------------------------------------------
def test_both_openai_shapes_and_every_choice_are_read() -> None:
    tools = parse_tools(TOOLS, {"type": "function", "function": {"name": "order_status"}})
    assert tools is not None and [t.name for t in tools.tools] == ["book_table", "order_status"]
    assert tools.choice == "order_status" and tools.must_call() == "order_status"
    assert parse_tools(TOOLS, "required").must_call() == ""  # type: ignore[union-attr]
    assert not parse_tools(TOOLS, "none").callable  # type: ignore[union-attr]
    assert parse_tools(None) is None


def test_a_tool_says_it_is_read_only_in_its_own_field_or_as_mcp_does() -> None:
    own = {**TOOLS[0], "name": "book", "read_only": True}
    mcp = {"type": "function", "function": {"name": "look", "annotations": {"readOnlyHint": True}}}
    plain, own, mcp = parse_tools([TOOLS[0], own, mcp]).tools  # type: ignore[union-attr]
    assert (plain.read_only, own.read_only, mcp.read_only) == (False, True, True)


@pytest.mark.parametrize("tools, choice, message", [
    ([{"type": "retrieval"}], "auto", "only"),
    ([{"type": "function", "name": "has space"}], "auto", "name must be"),
    ([TOOLS[0], TOOLS[0]], "auto", "unique"),
    (TOOLS, "sometimes", "tool_choice must be"),
    (TOOLS, {"type": "function", "name": "fly"}, "not among the tools"),
    (None, "required", "needs tools"),
    ([{"type": "function", "name": "x", "parameters": {"type": "array"}}], "auto", "type object"),
    ([{"type": "function", "name": "x", "read_only": "yes"}], "auto", "read_only must be true or false"),
    ([{"type": "function", "name": "x", "annotations": []}], "auto", "annotations must be an object"),
])
def test_bad_declarations_are_refused_with_what_is_wrong(tools: Any, choice: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_tools(tools, choice)


# -- the guide, decoding -------------------------------------------------------------------------
def generate(lm: FakeByteLM, tools: Tools, params: SamplingParams,
             strategy: SpeculativeStrategy | None = None) -> tuple[str, list[ToolCall], list[int], GenerationStats]:
    guide = ToolGuide(lm, tools, 1 if params.temperature <= 0 else (params.top_k or 64))  # type: ignore[arg-type]
    stats = GenerationStats()
    state = lm.new_state()
    decoder = (strategy.new_session().decoder(state, params, stats, guide) if strategy
               else PlainDecoder(lm, state, params, stats, guide))  # type: ignore[arg-type]
    prompt = lm.encode("user: book me a table\nassistant: ")
    loop = GenerationLoop(lm, decoder, prompt, params, stats)  # type: ignore[arg-type]
    reader = ReplyReader(guide)
    text, calls = "", []
    pieces: dict[str, list[str]] = {}
    while not loop.done:
        delta, made = reader.push(loop.step().tokens)
        for piece in reader.deltas:
            assert piece.name == next((c.name for c in made if c.call_id == piece.call_id), piece.name)
            pieces.setdefault(piece.call_id, []).append(piece.delta)
        text, calls = text + delta, calls + made
    # every call's arguments also came in pieces as they were written, which join to them exactly (a
    # call cut off by max_tokens came in pieces too, and never whole)
    assert {c.call_id: c.arguments for c in calls} == {k: "".join(v) for k, v in pieces.items()
                                                       if k in {c.call_id for c in calls}}
    STREAMED.extend(len(v) for v in pieces.values())
    return text, calls, loop.produced, stats


STREAMED: list[int] = []  # how many pieces each call's arguments came in


def test_a_calls_arguments_stream_in_pieces_that_join_to_them() -> None:
    tools = parse_tools(TOOLS, {"type": "function", "name": "order_status"})
    assert tools is not None
    STREAMED.clear()
    _, calls, _, _ = generate(FakeByteLM(), tools, SamplingParams(temperature=0, max_tokens=300))
    assert calls and STREAMED and min(STREAMED) > 1


def check(call: ToolCall, tools: Tools) -> None:
    schema = next(t.parameters for t in tools.tools if t.name == call.name)
    jsonschema.validate(json.loads(call.arguments), schema)


def test_a_required_call_is_well_formed_and_its_fixed_parts_cost_no_step() -> None:
    lm = FakeByteLM()
    tools = parse_tools(TOOLS, "required")
    assert tools is not None
    _, calls, produced, stats = generate(lm, tools, SamplingParams(temperature=0, max_tokens=300))
    assert calls and stats.finish_reason == "stop"
    for call in calls:
        check(call, tools)
    assert stats.forced_tokens > 0 and lm.passes < len(produced)


def test_a_named_choice_calls_that_tool() -> None:
    tools = parse_tools(TOOLS, {"type": "function", "name": "order_status"})
    assert tools is not None
    _, calls, _, _ = generate(FakeByteLM(), tools, SamplingParams(temperature=0, max_tokens=300))
    assert calls[0].name == "order_status"


@pytest.mark.parametrize("seed", range(40))
def test_sampled_calls_are_never_malformed(seed: int) -> None:
    lm = FakeByteLM(bias={"<tool_call>": 4.0})
    tools = parse_tools(TOOLS, "auto")
    assert tools is not None
    text, calls, _, stats = generate(lm, tools, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, max_tokens=400,
                                                               seed=seed))
    for call in calls:
        check(call, tools)
    # the model ended the reply itself (a call is never left half-written then: the grammar allows the
    # end only between calls), or it was cut at max_tokens; no call leaks into the spoken text
    assert stats.finish_reason in ("stop", "length")
    assert "<tool_call>" not in text and "</tool_call>" not in text


def test_greedy_arguments_are_the_same_at_any_temperature() -> None:
    tools = parse_tools(TOOLS, "required")
    assert tools is not None
    greedy = replace(tools, greedy_arguments=True)
    _, [best, *_], _, _ = generate(FakeByteLM(), tools, SamplingParams(temperature=0, max_tokens=300))
    sampled = {generate(FakeByteLM(), tools, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, max_tokens=300,
                                                            seed=seed))[1][0].arguments for seed in range(6)}
    held = {generate(FakeByteLM(), greedy, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, max_tokens=300,
                                                          seed=seed))[1][0].arguments for seed in range(6)}
    assert sampled != {best.arguments}  # the fake's arguments do vary when sampled...
    assert held == {best.arguments}  # ... and not with greedy arguments


def test_parallel_calls_follow_each_other_and_can_be_switched_off() -> None:
    bias = {"<tool_call>": 6.0, "\n": 6.0}
    tools = parse_tools(TOOLS, "required")
    assert tools is not None
    _, calls, _, _ = generate(FakeByteLM(bias=bias), tools, SamplingParams(temperature=0, max_tokens=600))
    assert len(calls) >= 2
    single = parse_tools(TOOLS, "required", parallel=False)
    assert single is not None
    _, calls, _, _ = generate(FakeByteLM(bias=bias), single, SamplingParams(temperature=0, max_tokens=600))
    assert len(calls) == 1


@pytest.mark.parametrize("piece", ['{"', "`"])
def test_a_reply_that_writes_json_or_a_code_block_makes_a_call(piece: str) -> None:
    """Small models mean a call without writing the tag: a bare JSON object, a markdown block."""
    lm = FakeByteLM(bias={piece: 12.0})
    tools = parse_tools([{"type": "function", "name": "set_volume", "parameters": {"type": "object", "properties": {
        "level": {"type": "integer"}, "room": {"enum": ["hall", "kitchen"]}}, "required": ["level", "room"]}}])
    assert tools is not None
    text, calls, _, _ = generate(lm, tools, SamplingParams(temperature=0, max_tokens=300))
    assert text == "" and len(calls) >= 1
    check(calls[0], tools)


@pytest.mark.parametrize("method", ["draft_model", "ngram"])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "order_status"}])
def test_greedy_speculation_under_the_grammar_equals_plain_decoding(method: str, choice: Any) -> None:
    tools = parse_tools(TOOLS, choice)
    assert tools is not None
    params = SamplingParams(temperature=0, max_tokens=300, speculation=Speculation(method, 4))
    _, plain_calls, plain, _ = generate(FakeByteLM(), tools, params)
    strategy = SpeculativeStrategy(FakeByteLM(), MonotonicClock(), method=method, fixed_k=4,  # type: ignore[arg-type]
                                   draft=FakeByteLM(), calibrate=False)  # type: ignore[arg-type]
    _, spec_calls, spec, stats = generate(strategy.lm, tools, params, strategy)  # type: ignore[arg-type]
    assert spec == plain
    assert [(c.name, c.arguments) for c in spec_calls] == [(c.name, c.arguments) for c in plain_calls]
    if method == "draft_model":  # an identical draft: every token it is asked for is kept
        assert stats.accepted_tokens > 0


def test_jump_forward_writes_the_same_tokens_in_fewer_model_steps() -> None:
    tools = parse_tools(TOOLS, "required")
    assert tools is not None
    outputs = {}
    for jump in (False, True):
        lm = FakeByteLM()
        guide = ToolGuide(lm, tools, 1, jump_forward=jump)  # type: ignore[arg-type]
        params = SamplingParams(temperature=0, max_tokens=300)
        stats = GenerationStats()
        decoder = PlainDecoder(lm, lm.new_state(), params, stats, guide)  # type: ignore[arg-type]
        loop = GenerationLoop(lm, decoder, lm.encode("user: hi\nassistant: "), params, stats)  # type: ignore[arg-type]
        while not loop.done:
            loop.step()
        outputs[jump] = (loop.produced, lm.passes)
    (slow, slow_passes), (fast, fast_passes) = outputs[False], outputs[True]
    assert slow == fast and fast_passes < slow_passes


@pytest.mark.parametrize("choice", ["auto", "none"])
def test_tag_soup_is_never_spoken(choice: str) -> None:
    """A model that imitates its tools prompt writes "<tools></tools>" or ">{...}" as its reply: tokens
    that start with "<" or ">" are ruled out of spoken text, so it says words instead."""
    lm = FakeByteLM(bias={"<": 8.0, ">": 8.0})
    tools = parse_tools(TOOLS, choice)
    assert tools is not None
    guide = ToolGuide(lm, tools, 1)  # type: ignore[arg-type]
    masked = guide.mask(guide.start(), lm._logits([lm.index["a"]]))
    assert masked[lm.index["<"]] == float("-inf") and masked[lm.index[">"]] == float("-inf")
    assert guide.advance(guide.start(), lm.index["<"]) is None
    text, _, _, _ = generate(lm, tools, SamplingParams(temperature=0, max_tokens=60))
    assert "<" not in text and ">" not in text


def test_a_reply_does_not_end_before_it_said_something() -> None:
    lm = FakeByteLM(bias={"<|im_end|>": 12.0})
    tools = parse_tools(TOOLS, "auto")
    assert tools is not None
    text, calls, _, stats = generate(lm, tools, SamplingParams(temperature=0, max_tokens=60))
    assert text.strip() and not calls
    assert stats.finish_reason == "stop"  # it ends as soon as it has said a word


@pytest.mark.parametrize(("call", "threshold", "chosen"), [
    (0.4, 0.5, "a"), (0.6, 0.5, "<tool_call>"), (0.3, 0.37, "a"), (0.4, 0.37, "<tool_call>"),
    (0.4, None, "<tool_call>")])
@pytest.mark.parametrize("candidates", [1, 20])
def test_a_call_is_decided_by_its_share_against_every_word_together(call: float, threshold: float | None,
                                                                    chosen: str, candidates: int) -> None:
    """With a threshold, the call wins only with that share of the mass, greedy or sampled; without
    one (None), greedy compares it with the best single word, which a 0.4 call beats."""
    lm = FakeByteLM()
    tools = parse_tools(TOOLS, "auto")
    assert tools is not None
    tools = replace(tools, call_threshold=threshold)
    guide = ToolGuide(lm, tools, candidates)  # type: ignore[arg-type]
    logits = np.full(lm.vocab_size, -np.inf, dtype=np.float32)
    logits[lm.index["<tool_call>"]] = np.log(call)
    words = (1 - call) / 4
    for i, piece in enumerate("abcd"):  # the words' mass, spread over four ways to say it
        logits[lm.index[piece]] = np.log(words * (1.01 if i == 0 else 1.0))
    masked = guide.mask(guide.start(), logits)
    assert int(masked.argmax()) == lm.index[chosen]
    if threshold is not None:  # decided: nothing of the other way is left to sample
        assert np.isfinite(masked).sum() == (1 if chosen == "<tool_call>" else 4)
