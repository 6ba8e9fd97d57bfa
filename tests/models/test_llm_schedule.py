"""The embedded engine's shared worker serves the call due soonest (llm.schedule edf), with a tiny
real model: a call waiting for its first audio gets every step until it is done, while a call far
ahead of its listener waits; under fifo the two take turns."""

from __future__ import annotations

import asyncio
import threading

from core.clock import MonotonicClock
from core.worker import ModelWorker, Schedule
from models.llm.llm_embedded import EmbeddedConversation, EmbeddedLLM
from models.protocols import ChatMessage, SamplingParams, TextDelta
from tests.models.tiny import tiny_lm


async def two_calls(schedule: Schedule) -> list[str]:
    """Queue the far call's generation, then the near one's, behind a blocked worker; release it
    and return whose text came in what order."""
    target = tiny_lm(0, scale=3.0)
    target.stop_ids = frozenset()  # every reply runs to max_tokens
    # follow_s: a bound only, so that a slow event loop cannot let the far call slip in
    worker = ModelWorker("llm", priority="background", schedule=schedule, follow_s=10.0)
    llm = EmbeddedLLM(target, MonotonicClock(), worker=worker)
    far, near = llm.conversation(), llm.conversation()
    far.set_deadline(100.0)  # its listener has a lot of audio queued
    near.set_deadline(1.0)  # its caller waits for the first audio
    order: list[str] = []

    async def call(name: str, conversation: EmbeddedConversation) -> None:
        async for out in conversation.stream([ChatMessage("user", "w3 w4 w5")],
                                             SamplingParams(temperature=0.0, max_tokens=8)):
            if isinstance(out, TextDelta):
                order.append(name)

    release, started = threading.Event(), threading.Event()

    def block() -> None:
        started.set()
        release.wait(10)

    blocker = asyncio.ensure_future(worker.run(block))
    await asyncio.to_thread(started.wait, 10)
    calls = [asyncio.ensure_future(call("far", far))]
    await asyncio.sleep(0)
    calls.append(asyncio.ensure_future(call("near", near)))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(blocker, *calls)
    for conversation in (far, near):
        await conversation.aclose()
    await llm.aclose()
    return order


async def test_edf_gives_the_call_due_first_every_step_until_it_is_done() -> None:
    order = await two_calls("edf")
    assert order.count("near") == 8 and order.count("far") == 8
    assert order == ["near"] * 8 + ["far"] * 8, order


async def test_fifo_takes_turns_as_today() -> None:
    order = await two_calls("fifo")
    assert order.count("near") == 8 and order.count("far") == 8
    assert order[0] == "far" and order[:8] != ["near"] * 8, order
