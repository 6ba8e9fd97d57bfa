"""The ASR stage's own queue is bounded: a session that stops reading holds the VAD back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from core.clock import MonotonicClock
from core.worker import ModelWorker
from pipeline.asr_stage import asr_stage
from pipeline.config import AsrStageConfig
from pipeline.events import SpeechEvent, SpeechStarted, SpeechStopped
from tests.pipeline.fakes import FakeRecognizer


async def test_events_wait_for_a_slow_reader_instead_of_piling_up() -> None:
    made = 0

    async def turns() -> AsyncIterator[SpeechEvent]:
        nonlocal made
        for turn_id in range(1, 1001):
            made += 1
            yield SpeechStarted(turn_id, 0.0, 0.0)
            made += 1
            yield SpeechStopped(turn_id, 0.0, 0.0, 0.0)

    worker = ModelWorker("asr")
    stage = asr_stage(turns(), FakeRecognizer([]), worker, AsrStageConfig(partials=False, max_queued_events=8),
                      MonotonicClock())
    first = await stage.__anext__()  # start it, then read nothing for a while
    assert isinstance(first, SpeechStarted)
    await asyncio.sleep(0.3)
    assert made < 40, f"{made} speech events were taken in while the session read one"
    seen = 1
    async for _ in stage:
        seen += 1
    assert made == 2000 and seen == 3000  # nothing lost: 1000 starts, stops and (empty) finals
    await stage.aclose()
    worker.shutdown()
