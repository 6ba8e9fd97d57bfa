"""The second TTS backend (espeak-ng) speaks, and the GPU-only Coqui backend says what it needs."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from core.errors import BackendUnavailableError
from models import registry
from models.config import AsrConfig, TtsConfig
from models.speech.asr_faster_whisper import FasterWhisperRecognizer
from pipeline.audio import resample
from tests.speech import words


@pytest.mark.slow
def test_espeak_backend_speaks_the_text() -> None:
    tts = registry.load_tts(TtsConfig(engine="espeak-ng"))
    text = "The capital of France is Paris, and the weather there is mild in spring."
    audio = np.concatenate(list(tts.synthesize(text)))
    assert len(audio) / tts.sample_rate > 1.0
    heard = set(words(FasterWhisperRecognizer(AsrConfig()).transcribe(resample(audio, tts.sample_rate, 16000))))
    said = set(words(text))
    assert len(heard & said) / len(said) >= 0.7, heard


def _coqui_importable() -> bool:
    try:
        if importlib.util.find_spec("TTS") is None:
            return False
        return importlib.import_module("TTS.tts.models.xtts") is not None
    except Exception:
        return False


@pytest.mark.skipif(_coqui_importable(), reason="Coqui TTS imports here; the error path cannot be shown")
def test_coqui_without_its_extra_names_what_to_install() -> None:
    with pytest.raises(BackendUnavailableError, match=r"voice-agent\[coqui\]"):
        registry.load_tts(TtsConfig(engine="coqui-xtts"))


@pytest.mark.skipif(not _coqui_importable() or not os.environ.get("VOICE_AGENT_TEST_XTTS_DIR"),
                    reason="Coqui XTTS needs the coqui extra, a matching torchaudio and XTTS-v2 weights "
                           "(VOICE_AGENT_TEST_XTTS_DIR); none can be had on the CPU machines (shared MODELS.md)")
def test_coqui_xtts_streams_audio() -> None:
    config = TtsConfig(engine="coqui-xtts", coqui_model=os.environ["VOICE_AGENT_TEST_XTTS_DIR"],
                       coqui_device=os.environ.get("VOICE_AGENT_TEST_XTTS_DEVICE", "cuda"))
    tts = registry.load_tts(config)
    chunks = list(tts.synthesize("Hello there, how can I help?"))
    assert len(chunks) >= 1 and sum(len(c) for c in chunks) / tts.sample_rate > 0.5
