"""The turn's prosody at a pause (pipeline/prosody.py), on synthetic voiced sound whose pitch, length and
level are known."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.prosody import measure, pitch_track

RATE = 16000


def voiced(hz_from: float, hz_to: float, seconds: float, level: float = 0.3) -> np.ndarray:
    """A vowel-like sound: a fundamental gliding from hz_from to hz_to, with two harmonics."""
    n = int(seconds * RATE)
    phase = 2 * np.pi * np.cumsum(np.geomspace(hz_from, hz_to, n)) / RATE
    return (level * (np.sin(phase) + 0.5 * np.sin(2 * phase) + 0.25 * np.sin(3 * phase))).astype(np.float32)


def gap(seconds: float = 0.08) -> np.ndarray:
    return np.zeros(int(seconds * RATE), np.float32)


def syllables(*parts: np.ndarray) -> np.ndarray:
    return np.concatenate([x for p in parts for x in (p, gap())])


@pytest.mark.parametrize("hz", [85.0, 140.0, 220.0, 330.0])
def test_the_pitch_of_a_steady_voice_is_found_within_a_few_cents(hz: float) -> None:
    semitones, level = pitch_track(voiced(hz, hz, 0.5))
    found = 100 * 2 ** (np.nanmedian(semitones) / 12)
    assert abs(found - hz) / hz < 0.01
    assert np.mean(~np.isnan(semitones)) > 0.9 and np.all(level > -30)


def test_silence_and_noise_are_not_voiced() -> None:
    semitones, _ = pitch_track(np.zeros(RATE, np.float32))
    assert np.all(np.isnan(semitones))
    noise = np.random.default_rng(1).normal(0, 0.1, RATE).astype(np.float32)
    assert np.mean(~np.isnan(pitch_track(noise)[0])) < 0.1
    assert measure(noise) is None and measure(np.zeros(RATE, np.float32)) is None


def test_a_sentence_s_end_falls_to_the_bottom_of_the_range_and_a_broken_phrase_stays_level() -> None:
    body = [voiced(180, 200, 0.18), voiced(200, 170, 0.2), voiced(175, 190, 0.16)]
    ended = measure(syllables(*body, voiced(170, 120, 0.35, level=0.15)))
    broken = measure(syllables(*body, voiced(185, 185, 0.12)))
    assert ended is not None and broken is not None
    assert ended.pitch_end < -1 < broken.pitch_end
    assert ended.pitch_slope < -1 and abs(broken.pitch_slope) < 0.5
    assert ended.final_stretch > 0.5 > broken.final_stretch  # the last syllable drawn out
    assert ended.energy_drop < -3 < broken.energy_drop  # and fading


def test_the_measures_are_the_speaker_s_own_a_voice_an_octave_up_reads_alike() -> None:
    low = [voiced(110, 120, 0.18), voiced(120, 105, 0.2), voiced(110, 80, 0.3)]
    high = [voiced(220, 240, 0.18), voiced(240, 210, 0.2), voiced(220, 160, 0.3)]
    a, b = measure(syllables(*low)), measure(syllables(*high))
    assert a is not None and b is not None
    assert a.pitch_end == pytest.approx(b.pitch_end, abs=0.2)
    assert a.pitch_slope == pytest.approx(b.pitch_slope, abs=0.3)


def test_other_sample_rates_are_refused() -> None:
    with pytest.raises(ValueError, match="16000"):
        pitch_track(np.zeros(8000, np.float32), rate=8000)
