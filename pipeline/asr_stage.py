"""Streaming ASR: interim transcripts while the caller speaks, a final one when the turn ends.

Whisper is not a streaming model, so interim transcripts re-read the turn's audio so far, at most
one at a time and only after `partial_interval_ms` of new speech. Recognition runs on the ASR
worker thread while speech events keep flowing, so a barge-in is never held up by a transcription.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import numpy as np

from models.protocols import SpeechRecognizer
from models.worker import ModelWorker
from pipeline.clock import Clock
from pipeline.config import AsrStageConfig
from pipeline.errors import VoiceAgentError
from pipeline.events import (
    ErrorEvent,
    InputEvent,
    SpeechAudio,
    SpeechEvent,
    SpeechStarted,
    SpeechStopped,
    TranscriptFinal,
    TranscriptPartial,
)

_END = object()


async def asr_stage(
    events: AsyncIterator[SpeechEvent],
    recognizer: SpeechRecognizer,
    worker: ModelWorker,
    config: AsrStageConfig,
    clock: Clock,
) -> AsyncIterator[InputEvent]:
    out: asyncio.Queue[object] = asyncio.Queue()
    tasks: set[asyncio.Task[None]] = set()
    finalized: set[int] = set()
    interval = int(recognizer.sample_rate * config.partial_interval_ms / 1000)

    async def transcribe(turn_id: int, audio: np.ndarray, final: bool) -> None:
        try:
            text = await worker.run(recognizer.transcribe, audio)
        except VoiceAgentError as exc:
            if final:  # the turn gets no reply, but the caller hears about it and the session goes on
                await out.put(ErrorEvent(exc.code, f"speech recognition failed: {exc}", turn_id))
                await out.put(TranscriptFinal(turn_id, "", clock.now()))
            return
        if final:
            await out.put(TranscriptFinal(turn_id, text, clock.now()))
        elif turn_id not in finalized and text:
            await out.put(TranscriptPartial(turn_id, text, clock.now()))

    def start(turn_id: int, audio: np.ndarray, final: bool) -> asyncio.Task[None]:
        task = asyncio.create_task(transcribe(turn_id, audio, final))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    async def pump() -> None:
        try:
            await read()
        finally:
            await out.put(_END)

    async def read() -> None:
        chunks: list[np.ndarray] = []
        size = 0
        partial_at = 0
        partial: asyncio.Task[None] | None = None
        async for event in events:
            if isinstance(event, SpeechStarted):
                chunks, size, partial_at, partial = [], 0, 0, None
                await out.put(event)
            elif isinstance(event, SpeechAudio):
                chunks.append(event.samples)
                size += len(event.samples)
                if config.partials and size - partial_at >= interval and (partial is None or partial.done()):
                    partial_at = size
                    partial = start(event.turn_id, np.concatenate(chunks), final=False)
            elif isinstance(event, SpeechStopped):
                finalized.add(event.turn_id)
                await out.put(event)
                audio = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
                start(event.turn_id, audio, final=True)
                chunks, size = [], 0
        await asyncio.gather(*tasks, return_exceptions=True)

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
