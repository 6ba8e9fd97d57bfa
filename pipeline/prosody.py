"""How a caller's turn sounds at a pause, measured against the caller's own voice so far: evidence for
the end-of-turn decision that does not depend on the words (pipeline/turn_model.py).

A sentence's end is usually said differently from a phrase broken off mid-way: the pitch falls to the
bottom of the speaker's range (or rises, on a question), the last syllable is drawn out, and the voice
fades. A phrase cut after "a" or "for" stays level and short. Every measure is relative to the same
caller's turn so far, so a high voice and a low one, a loud line and a quiet one, read alike:

- `pitch_end`: the pitch of the last 50 ms voiced, in semitones from the turn's median, over the
  turn's spread (half its 10-90 % range, at least 1 semitone);
- `pitch_slope`: how the pitch moves over the last voiced 150 ms, in semitones per 100 ms;
- `final_stretch`: the last voiced stretch's length against the turn's median stretch (natural log);
- `energy_drop`: the last 100 ms of voiced sound's level against the turn's median voiced level (dB).

Pitch is found per 10 ms frame by YIN's cumulative mean normalised difference (de Cheveigné and
Kawahara, 2002), 60-400 Hz, on 16 kHz audio; a few milliseconds for a 10 s turn.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

RATE = 16000
PITCH_RATE = 8000  # pitch is tracked on the audio halved to 8 kHz (voices stay under 400 Hz)
HOP = 80  # 10 ms at PITCH_RATE
WINDOW = 200  # 25 ms: the difference function's integration window
MIN_HZ, MAX_HZ = 60.0, 400.0
YIN_THRESHOLD = 0.3  # a frame is voiced where the normalised difference dips below this
JUMP = 4.0  # semitones: a frame this far off its neighbours is an error, not the voice
MIN_VOICED_FRAMES = 15  # less voiced sound than this (150 ms) in a turn: no prosody
MAX_TURN_S = 8.0  # only the turn's last 8 s are measured (what the end-of-turn model hears)
SILENT_DB = -50.0  # frames quieter than this are never voiced
NAMES = ("pitch_end", "pitch_slope", "final_stretch", "energy_drop")


@dataclass(frozen=True)
class Prosody:
    pitch_end: float
    pitch_slope: float
    final_stretch: float
    energy_drop: float

    def as_dict(self) -> dict[str, float]:
        return {n: round(float(getattr(self, n)), 4) for n in NAMES}


def pitch_track(audio: np.ndarray, rate: int = RATE) -> tuple[np.ndarray, np.ndarray]:
    """(semitones re 100 Hz or NaN where unvoiced, level in dBFS), per 10 ms frame of 16 kHz audio."""
    if rate != RATE:
        raise ValueError(f"pitch_track takes {RATE} Hz audio, not {rate}")
    x = np.asarray(audio, dtype=np.float64)
    x = (x[0:len(x) - 1:2] + x[1::2]) / 2  # to 8 kHz (a two-tap average: a zero at 4 kHz against aliasing)
    max_lag = int(PITCH_RATE / MIN_HZ)
    min_lag = int(PITCH_RATE / MAX_HZ)
    span = WINDOW + max_lag
    if len(x) < span:
        return np.full(0, np.nan), np.full(0, -120.0)
    n = (len(x) - span) // HOP + 1
    frames = np.lib.stride_tricks.sliding_window_view(x, span)[::HOP][:n]  # [frames, span]
    head = frames[:, :WINDOW]
    level = 10 * np.log10(np.mean(head**2, axis=1) + 1e-12)  # [frames]
    size = 1 << int(np.ceil(np.log2(span + WINDOW)))
    cross = np.fft.irfft(np.conj(np.fft.rfft(head, size)) * np.fft.rfft(frames, size), size)[:, :max_lag + 1]
    energy = np.cumsum(frames**2, axis=1)  # energy of x[t .. t+WINDOW) for each lag t
    shifted = energy[:, WINDOW - 1:WINDOW + max_lag] - np.concatenate(
        [np.zeros((n, 1)), energy[:, :max_lag]], axis=1)  # [frames, max_lag + 1]
    diff = np.maximum(shifted[:, :1] + shifted - 2 * cross, 0.0)  # YIN's d(tau)
    lags = np.arange(1, max_lag + 1)
    normalised = diff[:, 1:] * lags / np.maximum(np.cumsum(diff[:, 1:], axis=1), 1e-12)  # d'(tau), tau >= 1
    search = normalised[:, min_lag - 1:]
    below = search < YIN_THRESHOLD
    first = np.where(below.any(axis=1), below.argmax(axis=1), search.argmin(axis=1))
    rows = np.arange(n)
    # from the first dip, walk on to its local minimum
    for _ in range(8):
        nxt = np.minimum(first + 1, search.shape[1] - 1)
        step = search[rows, nxt] < search[rows, first]
        if not step.any():
            break
        first = np.where(step, nxt, first)
    best = search[rows, first]
    # the dip's bottom between lags, by a parabola through it and its neighbours
    left = search[rows, np.maximum(first - 1, 0)]
    right = search[rows, np.minimum(first + 1, search.shape[1] - 1)]
    curve = left - 2 * best + right
    shift = np.where(curve > 1e-9, 0.5 * (left - right) / np.where(curve > 1e-9, curve, 1.0), 0.0)
    lag = first + min_lag + np.clip(shift, -0.5, 0.5)
    voiced = (best < YIN_THRESHOLD) & (level > SILENT_DB)
    semitones = np.where(voiced, 12 * np.log2(PITCH_RATE / lag / 100.0), np.nan)
    return _smooth(semitones), level


def _smooth(semitones: np.ndarray) -> np.ndarray:
    """Drop the frames more than JUMP semitones off the median of their voiced neighbours (+-2 frames):
    the tracker's octave errors, common where a phone line has cut the fundamental away."""
    padded = np.concatenate([np.full(2, np.nan), semitones, np.full(2, np.nan)])
    near = np.lib.stride_tricks.sliding_window_view(padded, 5)  # [frames, 5]
    voiced_near = (~np.isnan(near)).sum(axis=1)
    with warnings.catch_warnings():  # an all-unvoiced neighbourhood has no median: NaN, as meant
        warnings.simplefilter("ignore", RuntimeWarning)
        centre = np.nanmedian(np.where(voiced_near[:, None] >= 3, near, np.nan), axis=1)
    off = np.abs(semitones - centre) > JUMP
    return np.where(off | np.isnan(centre), np.nan, semitones)


def _runs(voiced: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each voiced stretch, a one-frame gap bridged."""
    runs: list[tuple[int, int]] = []
    start, gap = -1, 0
    for i, v in enumerate(voiced):
        if v:
            if start < 0:
                start = i
            gap = 0
        elif start >= 0:
            gap += 1
            if gap > 1:
                runs.append((start, i - gap + 1))
                start, gap = -1, 0
    if start >= 0:
        runs.append((start, len(voiced) - gap))
    return runs


def measure(audio: np.ndarray, rate: int = RATE) -> Prosody | None:
    """The turn's prosody at its end (the audio from the turn's start to the pause), or None where it
    has too little voiced sound to tell."""
    audio = np.asarray(audio)[-int(MAX_TURN_S * rate):]
    semitones, level = pitch_track(audio, rate)
    voiced = ~np.isnan(semitones)
    if voiced.sum() < MIN_VOICED_FRAMES:
        return None
    pitch = semitones[voiced]
    median = float(np.median(pitch))
    spread = max(1.0, float(np.percentile(pitch, 90) - np.percentile(pitch, 10)) / 2)
    last = np.flatnonzero(voiced)
    pitch_end = (float(np.median(semitones[last[-5:]])) - median) / spread
    tail = last[last >= last[-1] - 14]  # the last 150 ms with a voiced frame in them
    slope = 0.0
    if len(tail) >= 4:
        slope = float(np.polyfit(tail.astype(np.float64), semitones[tail], 1)[0]) * 10  # per 100 ms
    runs = _runs(voiced)
    lengths = np.array([e - s for s, e in runs], dtype=np.float64)
    stretch = float(np.log(lengths[-1] / np.median(lengths))) if len(lengths) >= 2 else 0.0
    voiced_level = level[voiced]
    energy_drop = float(np.mean(level[last[-10:]]) - np.median(voiced_level))
    return Prosody(round(pitch_end, 4), round(float(np.clip(slope, -10, 10)), 4), round(stretch, 4),
                   round(energy_drop, 4))
