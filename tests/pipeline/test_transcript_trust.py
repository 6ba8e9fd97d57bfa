"""The hygiene rules for a transcript made at a pause (pipeline/transcript_trust.py)."""

from __future__ import annotations

import pytest

from pipeline.transcript_trust import doubt, repeats_itself


@pytest.mark.parametrize("text", [
    "Could you remind me too? Could you remind me too? Could you remind me too?",  # from the turn-detection set
    "Could you remind me to, um? Could you remind me to, um?",
    "Thank you very much. Thank you very much.",
    "What kind is there are? What kind is there are?",
])
def test_a_transcript_that_repeats_itself_is_no_evidence(text: str) -> None:
    assert repeats_itself(text)
    assert doubt(text, 2.0) == "it repeats itself"


@pytest.mark.parametrize("text", [
    "Can you book me a table for two people at eight tonight?",
    "Okay? Okay?",  # one word twice: people say it
    "My order number is four four five one.",  # digits repeat in numbers
    "Call me on 555 555 1234.",
    "That is very very kind of you.",
    "bye bye",
    "no no no",
    "Thank you, thank you.",
])
def test_ordinary_transcripts_are_evidence(text: str) -> None:
    assert not repeats_itself(text)
    assert doubt(text, 3.0, avg_logprob=-0.3, no_speech_prob=0.01) is None


def test_the_recognizer_s_own_doubt_makes_it_no_evidence() -> None:
    text = "Can I pay with her?"
    assert doubt(text, 1.5, avg_logprob=-1.4) is not None and "guessing" in (doubt(text, 1.5, avg_logprob=-1.4) or "")
    assert doubt(text, 1.5, no_speech_prob=0.8) is not None
    assert doubt(text, 1.5, avg_logprob=-0.9, no_speech_prob=0.5) is None  # within faster-whisper's own bounds


def test_more_words_than_the_audio_can_hold_is_no_evidence() -> None:
    twelve = "one of the things I would like to know about it is"
    assert doubt(twelve, 1.5) == "12 words in 1.5 s of audio"
    assert doubt(twelve, 3.0) is None  # four a second: ordinary speech
    assert doubt("Yes.", 0.3) is None  # too short to judge by rate
