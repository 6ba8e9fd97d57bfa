"""Trimming the synthesizer's silence around a phrase (pipeline/trim.py) and in the TTS stage."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest

from core.clock import FakeClock
from core.worker import ModelWorker
from models.protocols import Audio
from pipeline.config import TrimConfig
from pipeline.events import Phrase, ReplyAudio, ReplyEvent
from pipeline.trim import FRAME_MS, SilenceTrimmer, pause_ms, trim_phrase
from pipeline.tts_stage import tts_stage

RATE = 24000
CONFIG = TrimConfig()
LEVEL = 10 ** (CONFIG.silence_db / 20)


def ms(n: float) -> int:
    return int(RATE * n / 1000)


def noise(n_ms: float, seed: int) -> Audio:
    """A synthesizer's silence: noise at about -85 dBFS (hibari's loudest), not exact zeros."""
    return (np.random.default_rng(seed).standard_normal(ms(n_ms)) * 10 ** (-85 / 20)).astype(np.float32)


def tone(n_ms: float) -> Audio:
    """Speech: loud from its first sample."""
    return (0.3 * np.cos(2 * np.pi * 440 * np.arange(ms(n_ms)) / RATE)).astype(np.float32)


class FakePaddedSynthesizer:
    """Like hibari: silence before and after the speech, the audio in several chunks."""

    name = "fake-padded"
    sample_rate = RATE

    def __init__(self, parts: list[Audio] | None = None, chunk_ms: float = 37) -> None:
        self.parts = parts if parts is not None else [noise(300, 1), tone(200), noise(150, 2), tone(200), noise(500, 3)]
        self.chunk = ms(chunk_ms)
        self.consumed = 0  # chunks taken so far
        self.total = 0  # chunks of the last phrase

    def synthesize(self, text: str) -> Iterator[Audio]:
        audio = np.concatenate(self.parts)
        self.total = -(-len(audio) // self.chunk)
        self.consumed = 0
        for start in range(0, len(audio), self.chunk):
            self.consumed += 1
            yield audio[start:start + self.chunk]


def audible(audio: Audio) -> np.ndarray:
    return np.flatnonzero(np.abs(audio) >= LEVEL)


def trimmed(chunks: list[Audio], text: str = "Hello there.", config: TrimConfig = CONFIG) -> Audio:
    pieces = list(trim_phrase(chunks, RATE, text, config))
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)


def test_the_leading_silence_is_dropped_but_for_the_onset_margin() -> None:
    synth = FakePaddedSynthesizer()
    audio = np.concatenate(synth.parts)
    out = trimmed(list(synth.synthesize("Hello there.")))
    start = audible(audio)[0] - ms(CONFIG.onset_ms)
    assert audible(out)[0] == ms(CONFIG.onset_ms)
    # the sound, the silence inside the phrase and the pause after it are the synthesizer's own samples
    assert np.array_equal(out, audio[start:start + len(out)])


@pytest.mark.parametrize(("text", "pause"), [("Hello there.", CONFIG.sentence_pause_ms),
                                             ("Is it there?\"", CONFIG.sentence_pause_ms),
                                             ("Well, hello there,", CONFIG.clause_pause_ms),
                                             ("and then the", 0)])
def test_the_trailing_silence_becomes_the_pause_of_the_last_mark(text: str, pause: int) -> None:
    synth = FakePaddedSynthesizer()
    assert pause_ms(text, CONFIG) == pause
    out = trimmed(list(synth.synthesize(text)), text)
    after_sound = len(out) - audible(out)[-1] - 1
    # the last sound's frame may end up to a frame after its last loud sample
    assert ms(pause) <= after_sound <= ms(pause) + ms(FRAME_MS), (after_sound, ms(pause))


def test_silence_inside_the_phrase_is_kept_and_long_silence_is_cut() -> None:
    out = trimmed(list(FakePaddedSynthesizer().synthesize("Hi.")))
    sound = 200 + 150 + 200
    assert abs(len(out) - ms(CONFIG.onset_ms + sound + CONFIG.sentence_pause_ms)) <= ms(FRAME_MS)
    long_gap = FakePaddedSynthesizer([noise(300, 1), tone(200), noise(2000, 2), tone(200), noise(500, 3)])
    out = trimmed(list(long_gap.synthesize("Hi.")))
    sound = 200 + CONFIG.max_inner_silence_ms + 200
    assert abs(len(out) - ms(CONFIG.onset_ms + sound + CONFIG.sentence_pause_ms)) <= ms(FRAME_MS)


def test_any_chunking_gives_the_same_audio() -> None:
    audio = np.concatenate(FakePaddedSynthesizer().parts)
    expected = trimmed([audio])
    rng = random.Random(7)
    cuts = [[1], [7], [ms(5)], [ms(37)], [4800], [len(audio)], [rng.randint(1, 2000) for _ in range(200)]]
    for sizes in cuts:
        chunks: list[Audio] = []
        start = 0
        while start < len(audio):
            size = sizes[len(chunks) % len(sizes)]
            chunks.append(audio[start:start + size])
            start += size
        assert np.array_equal(trimmed(chunks), expected), sizes[:3]


def test_a_phrase_of_silence_gives_nothing() -> None:
    assert len(trimmed([noise(400, 4), noise(300, 5)])) == 0
    assert len(trimmed([np.zeros(ms(500), dtype=np.float32)])) == 0


def test_disabled_trimming_passes_the_audio_as_it_is() -> None:
    chunks = list(FakePaddedSynthesizer().synthesize("Hello there."))
    off = TrimConfig(enabled=False)
    pieces = list(trim_phrase(chunks, RATE, "Hello there.", off))
    assert len(pieces) == len(chunks) and all(np.array_equal(a, b) for a, b in zip(pieces, chunks, strict=True))


def test_audio_without_silence_passes_as_it_is() -> None:
    audio = tone(300)
    assert np.array_equal(trimmed([audio[:1000], audio[1000:]]), audio)


def test_the_first_sound_goes_before_the_last_chunk_is_made() -> None:
    synth = FakePaddedSynthesizer()
    pieces = trim_phrase(synth.synthesize("Hello there."), RATE, "Hello there.", CONFIG)
    first = next(pieces)
    assert len(audible(first)) and synth.consumed < synth.total / 2, (synth.consumed, synth.total)


def test_a_trimmer_holds_back_only_silence() -> None:
    trimmer = SilenceTrimmer(RATE, 250, CONFIG)
    assert len(trimmer.push(noise(100, 6))) == 0  # silence before any sound: held (its last onset_ms) or dropped
    out = trimmer.push(tone(50))
    assert len(out) == ms(CONFIG.onset_ms + 50)  # the sound at once, its onset margin before it
    assert len(trimmer.push(noise(100, 7))) == 0  # silence after the sound: held until the sound resumes
    assert len(trimmer.push(tone(20))) == ms(100 + 20)


async def _phrases(*texts: str) -> AsyncIterator[ReplyEvent]:
    for i, text in enumerate(texts):
        yield Phrase(1, i, text, text, 0.0)


async def test_the_tts_stage_sends_sound_at_once_and_a_pause_between_phrases() -> None:
    synth = FakePaddedSynthesizer([noise(300, 1), tone(400), noise(500, 3)])
    worker = ModelWorker("tts-test")
    try:
        consumed_at_first_audio = None
        audio: dict[int, list[Audio]] = {0: [], 1: []}
        async for event in tts_stage(_phrases("Hello there,", "how are you?"), synth, worker, 16000, FakeClock(),
                                     CONFIG):
            if isinstance(event, ReplyAudio):
                if consumed_at_first_audio is None:
                    consumed_at_first_audio = synth.consumed
                audio[event.phrase_index].append(event.samples)
    finally:
        worker.shutdown()
    assert consumed_at_first_audio is not None and consumed_at_first_audio < synth.total
    for index, pause in ((0, CONFIG.clause_pause_ms), (1, CONFIG.sentence_pause_ms)):
        out = np.concatenate(audio[index])
        loud = audible(out)
        # at 16 kHz: the onset margin before the sound, the pause after it (within a frame or two of resampling)
        assert abs(loud[0] - 16 * CONFIG.onset_ms) <= 16 * 2, loud[0]
        assert abs(len(out) - loud[-1] - 16 * pause) <= 16 * (FRAME_MS + 2), (len(out) - loud[-1], pause)
