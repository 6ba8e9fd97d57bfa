"""hibari: Kokoro-82M distilled to int8 ONNX, 24 kHz, its own phonemizer; no network needed for the
default voice."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from core.errors import BackendUnavailableError, EngineError
from models.config import TtsConfig
from models.protocols import Audio


class HibariSynthesizer:
    name = "hibari"

    def __init__(self, config: TtsConfig) -> None:
        try:
            from hibari import SAMPLE_RATE, Hibari
        except ImportError as exc:
            raise BackendUnavailableError("hibari is not installed: pip install hibari-tts") from exc
        kwargs = {"voice": config.voice} if config.voice else {}
        try:
            self._tts = Hibari(threads=config.threads, **kwargs)
        except (ValueError, RuntimeError, OSError) as exc:
            raise BackendUnavailableError(f"hibari cannot load voice {config.voice or 'heart'!r}: {exc}") from exc
        self.sample_rate = int(SAMPLE_RATE)
        self.speed = config.speed

    def synthesize(self, text: str) -> Iterator[Audio]:
        try:
            for chunk in self._tts.stream(text, speed=self.speed):
                if len(chunk):
                    yield np.asarray(chunk, dtype=np.float32)
        except (KeyError, ValueError, RuntimeError) as exc:
            raise EngineError(f"hibari failed on {text[:40]!r}: {exc}") from exc
