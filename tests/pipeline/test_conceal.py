"""The concealment of lost packets (pipeline/conceal.py): the last pitch period carried across a short
loss, fading to silence, and nothing made up where nothing voiced was heard."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pipeline.conceal import FADE_S, HOLD_S, Concealer


def voiced(rate: int, seconds: float, pitch: float = 150.0, start: int = 0) -> np.ndarray:
    t = (start + np.arange(int(seconds * rate))) / rate
    return (0.3 * np.sin(2 * np.pi * pitch * t) + 0.1 * np.sin(2 * np.pi * 3 * pitch * t)).astype(np.float32)


@pytest.mark.parametrize("rate", [8000, 16000])
def test_a_lost_packet_in_a_vowel_is_carried_on_in_its_pitch(rate: int) -> None:
    concealer = Concealer(rate)
    heard = voiced(rate, 0.06)
    concealer.heard(heard)
    packet = int(0.02 * rate)
    fill = concealer.fill(packet)
    truth = voiced(rate, 0.02, start=len(heard))  # what the lost packet held
    assert np.corrcoef(fill, truth)[0, 1] > 0.95
    assert np.sqrt(np.mean(fill ** 2)) == pytest.approx(np.sqrt(np.mean(truth ** 2)), rel=0.1)


def test_a_long_loss_fades_to_silence_across_fills() -> None:
    rate = 16000
    concealer = Concealer(rate)
    concealer.heard(voiced(rate, 0.06))
    packet = int(0.02 * rate)
    fills = [concealer.fill(packet) for _ in range(6)]
    levels = [float(np.sqrt(np.mean(f ** 2))) for f in fills]
    assert levels[0] > 0.1  # the first packet at full level
    assert all(a >= b for a, b in itertools.pairwise(levels))  # then only fading
    held = int((HOLD_S + FADE_S) / 0.02)
    assert all(level == 0 for level in levels[held:])  # silence once the fade is over
    # the fills follow on from one another: no jump where one ends and the next begins
    joined = np.concatenate(fills[:2])
    assert abs(joined[packet] - joined[packet - 1]) < 0.1


def test_nothing_is_made_up_where_nothing_voiced_was_heard() -> None:
    rate = 16000
    assert not Concealer(rate).fill(320).any()  # no history
    concealer = Concealer(rate)
    concealer.heard(np.zeros(1600, dtype=np.float32))
    assert not concealer.fill(320).any()  # silence heard
    noisy = Concealer(rate)
    noisy.heard(np.random.default_rng(1).normal(0, 0.1, 1600).astype(np.float32))
    assert not noisy.fill(320).any()  # noise has no period to repeat


def test_audio_heard_again_starts_a_new_concealment_at_full_level() -> None:
    rate = 16000
    concealer = Concealer(rate)
    concealer.heard(voiced(rate, 0.06))
    for _ in range(5):
        concealer.fill(320)
    concealer.heard(voiced(rate, 0.06, start=5000))
    assert np.sqrt(np.mean(concealer.fill(320) ** 2)) > 0.1
