"""Settings from environment variables (VOICE_AGENT_..., nested with __) and an optional TOML or
JSON file (VOICE_AGENT_CONFIG or `--config`). Each backend is handed only its own section.

    VOICE_AGENT_LLM__MODEL=qwen2.5-coder-1.5b-instruct-q4_k_m VOICE_AGENT_ENDPOINTING__END_SILENCE_MS=400 \\
        voice-agent serve
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from core.errors import ConfigError
from models.config import AsrConfig, LlmConfig, TtsConfig, TurnConfig, VadConfig
from models.protocols import SamplingParams
from pipeline.config import AsrStageConfig, ChunkerConfig, EndpointingConfig, SessionConfig


class ServerConfig(BaseModel):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    max_sessions: int = Field(8, ge=1, description="concurrent calls; more are refused with server_busy")
    max_frame_bytes: int = Field(32000, ge=320, description="largest binary audio frame (1 s of 16 kHz PCM16)")
    max_text_bytes: int = Field(16384, ge=256, description="largest text message")
    max_session_s: float = Field(1800.0, gt=0, description="a call is ended after this long")
    max_audio_backlog_ms: int = Field(5000, ge=100, description="audio queued ahead of the pipeline; more is dropped")
    max_protocol_errors: int = Field(50, ge=1, description="a session is closed after this many bad messages")
    send_timeout_s: float = Field(10.0, gt=0, description="a caller that reads nothing this long is dropped")
    max_api_requests: int = Field(
        4, ge=1, description="concurrent generations through /v1/chat/completions; more get 429 with Retry-After")
    log_level: Literal["debug", "info", "warning", "error"] = "info"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VOICE_AGENT_", env_nested_delimiter="__", extra="ignore")

    server: ServerConfig = ServerConfig()
    vad: VadConfig = VadConfig()
    endpointing: EndpointingConfig = EndpointingConfig()
    turn: TurnConfig = TurnConfig()
    asr: AsrConfig = AsrConfig()
    asr_stage: AsrStageConfig = AsrStageConfig()
    llm: LlmConfig = LlmConfig()
    chunker: ChunkerConfig = ChunkerConfig()
    tts: TtsConfig = TtsConfig()
    session: SessionConfig = SessionConfig()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, _FileSource(settings_cls)

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            temperature=self.llm.temperature, top_p=self.llm.top_p, top_k=self.llm.top_k,
            max_tokens=self.llm.max_tokens,
        )


class _FileSource(PydanticBaseSettingsSource):
    """Values from the file named by VOICE_AGENT_CONFIG (TOML or JSON); lowest priority."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = os.environ.get("VOICE_AGENT_CONFIG")
        return load_file(Path(path)) if path else {}


def load_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the settings file {path}: {exc}") from exc
    try:
        data: dict[str, Any] = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"the settings file {path} is not valid {path.suffix.lstrip('.') or 'TOML'}: {exc}") from exc
    return data
