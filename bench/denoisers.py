"""Noise suppressors for bench/noise_asr.py: the service's own (pipeline/denoise.py, `speex-N`) and two it was
measured against and does not ship (`pip install -e '.[bench-noise]'`), each streaming 16 kHz float audio with a
fixed `delay` in samples:
- `webrtcN`: WebRTC's noise suppressor at level N (1 mild to 4; PyPI `webrtc-noise-gain`, Home Assistant's
  wrapper of webrtc-audio-processing), 10 ms frames; it lags by its 6 ms look-ahead;
- `rnnoise`: Xiph's RNNoise (PyPI `pyrnnoise`'s library), 48 kHz 10 ms frames, resampled around it (soxr "QQ",
  whose streams give out as much as they take at once, so the delay stays fixed).
"""

from __future__ import annotations

import ctypes

import numpy as np
import soxr

from pipeline import denoise

RATE = 16000


class WebRtc(denoise.FramedSuppressor):
    """WebRTC's noise suppressor at `level` (1-4), its automatic gain off."""

    delay = 96

    def __init__(self, level: int) -> None:
        super().__init__()
        try:
            from webrtc_noise_gain import AudioProcessor
        except ImportError as exc:
            raise RuntimeError("the webrtc suppressor needs the webrtc-noise-gain package: pip install -e "
                               "'.[bench-noise]'") from exc
        self._processor = AudioProcessor(0, level)

    def _frame(self, pcm: np.ndarray) -> None:
        pcm[:] = np.frombuffer(self._processor.Process10ms(pcm.tobytes()).audio, dtype="<i2")


class Rnnoise:
    def __init__(self) -> None:
        from pyrnnoise import rnnoise

        self.delay = 320  # RNNoise's look-ahead through the two resamplers, measured
        self._lib = rnnoise.lib
        self._state = rnnoise.create()
        self._up = soxr.ResampleStream(RATE, 48000, 1, dtype="float32", quality="QQ")
        self._down = soxr.ResampleStream(48000, RATE, 1, dtype="float32", quality="QQ")
        self._pending = np.zeros(0, dtype=np.float32)
        self._in = np.zeros(480, dtype=np.float32)
        self._out = np.zeros(480, dtype=np.float32)

    def process(self, samples: np.ndarray) -> np.ndarray:
        self._pending = np.concatenate([self._pending, self._up.resample_chunk(samples.astype(np.float32))])
        whole = len(self._pending) // 480 * 480
        pointer = ctypes.POINTER(ctypes.c_float)
        done = []
        for i in range(0, whole, 480):
            self._in[:] = self._pending[i:i + 480] * 32768.0
            self._lib.rnnoise_process_frame(self._state, self._out.ctypes.data_as(pointer),
                                            self._in.ctypes.data_as(pointer))
            done.append(self._out / 32768.0)
        self._pending = self._pending[whole:]
        if not done:
            return np.zeros(0, dtype=np.float32)
        out: np.ndarray = self._down.resample_chunk(np.concatenate(done).astype(np.float32))
        return out

    def __del__(self) -> None:
        if getattr(self, "_state", None) is not None:
            self._lib.rnnoise_destroy(self._state)
            self._state = None


def make(name: str, min_floor_dbfs: float | None = None) -> denoise.Suppressor:
    """`rnnoise`, `webrtc1`-`webrtc4`, or a setting of session.noise (`speex-25`, on only where the line's background
    is at least `min_floor_dbfs`, as the service runs it)."""
    if name == "rnnoise":
        return Rnnoise()
    if name.startswith("webrtc") and name[6:] in ("1", "2", "3", "4"):
        return WebRtc(int(name[6:]))
    suppressor = denoise.make(name, min_floor_dbfs)
    if suppressor is None:
        raise ValueError("'off' is no suppressor")
    return suppressor
