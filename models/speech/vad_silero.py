"""Silero VAD v6 (the ONNX model shipped inside faster-whisper), run one 32 ms window at a time."""

from __future__ import annotations

import os

import numpy as np

from core.errors import BackendUnavailableError
from models.protocols import Audio

WINDOW = 512  # samples at 16 kHz
CONTEXT = 64  # samples of the previous window the model sees


class SileroStream:
    def __init__(self, session: object) -> None:
        self._session = session
        self._h = np.zeros((1, 1, 128), dtype=np.float32)
        self._c = np.zeros((1, 1, 128), dtype=np.float32)
        self._context = np.zeros(CONTEXT, dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)

    def probabilities(self, samples: Audio) -> list[float]:
        buf = np.concatenate([self._pending, samples.astype(np.float32, copy=False)])
        n = len(buf) // WINDOW
        self._pending = buf[n * WINDOW:]
        probs: list[float] = []
        for i in range(n):
            window = buf[i * WINDOW:(i + 1) * WINDOW]
            x = np.concatenate([self._context, window])[None, :]  # [1, 576]
            out, self._h, self._c = self._session.run(  # type: ignore[attr-defined]
                None, {"input": x, "h": self._h, "c": self._c}
            )
            self._context = window[-CONTEXT:]
            probs.append(float(np.asarray(out).reshape(-1)[0]))
        return probs


class SileroVad:
    sample_rate = 16000
    window_samples = WINDOW

    def __init__(self) -> None:
        try:
            import onnxruntime
            from faster_whisper.utils import get_assets_path
        except ImportError as exc:
            raise BackendUnavailableError(f"Silero VAD needs faster-whisper and onnxruntime: {exc}") from exc
        path = os.path.join(get_assets_path(), "silero_vad_v6.onnx")
        opts = onnxruntime.SessionOptions()
        opts.inter_op_num_threads = 1
        opts.intra_op_num_threads = 1
        opts.log_severity_level = 4
        self._session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"], sess_options=opts)

    def new_stream(self) -> SileroStream:
        return SileroStream(self._session)
