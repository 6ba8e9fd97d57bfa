"""Noise families for the benchmarks of callers in the real world (issue 36), tuned on some, reported on others.

Every noise is made here, from a seed, so a run can be repeated exactly:
- tune: `babble-espeak` (four espeak-ng voices talking at once, other people in a room), `brown` (a car's rumble),
  `pink` (a fan, an air conditioner);
- for one voice in the background, a tune family apart: `tv-espeak` (one espeak-ng voice reading on and on), to tune
  on what `tv-flite` is to report on (bench/noise_calls.py --families tv-espeak);
- held out: `babble-flite` (four of Debian flite's voices), `tv-flite` (one flite voice reading on and on, a television
  or a radio), `white` (hiss), `music` (chords of harmonic tones changing every 0.4-0.8 s over a beat).
`mix()` puts a noise under speech at a signal-to-noise ratio: the noise's RMS that many dB below the RMS of the
speech's active part (its 20 ms frames within 30 dB of its loudest).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.voices import RATE, Renderer, Voice

TUNE = ("babble-espeak", "brown", "pink")
HELD = ("babble-flite", "tv-flite", "white", "music")

# What the talkers in the babble and on the television say: none of it is a benchmark's question.
CHATTER = [
    "The weather was fine on Saturday so we walked along the river to the old mill and back.",
    "I told him the numbers twice but he kept asking for the whole list all over again.",
    "She said the train would leave at half past nine from the far platform.",
    "Nobody knows where the spare keys went after the party at the cottage.",
    "The recipe needs three eggs, a cup of flour and a little bit of butter.",
    "They are building a new bridge across the bay and it should open next spring.",
    "My brother has been learning the guitar for years and he still plays the same song.",
    "The museum moved the paintings upstairs while they repair the roof of the main hall.",
]
ESPEAK_TALKERS = [Voice("espeak-en-us", "espeak", "espeak-ng", "en-us", 1.0),
                  Voice("espeak-en-gb+f3", "espeak", "espeak-ng", "en-gb+f3", 1.05),
                  Voice("espeak-en-us+klatt2", "espeak", "espeak-ng", "en-us+klatt2", 0.95),
                  Voice("espeak-en-gb-scotland+m3", "espeak", "espeak-ng", "en-gb-scotland+m3", 0.9)]
FLITE_TALKERS = [Voice(f"flite-{v}", "flite", "flite", v, 1.0) for v in ("kal", "awb", "rms", "slt")]


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if len(x) else 0.0


def active_rms(speech: np.ndarray) -> float:
    """The RMS of the speech's 20 ms frames within 30 dB of its loudest frame."""
    n = len(speech) // 320
    frames = np.sqrt(np.mean(np.square(speech[:n * 320].reshape(n, 320), dtype=np.float64), axis=1))
    loud = frames[frames >= frames.max() * 10 ** (-30 / 20)]
    return float(np.sqrt(np.mean(loud ** 2)))


def _colored(rng: np.random.Generator, n: int, slope: float) -> np.ndarray:
    """Noise whose power falls as 1/f**slope (0 white, 1 pink, 2 brown)."""
    spectrum = np.fft.rfft(rng.standard_normal(n))
    f = np.arange(len(spectrum), dtype=np.float64)
    f[0] = 1.0
    return np.fft.irfft(spectrum / f ** (slope / 2), n)


def _talk(renderer: Renderer, talkers: list[Voice], rng: np.random.Generator, n: int) -> np.ndarray:
    """`talkers` each reading CHATTER in their own order, all at once, each at the same level."""
    out = np.zeros(n)
    for voice in talkers:
        track = np.zeros(0)
        while len(track) < n + RATE:
            speech = renderer.say(voice, CHATTER[rng.integers(len(CHATTER))]).astype(np.float64)
            track = np.concatenate([track, speech / max(rms(speech), 1e-9), np.zeros(int(RATE * rng.uniform(0, 0.3)))])
        start = int(rng.integers(0, RATE))
        out += track[start:start + n]
    return out


def _music(rng: np.random.Generator, n: int) -> np.ndarray:
    t = np.arange(n) / RATE
    out = np.zeros(n)
    at = 0
    while at < n:
        length = min(n - at, int(RATE * rng.uniform(0.4, 0.8)))
        root = 110.0 * 2 ** (rng.integers(0, 12) / 12)
        for step in (0, 4, 7):  # a major triad, each tone with five harmonics
            f0 = root * 2 ** (step / 12)
            for h in range(1, 6):
                out[at:at + length] += np.sin(2 * np.pi * f0 * h * t[:length]) / h
        out[at:at + length] *= np.exp(-t[:length] * 1.5)
        at += length
    beat = np.zeros(n)
    for start in range(0, n, RATE // 2):  # a soft thump twice a second
        k = np.arange(min(1600, n - start))
        beat[start:start + len(k)] = np.sin(2 * np.pi * 60 * k / RATE) * np.exp(-k / 400) * 3
    return out + beat


def noise(family: str, seconds: float, seed: int, renderer: Renderer) -> np.ndarray:
    """`seconds` of the noise family `family` at 16 kHz, RMS 1 (scaled by `mix`)."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    makers: dict[str, Callable[[], np.ndarray]] = {
        "babble-espeak": lambda: _talk(renderer, ESPEAK_TALKERS, rng, n),
        "babble-flite": lambda: _talk(renderer, FLITE_TALKERS, rng, n),
        "tv-flite": lambda: _talk(renderer, FLITE_TALKERS[1:2], rng, n),
        "tv-espeak": lambda: _talk(renderer, ESPEAK_TALKERS[1:2], rng, n),
        "white": lambda: rng.standard_normal(n),
        "pink": lambda: _colored(rng, n, 1.0),
        "brown": lambda: _colored(rng, n, 2.0),
        "music": lambda: _music(rng, n),
    }
    made = makers[family]()
    return made / max(rms(made), 1e-12)


def mix(speech: np.ndarray, noise_rms1: np.ndarray, snr_db: float, at: int) -> np.ndarray:
    """`noise_rms1` (RMS 1) at `snr_db` below the speech's active RMS, with the speech added from sample `at`;
    float32, scaled down as a whole if it would clip."""
    out = noise_rms1 * active_rms(speech) * 10 ** (-snr_db / 20)
    out[at:at + len(speech)] += speech
    peak = float(np.max(np.abs(out)))
    return (out / peak * 0.9 if peak > 0.9 else out).astype(np.float32)
