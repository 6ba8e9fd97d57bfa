"""espeak-ng (the Debian package): robotic, but its first audio comes in about 10 ms."""

from __future__ import annotations

import io
import shutil
import subprocess
import wave
from collections.abc import Iterator

import numpy as np

from core.errors import BackendUnavailableError, EngineError
from models.config import TtsConfig
from models.protocols import Audio


class EspeakSynthesizer:
    name = "espeak-ng"
    sample_rate = 22050

    def __init__(self, config: TtsConfig) -> None:
        exe = shutil.which("espeak-ng")
        if exe is None:
            raise BackendUnavailableError("espeak-ng is not installed: apt-get install espeak-ng")
        self._exe = exe
        self._voice = config.voice or "en-us"
        self._rate = str(int(175 * config.speed))

    def synthesize(self, text: str) -> Iterator[Audio]:
        proc = subprocess.run(
            [self._exe, "--stdout", "-v", self._voice, "-s", self._rate, "--", text],
            capture_output=True, timeout=30, check=False,
        )
        if proc.returncode != 0:
            raise EngineError(f"espeak-ng failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
        with wave.open(io.BytesIO(proc.stdout)) as wav:
            self.sample_rate = wav.getframerate()
            pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
        if len(pcm):
            yield pcm.astype(np.float32) / 32768.0
