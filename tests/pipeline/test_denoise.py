"""Noise suppression (pipeline/denoise.py): speexdsp's suppressor on real speech (espeak-ng) over steady noise, its
fixed delay, the suppressor per line, and the stage over a call's frames."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from pipeline.config import NoiseConfig
from pipeline.denoise import FRAME, SpeexSuppressor, Suppressor, make, suppress_noise
from pipeline.echo import available
from pipeline.events import AudioFrame
from tests.speech import speech_samples

needs_speexdsp = pytest.mark.skipif(not available(), reason="libspeexdsp is not installed (scripts/setup.sh does it)")
RATE = 16000


def db(x: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(np.asarray(x, dtype=np.float64) ** 2) + 1e-15))


def brown_noise(n: int, level_db: float, seed: int = 0) -> np.ndarray:
    walk = np.cumsum(np.random.default_rng(seed).standard_normal(n))
    walk -= np.convolve(walk, np.ones(801) / 801, mode="same")  # no drift: a steady rumble
    return (walk * 10 ** (level_db / 20) / np.sqrt(np.mean(walk ** 2))).astype(np.float32)


def speech(text: str, tmp: Path) -> np.ndarray:
    return speech_samples(text, tmp).astype(np.float32) / 32768.0


def run(suppressor: Suppressor, audio: np.ndarray, chunk: int) -> np.ndarray:
    return np.concatenate([suppressor.process(audio[i:i + chunk]) for i in range(0, len(audio), chunk)])


def made(spec: str) -> Suppressor:
    suppressor = make(spec)
    assert suppressor is not None
    return suppressor


@needs_speexdsp
@pytest.mark.parametrize("spec", ["speex-15", "speex-40"])
@pytest.mark.parametrize("chunk", [160, 320, 437])
def test_what_comes_out_is_the_whole_frames_a_fixed_delay_behind(tmp_path: Path, spec: str, chunk: int) -> None:
    said = speech("What time does the last train leave tonight?", tmp_path)
    audio = np.concatenate([np.zeros(RATE // 2, np.float32), said, np.zeros(RATE // 2, np.float32)])
    audio += brown_noise(len(audio), -50)
    suppressor = made(spec)
    out = run(suppressor, audio, chunk)
    assert len(out) == len(audio) // FRAME * FRAME
    lags = [float(np.dot(audio[:len(out) - k], out[k:])) for k in range(600)]
    assert int(np.argmax(lags)) == suppressor.delay


@needs_speexdsp
@pytest.mark.parametrize("spec", ["speex-25"])
def test_steady_noise_is_taken_down_and_the_speech_over_it_kept(tmp_path: Path, spec: str) -> None:
    said = speech("Can you book a table for two at eight tonight?", tmp_path)
    lead = 2 * RATE  # the suppressor learns the noise before the caller talks, as on a call
    clean = np.concatenate([np.zeros(lead, np.float32), said, np.zeros(RATE // 2, np.float32)])
    active = np.abs(said) > 0.01
    noise = brown_noise(len(clean), db(said[active]) - 10)  # 10 dB below the voice
    suppressor = made(spec)
    out = run(suppressor, clean + noise, 320)
    d = suppressor.delay
    aligned = np.concatenate([out[d:], np.zeros(len(clean) - len(out) + d, np.float32)])
    quiet = slice(RATE, lead - RATE // 10)  # noise alone, once learned
    assert db(aligned[quiet]) < db(noise[quiet]) - 8  # measured: 12 dB
    talk = slice(lead, lead + len(said))
    kept = db(aligned[talk][active])
    assert kept > db(said[active]) - 4  # the voice is not taken for noise
    # nearer the clean speech than what went in was
    assert np.mean((aligned[talk] - clean[talk]) ** 2) < 0.9 * np.mean(noise[talk] ** 2)  # measured: 0.38


def test_the_suppressor_follows_the_line_and_the_switch() -> None:
    config = NoiseConfig(wideband="speex-10", narrowband="speex-30")
    assert config.for_line(8000) == "speex-30"
    assert config.for_line(16000) == config.for_line(48000) == "speex-10"
    assert NoiseConfig().for_line(16000) == "off"
    assert NoiseConfig(enabled=False).for_line(8000) == "off"
    assert make("off") is None
    for wrong in ("speex+6", "speex-0", "speex-61", "webrtc2", "rnnoise", "Speex-15"):
        with pytest.raises(ValidationError):
            NoiseConfig(wideband=wrong)
        with pytest.raises(ValueError, match="unknown noise suppressor"):
            make(wrong)


@needs_speexdsp
async def test_the_stage_gives_the_vad_the_audio_as_it_came_and_the_recognizer_the_suppressed() -> None:
    sent = [np.full(250, 0.01 * (i + 1), np.float32) for i in range(10)]

    async def frames() -> AsyncIterator[AudioFrame]:
        for i, samples in enumerate(sent):
            yield AudioFrame(samples, 1.0 + 0.02 * i)

    suppressor = made("speex-15")
    got = [frame async for frame in suppress_noise(frames(), suppressor)]
    assert sum(len(f.samples) for f in got) == 2500 // FRAME * FRAME
    assert all(f.heard is not None and len(f.heard) == len(f.samples) and len(f.samples) % FRAME == 0 for f in got)
    came = np.concatenate([f.samples for f in got])
    assert np.array_equal(came, np.concatenate([np.zeros(suppressor.delay, np.float32), *sent])[:len(came)])
    assert [f.at for f in got] == sorted(f.at for f in got) and got[0].at >= 1.0


@needs_speexdsp
def test_a_quiet_line_passes_as_it_came_and_a_noisy_one_is_suppressed(tmp_path: Path) -> None:
    said = speech("My name is Alice.", tmp_path)
    quiet = np.concatenate([np.zeros(RATE, np.float32), said, np.zeros(RATE // 2, np.float32)])
    quiet += brown_noise(len(quiet), -70)  # a quiet room on a good line: nothing to take out
    gated = made_gated("speex-25", -50)
    out = run(gated, quiet, 320)
    pcm = np.round(np.clip(quiet, -1, 1) * 32767) / 32768  # what the 16-bit frames hold
    d = gated.delay
    assert not gated.on and gated.floor_dbfs is not None and gated.floor_dbfs < -60
    assert np.allclose(out[d:], pcm[:len(out) - d], atol=1.5 / 32768)
    noisy = quiet + brown_noise(len(quiet), -30, seed=1)
    gated = made_gated("speex-25", -50)
    out = run(gated, noisy, 320)
    assert gated.on and gated.floor_dbfs is not None and gated.floor_dbfs > -50
    lead = slice(RATE // 2, RATE - RATE // 10)  # noise alone, once the line's background is known
    assert db(out[lead.start + d:lead.stop + d]) < db(noisy[lead]) - 8


def made_gated(spec: str, min_floor_dbfs: float) -> SpeexSuppressor:
    suppressor = make(spec, min_floor_dbfs)
    assert isinstance(suppressor, SpeexSuppressor)
    return suppressor
