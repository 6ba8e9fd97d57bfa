"""The LLM stage's acknowledgement of a tool call, with a fake conversation (named as such): said,
and cut as a phrase for the TTS, while the call is still being written."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from core.clock import MonotonicClock
from models.llm.tool_calls import ToolCall
from models.protocols import ChatMessage, GenerationDone, GenerationStats, SamplingParams, ToolCallDelta, ToolCallOutput
from pipeline.chunker import chunk_stage
from pipeline.config import ChunkerConfig
from pipeline.events import Phrase, ReplyFinished, ReplyRequest, ReplyToolCall, ReplyToolCallDelta
from pipeline.llm_stage import llm_stage


class FakeCallWriter:
    """A fake conversation: begins a call, then writes the rest of it only once `rest` is set."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.rest = asyncio.Event()

    async def stream(self, messages: object, params: object, tools: object) -> AsyncGenerator[object, None]:
        yield ToolCallDelta("call_1", self.name, '{"order_number": ')
        await self.rest.wait()
        yield ToolCallDelta("call_1", self.name, '"4512"}')
        yield ToolCallOutput(ToolCall("call_1", self.name, '{"order_number": "4512"}'))
        yield GenerationDone(GenerationStats())


async def first_events(name: str) -> tuple[list[object], FakeCallWriter]:
    writer = FakeCallWriter(name)

    async def one() -> AsyncGenerator[ReplyRequest, None]:
        yield ReplyRequest(1, (ChatMessage("user", "Where is my order 4512?"),), 0.0)

    clock = MonotonicClock()
    text = llm_stage(one(), writer, SamplingParams(), clock, None,  # type: ignore[arg-type]
                     lambda tool: "" if tool == "end_call" else "One moment.")
    events: list[object] = []

    async def read() -> None:
        async for event in chunk_stage(text, ChunkerConfig(), clock):
            events.append(event)

    reader = asyncio.create_task(read())

    async def begun() -> None:  # the call's first piece came through (what precedes it, with it)
        while not any(isinstance(e, ReplyToolCallDelta) for e in events):
            await asyncio.sleep(0.005)

    await asyncio.wait_for(begun(), 10)
    seen = list(events)
    writer.rest.set()
    await reader
    return seen, writer


async def test_a_call_begun_before_any_word_is_acknowledged_as_a_phrase_before_the_call_is_written() -> None:
    seen, _ = await first_events("order_status")
    assert [e.text for e in seen if isinstance(e, Phrase)] == ["One moment."]
    assert not any(isinstance(e, ReplyToolCall) for e in seen)


async def test_no_acknowledgement_before_end_call() -> None:
    seen, _ = await first_events("end_call")
    assert not any(isinstance(e, Phrase) for e in seen)


class FakeCutOffCall:
    """A fake conversation: begins a call and stops there (the token limit), writing none."""

    async def stream(self, messages: object, params: object, tools: object) -> AsyncGenerator[object, None]:
        yield ToolCallDelta("call_1", "order_status", '{"order_number": ')
        yield GenerationDone(GenerationStats(finish_reason="length"))


async def test_an_acknowledged_call_that_is_never_finished_fails_the_reply() -> None:
    """"One moment." and no call after it must not leave the caller waiting: the reply fails (and
    the session says its apology after the acknowledgement)."""
    async def one() -> AsyncGenerator[ReplyRequest, None]:
        yield ReplyRequest(1, (ChatMessage("user", "Where is my order?"),), 0.0)

    stage = llm_stage(one(), FakeCutOffCall(), SamplingParams(), MonotonicClock(), None,  # type: ignore[arg-type]
                      lambda tool: "One moment.")
    events = [e async for e in stage]
    finished = [e for e in events if isinstance(e, ReplyFinished)]
    assert len(finished) == 1 and finished[0].error is not None and "did not finish" in finished[0].error
