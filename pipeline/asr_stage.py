"""Streaming ASR: interim transcripts while the caller speaks, a final one when the turn ends.

Whisper is not a streaming model, so interim transcripts re-read the turn's audio so far, at most
one at a time and only after `partial_interval_ms` of new speech; by default only while the bot
talks (`bot_talking`), where they tell a word from a cough, since one still running when the
caller pauses would hold up the final transcript. When the caller pauses
(SpeechPaused) the final transcript starts early, on the audio so far; if the turn then ends
without more speech, that result is the final one, so the transcript is ready at `speech_end`
instead of a Whisper pass after it. If it is ready while the pause lasts it is announced
(TranscriptEarly), so a preemptive reply can start before the turn is known to be over; a
resumption (SpeechResumed) is passed on so that reply can be dropped. Recognition runs on the ASR
worker thread while speech events keep flowing, so a barge-in is never held up by a transcription.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from typing import Any

import numpy as np

from core.clock import Clock
from core.errors import VoiceAgentError
from core.worker import ModelWorker
from models.protocols import Heard, SpeechRecognizer
from pipeline.config import AsrStageConfig
from pipeline.events import (
    ErrorEvent,
    InputEvent,
    SpeechAudio,
    SpeechEvent,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    TranscriptEarly,
    TranscriptFinal,
    TranscriptPartial,
)
from pipeline.numerals import spoken_digits

_END = object()
log = logging.getLogger(__name__)


async def asr_stage(
    events: AsyncIterator[SpeechEvent],
    recognizer: SpeechRecognizer,
    worker: ModelWorker,
    config: AsrStageConfig,
    clock: Clock,
    bot_talking: Callable[[], bool] = lambda: True,
) -> AsyncGenerator[InputEvent, None]:
    out: asyncio.Queue[object] = asyncio.Queue(maxsize=config.max_queued_events)  # full: the VAD waits
    tasks: set[asyncio.Task[None]] = set()
    finalized: set[int] = set()
    interval = int(recognizer.sample_rate * config.partial_interval_ms / 1000)
    first_interval = int(recognizer.sample_rate * config.first_partial_ms / 1000)

    def written(text: str) -> str:
        return spoken_digits(text) if config.spoken_digits else text

    def scored(audio: np.ndarray) -> Heard:
        """The transcript with the recognizer's confidence, where it gives one (on the worker)."""
        transcribe_scored = getattr(recognizer, "transcribe_scored", None)
        if transcribe_scored is not None:
            heard: Heard = transcribe_scored(audio)
            return heard
        return Heard(recognizer.transcribe(audio))

    def spawn(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    async def partial(turn_id: int, audio: np.ndarray) -> None:
        try:
            text = await worker.run(recognizer.transcribe, audio, config.interim_beam_size)
        except Exception as exc:  # a failed interim transcript is only skipped
            log.warning("turn %d: an interim transcript failed (%s: %s); skipped", turn_id, type(exc).__name__, exc)
            return
        if turn_id not in finalized and text:
            await out.put(TranscriptPartial(turn_id, written(text), clock.now()))

    async def final(turn_id: int, early: asyncio.Future[Heard] | None, audio: np.ndarray) -> None:
        try:
            text = (await early).text if early is not None else await worker.run(recognizer.transcribe, audio)
        except Exception as exc:  # any failure: the turn gets no reply, the caller hears why, the call goes on
            code = exc.code if isinstance(exc, VoiceAgentError) else "asr_failed"
            log.error("turn %d: speech recognition failed: %s: %s", turn_id, type(exc).__name__, exc,
                      exc_info=not isinstance(exc, VoiceAgentError))
            await out.put(ErrorEvent(code, "speech recognition failed; please say that again", turn_id))
            text = ""
        await out.put(TranscriptFinal(turn_id, written(text), clock.now()))

    async def announce(turn_id: int, early: asyncio.Future[Heard], speech_s: float, paused_at: float) -> None:
        """The transcript made at a pause, if it is ready while the pause lasts: a preemptive reply
        can start on it, and the end-of-turn decision weighs it."""
        with contextlib.suppress(Exception, asyncio.CancelledError):  # a failure is final()'s to report
            heard = await asyncio.shield(early)
            if turn_id not in finalized and not early.cancelled() and heard.text:
                await out.put(TranscriptEarly(turn_id, written(heard.text), clock.now(), speech_s, heard.avg_logprob,
                                              heard.no_speech_prob, paused_at, heard.last_word_prob,
                                              heard.end_mark_prob))

    async def read() -> None:
        chunks: list[np.ndarray] = []
        size = partial_at = 0
        partial_task: asyncio.Task[None] | None = None
        early: asyncio.Future[Heard] | None = None  # the final transcript started at a pause
        async for event in events:
            if isinstance(event, SpeechStarted):
                chunks, size, partial_at, partial_task, early = [], 0, 0, None, None
                await out.put(event)
            elif isinstance(event, SpeechAudio):
                chunks.append(event.samples)
                size += len(event.samples)
                idle = partial_task is None or partial_task.done()
                due = first_interval if partial_at == 0 else interval
                wanted = config.partials and (config.partials_while_idle or bot_talking())
                if wanted and early is None and size - partial_at >= due and idle:
                    partial_at = size
                    partial_task = spawn(partial(event.turn_id, np.concatenate(chunks)))
            elif isinstance(event, SpeechPaused):
                audio = np.concatenate(chunks)
                early = asyncio.ensure_future(worker.run(scored, audio))
                spawn(announce(event.turn_id, early, len(audio) / recognizer.sample_rate, event.at))
                await out.put(event)
            elif isinstance(event, SpeechResumed):
                if early is not None:
                    early.cancel()  # its result would miss what the caller is saying now
                early = None
                await out.put(event)
            elif isinstance(event, SpeechStopped):
                finalized.add(event.turn_id)
                await out.put(event)
                audio = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
                spawn(final(event.turn_id, early, audio))
                chunks, size, early = [], 0, None
        await asyncio.gather(*tasks, return_exceptions=True)

    async def pump() -> None:
        try:
            await read()
        finally:
            await out.put(_END)

    pumping = asyncio.create_task(pump())
    try:
        while True:
            item = await out.get()
            if item is _END:
                break
            yield item  # type: ignore[misc]
        await pumping
    finally:
        pumping.cancel()
        for task in list(tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await pumping
