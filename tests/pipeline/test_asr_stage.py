"""The ASR stage: its own queue is bounded, and interim transcripts run only while the bot talks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np

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
    for _ in range(20):  # the stage's own tasks run as far as they can while the reader reads nothing
        await asyncio.sleep(0)
    assert made < 40, f"{made} speech events were taken in while the session read one"
    seen = 1
    async for _ in stage:
        seen += 1
    assert made == 2000 and seen == 3000  # nothing lost: 1000 starts, stops and (empty) finals
    await stage.aclose()
    worker.shutdown()


async def test_interim_transcripts_only_while_the_bot_talks_unless_asked() -> None:
    from pipeline.events import SpeechAudio, TranscriptPartial

    async def speech() -> AsyncIterator[SpeechEvent]:
        yield SpeechStarted(1, 0.0, 0.0)
        for _ in range(100):  # 3.2 s of speech in 32 ms windows
            yield SpeechAudio(1, np.full(512, 0.1, np.float32))
            await asyncio.sleep(0.005)
        yield SpeechStopped(1, 0.0, 0.0, 0.0)

    async def partials(bot_talking: bool, while_idle: bool) -> int:
        worker = ModelWorker("asr")
        config = AsrStageConfig(partials_while_idle=while_idle, first_partial_ms=100, partial_interval_ms=100)
        events = [e async for e in asr_stage(speech(), FakeRecognizer(["hello"] * 50), worker, config,
                                             MonotonicClock(), lambda: bot_talking)]
        worker.shutdown()
        return sum(isinstance(e, TranscriptPartial) for e in events)

    assert await partials(bot_talking=True, while_idle=False) > 0
    assert await partials(bot_talking=False, while_idle=False) == 0  # the final is never held up by one
    assert await partials(bot_talking=False, while_idle=True) > 0


class BrokenRecognizer(FakeRecognizer):
    """A fake recognizer that fails with a plain exception (not the project's own error) at first."""

    def __init__(self, failures: int) -> None:
        super().__init__(["hello again"])
        self.failures = failures

    def transcribe(self, audio: np.ndarray, beam_size: int | None = None) -> str:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("ctranslate2 fell over")
        return super().transcribe(audio, beam_size)


async def test_any_recognizer_failure_ends_the_turn_with_an_error_and_the_next_turn_is_heard() -> None:
    from pipeline.events import ErrorEvent, SpeechAudio, TranscriptFinal

    async def two_turns() -> AsyncIterator[SpeechEvent]:
        for turn_id in (1, 2):
            yield SpeechStarted(turn_id, 0.0, 0.0)
            yield SpeechAudio(turn_id, np.full(16000, 0.1, np.float32))
            yield SpeechStopped(turn_id, 0.0, 0.0, 0.0)
            await asyncio.sleep(0.05)

    worker = ModelWorker("asr")
    events = [e async for e in asr_stage(two_turns(), BrokenRecognizer(failures=1), worker,
                                         AsrStageConfig(partials=False), MonotonicClock())]
    worker.shutdown()
    errors = [e for e in events if isinstance(e, ErrorEvent)]
    finals = [(e.turn_id, e.text) for e in events if isinstance(e, TranscriptFinal)]
    assert [(e.turn_id, e.code) for e in errors] == [(1, "asr_failed")]
    assert "ctranslate2" not in errors[0].message  # the caller is told what happened, not the engine's insides
    assert finals == [(1, ""), (2, "hello again")]
