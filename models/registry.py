"""Picks a backend by name and imports its engine only when it is chosen, so a deployment needs
only the packages of the engines it uses. A missing package becomes an error that names what to
install."""

from __future__ import annotations

import importlib
from typing import Any

from core.clock import Clock
from core.errors import BackendUnavailableError, ConfigError
from core.worker import ModelWorker
from models.config import AsrConfig, LlmConfig, TtsConfig, TurnConfig, VadConfig
from models.protocols import LanguageModel, SpeechRecognizer, Synthesizer, TurnDetector, VoiceActivityDetector

# engine name -> (module, class, what to install when the import fails)
ENGINES: dict[str, dict[str, tuple[str, str, str]]] = {
    "vad": {"silero": ("models.speech.vad_silero", "SileroVad", "pip install faster-whisper onnxruntime")},
    "asr": {
        "faster-whisper": ("models.speech.asr_faster_whisper", "FasterWhisperRecognizer", "pip install faster-whisper"),
    },
    "tts": {
        "hibari": ("models.speech.tts_hibari", "HibariSynthesizer", "pip install hibari-tts"),
        "espeak-ng": ("models.speech.tts_espeak", "EspeakSynthesizer", "apt-get install espeak-ng"),
        "coqui-xtts": ("models.speech.tts_coqui", "CoquiXttsSynthesizer", "pip install 'voice-agent[coqui]'"),
    },
}


def engine_class(kind: str, name: str) -> Any:
    try:
        module_name, class_name, install = ENGINES[kind][name]
    except KeyError as exc:
        known = ", ".join(ENGINES.get(kind, {}))
        raise ConfigError(f"unknown {kind} engine {name!r}; known: {known}") from exc
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendUnavailableError(f"the {kind} engine {name!r} cannot be imported ({exc}); {install}") from exc
    return getattr(module, class_name)


def load_vad(config: VadConfig) -> VoiceActivityDetector:
    vad: VoiceActivityDetector = engine_class("vad", config.engine)()
    return vad


def load_turn(config: TurnConfig) -> TurnDetector | None:
    """The end-of-turn model, or None when turn.engine is off."""
    if config.engine == "off":
        return None
    from models.packs.cache import resolve
    from models.speech.turn_smart import SmartTurn

    return SmartTurn(resolve(config.model), threads=config.threads)


def load_asr(config: AsrConfig) -> SpeechRecognizer:
    asr: SpeechRecognizer = engine_class("asr", config.engine)(config)
    return asr


def load_tts(config: TtsConfig) -> Synthesizer:
    tts: Synthesizer = engine_class("tts", config.engine)(config)
    return tts


def load_llm(config: LlmConfig, clock: Clock, *, sequences: int = 8, api_sequences: int = 0,
             worker: ModelWorker | None = None) -> LanguageModel:
    """`sequences`: calls held at once (server.max_sessions), `api_sequences`: /v1 generations at once
    (server.max_api_requests): the embedded engine's KV cache is sized for both. `worker`: the
    embedded engine runs on this thread (another engine's) instead of one of its own."""
    if config.engine == "embedded":
        from models.llm.llm_factory import load_embedded

        return load_embedded(config, clock, sequences=sequences, api_sequences=api_sequences, worker=worker)
    if config.engine == "openai":
        from models.llm.llm_openai import OpenAIChatLLM

        return OpenAIChatLLM(config, clock)
    raise ConfigError(f"unknown llm engine {config.engine!r}; known: embedded, openai")
