"""Speech recognition with faster-whisper (CTranslate2): int8 on CPU, float16 on CUDA."""

from __future__ import annotations

import logging

import numpy as np

from core.errors import BackendUnavailableError, EngineError, ModelMissingError
from models.cache import resolve
from models.config import AsrConfig
from models.cpu import cores
from models.protocols import Audio

log = logging.getLogger(__name__)


class FasterWhisperRecognizer:
    sample_rate = 16000

    def __init__(self, config: AsrConfig) -> None:
        try:
            from faster_whisper import WhisperModel
        except ImportError as exc:
            raise BackendUnavailableError("faster-whisper is not installed: pip install faster-whisper") from exc
        self.config = config
        path = resolve(config.model)
        device = config.device
        compute_type = config.compute_type
        if device == "cuda" and compute_type == "int8":
            compute_type = "float16"
        try:
            self._model = WhisperModel(path, device=device, compute_type=compute_type,
                                       cpu_threads=config.threads or cores())
        except (RuntimeError, ValueError, OSError) as exc:
            if "not found" in str(exc).lower() or isinstance(exc, OSError):
                raise ModelMissingError(
                    f"cannot load Whisper from {path!r}: {exc}; fetch it with `voice-agent models fetch`"
                ) from exc
            raise BackendUnavailableError(f"faster-whisper cannot run on {device}/{compute_type}: {exc}") from exc
        log.info("ASR: faster-whisper %s on %s (%s)", config.model, device, compute_type)

    def transcribe(self, audio: Audio, beam_size: int | None = None) -> str:
        if len(audio) < self.sample_rate // 10:
            return ""
        try:
            segments, _ = self._model.transcribe(
                np.ascontiguousarray(audio, dtype=np.float32),
                language=self.config.language,
                beam_size=beam_size or self.config.beam_size,
                vad_filter=False,
                condition_on_previous_text=False,
                without_timestamps=True,
            )
            texts = [s.text for s in segments if not (s.no_speech_prob > 0.6 and s.avg_logprob < -1.0)]
        except RuntimeError as exc:
            raise EngineError(f"faster-whisper failed: {exc}") from exc
        return " ".join(t.strip() for t in texts).strip()
