"""What a call ran with: the model names, precision and the settings that shape a turn, and a short
hash of them, so that calls that ran alike can be grouped and a change of settings shows."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, SecretStr

# Sections kept with each call; secrets (api keys, tokens) are never among what is kept.
SECTIONS = ("asr", "asr_stage", "llm", "tts", "turn", "vad", "endpointing", "chunker", "session")
_SECRET_NAMES = ("api_key", "token", "secret", "password")


def call_settings(settings: BaseModel) -> dict[str, Any]:
    """The call-shaping sections of the service's settings as plain JSON; the system prompt by its
    hash and length (it can be long, and it is in the configuration anyway)."""
    kept: dict[str, Any] = {}
    for name in SECTIONS:
        section = getattr(settings, name, None)
        if isinstance(section, BaseModel):
            kept[name] = _public(section)
    prompt = kept.get("session", {}).pop("system_prompt", None)
    if isinstance(prompt, str):
        kept["session"]["system_prompt_sha256"] = hashlib.sha256(prompt.encode()).hexdigest()[:16]
        kept["session"]["system_prompt_chars"] = len(prompt)
    return kept


def fingerprint(kept: dict[str, Any]) -> str:
    """16 hex digits of the SHA-256 of the settings' canonical JSON."""
    return hashlib.sha256(json.dumps(kept, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def _public(section: BaseModel) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in type(section).model_fields:
        value = getattr(section, name)
        if isinstance(value, SecretStr) or any(word in name for word in _SECRET_NAMES):
            continue
        out[name] = _public(value) if isinstance(value, BaseModel) else _plain(value)
    return out


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
