"""Dictated digits become numerals; ordinary words that are digits stay words."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest

from core.clock import MonotonicClock
from core.worker import ModelWorker
from pipeline.asr_stage import asr_stage
from pipeline.config import AsrStageConfig
from pipeline.events import SpeechAudio, SpeechEvent, SpeechStarted, SpeechStopped, TranscriptFinal
from pipeline.numerals import spoken_digits
from tests.pipeline.fakes import FakeRecognizer


@pytest.mark.parametrize(("heard", "written"), [
    ("where is my order number four five one two", "where is my order number 4512"),
    ("Where is my order number Four Five One Two?", "Where is my order number 4512?"),
    ("my PIN is nine oh oh seven", "my PIN is 9007"),
    ("It's nine-one-one.", "It's 911."),
    ("call five five five, one two three four", "call 555, 1234"),  # a comma keeps the groups
    ("book it for one or two people", "book it for one or two people"),
    ("two people at seven tonight", "two people at seven tonight"),
    ("one two", "one two"),  # two digits are not a dictated run
    ("Oh, one two three", "Oh, 123"),  # "oh" starts no run
    ("someone two three four", "someone 234"),  # "one" inside a word is not a digit
    ("ninety five", "ninety five"),
])
def test_runs_of_three_or_more_spoken_digits_become_numerals(heard: str, written: str) -> None:
    assert spoken_digits(heard) == written


async def finals(config: AsrStageConfig) -> list[str]:
    async def speech() -> AsyncIterator[SpeechEvent]:
        yield SpeechStarted(1, 0.0, 0.0)
        yield SpeechAudio(1, np.full(512, 0.1, np.float32))
        yield SpeechStopped(1, 0.0, 0.0, 0.0)

    worker = ModelWorker("asr")
    recognizer = FakeRecognizer(["my order is four five one two"])
    events = [e async for e in asr_stage(speech(), recognizer, worker, config, MonotonicClock())]
    worker.shutdown()
    return [e.text for e in events if isinstance(e, TranscriptFinal)]


async def test_the_final_transcript_has_the_numerals_unless_turned_off() -> None:
    assert await finals(AsrStageConfig(partials=False)) == ["my order is 4512"]
    assert await finals(AsrStageConfig(partials=False, spoken_digits=False)) == ["my order is four five one two"]
