"""Smart Turn v3.2: an audio-only end-of-turn model (BSD-2-Clause), run with ONNX Runtime.

Given the caller's turn so far (16 kHz, the last 8 s at most), it says how likely the caller has
finished speaking, from intonation and rhythm rather than from silence alone. Its input is a
Whisper-style log-mel spectrogram of 8 s of audio, left-padded with zeros, computed here with NumPy
(no transformers, no pipecat): 80 Slaney mel bands, a 400-point periodic Hann STFT every 160
samples, log10, clamped to 8 below the maximum and scaled to about [-1, 1].
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from core.errors import BackendUnavailableError, ModelMissingError
from models.protocols import Audio

SAMPLE_RATE = 16000
SECONDS = 8
N_FFT = 400
HOP = 160
N_MELS = 80


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    linear = 3.0 * hz / 200.0
    return np.where(hz >= 1000.0, 15.0 + np.log(np.maximum(hz, 1e-9) / 1000.0) * 27.0 / np.log(6.4), linear)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    return np.where(mel >= 15.0, 1000.0 * np.exp((mel - 15.0) * np.log(6.4) / 27.0), 200.0 * mel / 3.0)


@functools.cache
def mel_filters(sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS) -> np.ndarray:
    """Triangular filters, area-normalized (Slaney), shape (n_mels, n_fft // 2 + 1)."""
    bins = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(np.array(0.0)), _hz_to_mel(np.array(sample_rate / 2)), n_mels + 2))
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins[None, :] - lower) / (centre - lower)
    falling = (upper - bins[None, :]) / (upper - centre)
    triangles = np.maximum(0.0, np.minimum(rising, falling))
    return triangles * (2.0 / (upper - lower))


@functools.cache
def _hann(n: int = N_FFT) -> np.ndarray:
    return 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)  # periodic


def log_mel(audio: Audio, normalize: bool = True) -> np.ndarray:
    """Whisper-style log-mel features of exactly SECONDS of 16 kHz audio: (80, 800) float32."""
    x = np.asarray(audio, dtype=np.float64)
    if normalize:  # zero mean, unit variance over the whole window, padding included
        x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
    padded = np.pad(x, N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP]
    power = np.abs(np.fft.rfft(frames * _hann(), axis=-1)) ** 2  # (frames, bins)
    mel = np.log10(np.maximum(mel_filters() @ power.T, 1e-10))[:, :-1]  # the last frame is dropped
    mel = np.maximum(mel, mel.max() - 8.0)
    return ((mel + 4.0) / 4.0).astype(np.float32)


def last_seconds(audio: Audio, seconds: float = SECONDS, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """The last `seconds` of the audio, left-padded with zeros to exactly that length."""
    want = int(seconds * sample_rate)
    x = np.asarray(audio, dtype=np.float32)[-want:]
    return np.pad(x, (want - len(x), 0)) if len(x) < want else x


class SmartTurn:
    """`probability(audio)`: how likely the caller's turn is complete, from its audio (16 kHz)."""

    name = "smart-turn-v3.2-cpu"
    sample_rate = SAMPLE_RATE

    def __init__(self, model_path: str | Path, threads: int = 1) -> None:
        try:
            import onnxruntime
        except ImportError as exc:
            raise BackendUnavailableError(f"the end-of-turn model needs onnxruntime: {exc}") from exc
        path = Path(model_path)
        if path.is_dir():
            path = path / "model.onnx"
        if not path.is_file():
            raise ModelMissingError(f"no end-of-turn model at {path}; run `voice-agent models fetch {self.name}`")
        opts = onnxruntime.SessionOptions()
        opts.inter_op_num_threads = 1
        opts.intra_op_num_threads = threads
        opts.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 4
        self._session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"],
                                                     sess_options=opts)

    def probability(self, audio: Audio) -> float:
        features = log_mel(last_seconds(audio))[None]
        (out,) = self._session.run(None, {"input_features": features})[:1]
        return float(np.asarray(out).reshape(-1)[0])
