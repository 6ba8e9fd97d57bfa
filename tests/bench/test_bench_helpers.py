"""The benchmarks' own arithmetic: the learned decision's fit, and when a reply is first heard."""

from __future__ import annotations

import numpy as np

from bench.turn_train import fit_logistic, slopes
from bench.voice_latency import first_audible


def test_the_logistic_fit_finds_the_weights_that_made_the_labels() -> None:
    rng = np.random.default_rng(7)
    x = np.column_stack([np.ones(20000), rng.normal(size=20000), rng.normal(size=20000)])
    truth = np.array([-0.5, 2.0, -1.0])
    y = (rng.random(20000) < 1 / (1 + np.exp(-x @ truth))).astype(float)
    w = fit_logistic(x, y, l2=0.0)
    assert np.allclose(w, truth, atol=0.1), w


def test_slopes_add_up_the_knees() -> None:
    assert slopes({"log_p_words": 0.5, "log_p_words_above_-3": 1.0, "log_p_words_above_-0.75": -2.0}) == [
        0.5, 0.5, 1.5, 1.5, -0.5]


def _pcm(samples: np.ndarray) -> bytes:
    return (samples * 32767).astype("<i2").tobytes()


def test_the_first_audible_sample_counts_leading_silence_as_waiting() -> None:
    rate = 16000
    silence, tone = np.zeros(rate // 4), np.full(rate // 10, 0.5)  # 250 ms of padding, then sound
    chunks = [(10.0, _pcm(silence[:2000])), (10.05, _pcm(silence[2000:])), (10.06, _pcm(tone))]
    # the chunks come ahead of playback: the sound plays 250 ms after the first chunk arrived
    assert first_audible(chunks, rate) == 10.0 + 0.25
    # a chunk that comes late delays what follows it
    late = [(10.0, _pcm(silence)), (10.4, _pcm(tone))]
    assert first_audible(late, rate) == 10.4
    assert first_audible([(10.0, _pcm(silence))], rate) is None  # nothing audible at all
    quiet = np.full(rate // 10, 10 ** (-50 / 20))  # -50 dBFS: below the -40 dBFS an ear is given
    assert first_audible([(10.0, _pcm(quiet)), (10.1, _pcm(tone))], rate) == 10.1
