"""The TTS stage: each Phrase is synthesized as soon as it arrives and streamed out in chunks at
the session's output rate, the synthesizer's silence before and after it trimmed (pipeline/trim.py).
Other events pass through in order."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterator

import numpy as np

from core.clock import Clock
from core.worker import ModelWorker
from models.protocols import Audio, Synthesizer
from pipeline.audio import resample
from pipeline.config import TrimConfig
from pipeline.events import Phrase, ReplyAudio, ReplyEvent
from pipeline.trim import SilenceTrimmer, pause_ms

_DONE = object()


def _next_chunk(chunks: Iterator[Audio]) -> object:
    return next(chunks, _DONE)


async def tts_stage(
    events: AsyncIterator[ReplyEvent],
    synthesizer: Synthesizer,
    worker: ModelWorker,
    output_rate: int,
    clock: Clock,
    trim: TrimConfig | None = None,
) -> AsyncGenerator[ReplyEvent, None]:
    """`trim`: how each phrase's silence is trimmed (None: the defaults)."""
    trim = trim if trim is not None else TrimConfig()
    async for event in events:
        if not isinstance(event, Phrase):
            yield event
            continue
        yield event
        if not any(ch.isalnum() for ch in event.speech):
            continue
        trimmer = SilenceTrimmer(output_rate, pause_ms(event.speech, trim), trim)
        chunks = await worker.run(synthesizer.synthesize, event.speech)
        while (chunk := await worker.run(_next_chunk, chunks)) is not _DONE:
            audio = resample(np.asarray(chunk, dtype=np.float32), synthesizer.sample_rate, output_rate)
            if len(audio := trimmer.push(audio)):
                yield ReplyAudio(event.turn_id, event.index, audio, clock.now())
        if len(audio := trimmer.finish()):
            yield ReplyAudio(event.turn_id, event.index, audio, clock.now())
