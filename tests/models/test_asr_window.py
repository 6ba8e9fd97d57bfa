"""Whisper on a short window (asr.window_s): the same words as the full 30 s window, nothing from
silence, and the full window again when the short one repeats itself. Real whisper-tiny.en."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from models.config import AsrConfig
from models.protocols import Heard
from models.speech.asr_faster_whisper import FasterWhisperRecognizer, tail_probabilities
from tests.speech import speech_samples, words

QUESTION = "What is the weather going to be like in Paris tomorrow?"


@pytest.fixture(scope="module")
def short() -> FasterWhisperRecognizer:
    return FasterWhisperRecognizer(AsrConfig(window_s=10))


def _question(tmp: Path) -> np.ndarray:
    pcm = speech_samples(QUESTION, tmp)
    return np.concatenate([np.zeros(4800), pcm / 32768, np.zeros(3200)]).astype(np.float32)


def _refuse_whole(recognizer: FasterWhisperRecognizer, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record (instead of running) every fall back to the full 30 s window."""
    calls: list[int] = []

    def whole(audio: np.ndarray, beam: int) -> Heard:
        calls.append(len(audio))
        return Heard("<the full window>")

    monkeypatch.setattr(recognizer, "_whole", whole)
    return calls


@pytest.mark.slow
def test_short_window_hears_what_the_full_window_hears(short: FasterWhisperRecognizer, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    audio = _question(tmp_path)
    full = FasterWhisperRecognizer(AsrConfig(window_s=30)).transcribe(audio)
    fell_back = _refuse_whole(short, monkeypatch)
    heard = short.transcribe(audio)
    assert not fell_back, "the 10 s window should decide a clear question itself"
    assert words(heard) == words(full), (heard, full)
    assert {"weather", "paris", "tomorrow"} <= set(words(heard)), heard


@pytest.mark.slow
def test_silence_and_noise_give_no_words(short: FasterWhisperRecognizer) -> None:
    # A short window alone turns some of these into "Thank you." or "."; they must come out empty.
    noise = np.random.default_rng(0)
    for level in (0.0, 0.001, 0.01):
        for seconds in (0.5, 2.0, 6.0):
            audio = (noise.standard_normal(int(seconds * 16000)) * level).astype(np.float32)
            assert short.transcribe(audio) == "", (level, seconds)


@pytest.mark.slow
def test_repetition_goes_to_the_full_window(short: FasterWhisperRecognizer, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    audio = _question(tmp_path)
    windowed = short._windowed
    assert windowed is not None
    decode = windowed.tokenizer.decode
    # as if the short window had looped (as it did on an 8 kHz "move my tennis lesson" question)
    monkeypatch.setattr(windowed.tokenizer, "decode", lambda tokens: " ".join([decode(tokens)] * 8))
    fell_back = _refuse_whole(short, monkeypatch)
    assert short.transcribe(audio) == "<the full window>"
    assert fell_back == [len(audio)]


def test_long_audio_uses_the_full_window(short: FasterWhisperRecognizer, monkeypatch: pytest.MonkeyPatch) -> None:
    fell_back = _refuse_whole(short, monkeypatch)
    assert short.transcribe(np.zeros(31 * 16000, np.float32)) == "<the full window>"
    assert fell_back


def test_window_30_is_whisper_s_own_path() -> None:
    assert FasterWhisperRecognizer(AsrConfig(window_s=30))._windowed is None


def test_the_tail_s_confidence_is_the_last_word_s_tokens_and_the_final_mark() -> None:
    assert tail_probabilities([" Can", " I", " pay", " with", " her", "?"], [0.9, 0.9, 0.8, 0.9, 0.2, 0.6]) \
        == (0.2, 0.6)
    word, mark = tail_probabilities([" order", " 45", "21", "."], [0.9, 0.6, 0.4, 0.8])
    assert word == pytest.approx(0.5) and mark == 0.8  # a word of two tokens: their mean
    assert tail_probabilities([" Book", " it", "...", "?"], [0.9, 0.7, 0.3, 0.5]) == (0.7, 0.3)  # the least sure mark
    assert tail_probabilities([" Book", " it"], [0.9, 0.7]) == (0.7, None)
    assert tail_probabilities(["..."], [0.3]) == (None, 0.3) and tail_probabilities([], []) == (None, None)


@pytest.mark.slow
def test_a_clear_question_comes_with_the_recognizer_s_confidence_in_its_end(short: FasterWhisperRecognizer,
                                                                          tmp_path: Path) -> None:
    audio = _question(tmp_path)
    assert short.transcribe_scored(audio).last_word_prob is None  # not asked for (asr.end_confidence)
    heard = FasterWhisperRecognizer(AsrConfig(window_s=10, end_confidence=True)).transcribe_scored(audio)
    assert heard.text.endswith("?") and heard.avg_logprob is not None
    assert heard.last_word_prob is not None and 0.1 < heard.last_word_prob <= 1  # "tomorrow", clearly said
    assert heard.end_mark_prob is not None and 0.1 < heard.end_mark_prob <= 1
