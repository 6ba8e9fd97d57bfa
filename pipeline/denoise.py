"""Noise suppression on the caller's audio, for the recognizer (issue 36, item 2).

`speex-N`: speexdsp's preprocessor (its spectral noise estimate, at most N dB of attenuation), through ctypes on the
Debian library libspeexdsp1 that echo cancellation loads too, streaming over the session's 16 kHz line in 10 ms
frames; what comes out lags by one frame (its overlap), and what is left of a frame not yet whole waits for the
next samples. It takes out steady noise (a fan, a car, hiss); other people talking is not its to remove (the VAD's
noise floor gate, pipeline/noise_floor.py, keeps them from holding a turn open).

Whether and how hard it runs is set per line (session.noise), chosen by the recognizer's word error rate in noise
with it and without (bench/noise_asr.py, against WebRTC's suppressor and RNNoise too): on by default only on a
phone line, the one line where it helped both on the noise it was tuned on and on noise it was not.
"""

from __future__ import annotations

import ctypes
import math
import re
from collections import deque
from collections.abc import AsyncIterator
from typing import Protocol

import numpy as np

from models.protocols import Audio
from pipeline.audio import float_to_pcm16
from pipeline.config import NOISE_SUPPRESSOR
from pipeline.echo import speexdsp
from pipeline.events import AudioFrame
from pipeline.noise_floor import SILENT_POWER

RATE = 16000
FRAME = 160  # 10 ms
OFF = "off"
SPEC = re.compile(NOISE_SUPPRESSOR)
_PREPROCESS_SET_DENOISE = 0
_PREPROCESS_SET_NOISE_SUPPRESS = 18


class Suppressor(Protocol):
    delay: int  # samples the output lags the input by, once frames are whole (measured: tests/pipeline)

    def process(self, samples: Audio) -> Audio:
        """16 kHz float samples in; the whole 10 ms frames so far out."""
        ...


class FramedSuppressor:
    """What every suppressor here shares: 16-bit 10 ms frames, each suppressed in place by `_frame`."""

    def __init__(self) -> None:
        self._pending = np.zeros(0, dtype=np.float32)

    def process(self, samples: Audio) -> Audio:
        self._pending = np.concatenate([self._pending, samples.astype(np.float32, copy=False)])
        whole = len(self._pending) // FRAME * FRAME
        if not whole:
            return np.zeros(0, dtype=np.float32)
        pcm = np.frombuffer(float_to_pcm16(self._pending[:whole]), dtype="<i2").copy()
        self._pending = self._pending[whole:]
        for i in range(0, whole, FRAME):
            self._frame(pcm[i:i + FRAME])
        return pcm.astype(np.float32) / 32768.0

    def _frame(self, pcm: np.ndarray) -> None:
        """Suppress one frame of 16-bit samples in place."""
        raise NotImplementedError


class SpeexSuppressor(FramedSuppressor):
    """speexdsp's noise suppression at `level_db` (its most attenuation of what it estimates as noise). With
    `min_floor_dbfs`, only on a noisy line: while the line's background (the `PERCENTILE`th percentile of its 10 ms
    levels over the last `WINDOW_S`) is quieter than that, what comes out is what went in, as late (a quiet line has
    nothing to take out, and its speech is best left as it is); it turns on at that level and off `RELEASE_DB`
    under it. The suppressor runs throughout, so that its estimate of the noise is ready when the noise comes."""

    delay = FRAME
    WINDOW_S = 4.0
    PERCENTILE = 10
    RELEASE_DB = 6.0
    MIN_HEARD_S = 0.5  # the background is not known before this much of the line was heard

    def __init__(self, level_db: int, min_floor_dbfs: float | None = None) -> None:
        super().__init__()
        self._lib = speexdsp()
        self._state = self._lib.speex_preprocess_state_init(FRAME, RATE)
        if not self._state:
            raise RuntimeError("speexdsp could not make a noise suppressor")
        for request, value in ((_PREPROCESS_SET_DENOISE, 1), (_PREPROCESS_SET_NOISE_SUPPRESS, level_db)):
            arg = ctypes.c_int(value)
            self._lib.speex_preprocess_ctl(self._state, request, ctypes.byref(arg))
        self.min_floor_dbfs = min_floor_dbfs
        self.on = min_floor_dbfs is None
        self.floor_dbfs: float | None = None
        self._levels: deque[float] = deque(maxlen=round(self.WINDOW_S * RATE / FRAME))
        self._last = np.zeros(FRAME, dtype=np.int16)  # the frame before, as it came: what goes out while off

    def _frame(self, pcm: np.ndarray) -> None:
        came = pcm.copy()
        self._lib.speex_preprocess_run(self._state, pcm.ctypes.data)
        if self.min_floor_dbfs is not None:
            self._follow(came)
            if not self.on:
                pcm[:] = self._last
        self._last = came

    def _follow(self, came: np.ndarray) -> None:
        assert self.min_floor_dbfs is not None
        power = float(np.mean((came.astype(np.float64) / 32768.0) ** 2))
        self._levels.append(10 * math.log10(power + SILENT_POWER))
        if len(self._levels) < self.MIN_HEARD_S * RATE / FRAME or len(self._levels) % 10:
            return  # a percentile every 100 ms: the background moves slower than that
        self.floor_dbfs = float(np.percentile(self._levels, self.PERCENTILE))
        if self.floor_dbfs >= self.min_floor_dbfs:
            self.on = True
        elif self.floor_dbfs < self.min_floor_dbfs - self.RELEASE_DB:
            self.on = False

    def __del__(self) -> None:
        if getattr(self, "_state", None):
            self._lib.speex_preprocess_state_destroy(self._state)
            self._state = None


def make(spec: str, min_floor_dbfs: float | None = None) -> Suppressor | None:
    """A fresh suppressor for one call from its setting (`speex-25`), or None for `off`; with `min_floor_dbfs`, on
    only while the line is that noisy."""
    if not SPEC.match(spec):
        raise ValueError(f"unknown noise suppressor {spec!r}: off or speex-N (at most N dB, 1-60)")
    if spec == OFF:
        return None
    return SpeexSuppressor(-int(spec[6:]), min_floor_dbfs)


async def suppress_noise(frames: AsyncIterator[AudioFrame], suppressor: Suppressor) -> AsyncIterator[AudioFrame]:
    """The caller's frames, each as soon as its 10 ms frames are whole, with the suppressor's output as what the
    recognizer hears (`heard`) and the audio as it came, as late, as what the VAD hears: the endpointer and the
    barge-in are left as they were (a suppressor changes the level of what is not the caller, which the noise floor
    gate reads; bench/noise_turns.py --suppressor), and the words are taken from the cleaner audio. `at` stays the
    arrival of the frame whose samples completed them."""
    came = np.zeros(suppressor.delay, dtype=np.float32)  # the audio as it came, as late as the suppressor's
    async for frame in frames:
        out = suppressor.process(frame.samples)
        came = np.concatenate([came, frame.samples.astype(np.float32, copy=False)])
        if len(out):
            yield AudioFrame(came[:len(out)], frame.at, heard=out)
            came = came[len(out):]
