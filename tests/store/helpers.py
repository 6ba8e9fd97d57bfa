"""Records for the store's tests: calls and turns with plausible figures."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from app.store import CallRecord, CallStore, StorageConfig, TurnRecord

T0 = dt.datetime(2025, 3, 1, 12, 0, 0, tzinfo=dt.UTC)


def storage(tmp: Path, **overrides: object) -> StorageConfig:
    """A store under tmp, retention off unless asked (its task would delete these 2025 calls)."""
    values: dict[str, object] = {"data_dir": str(tmp), "retention_days": 0}
    values.update(overrides)
    return StorageConfig.model_validate(values)


async def open_store(tmp: Path, **overrides: object) -> CallStore:
    store = CallStore(storage(tmp, **overrides))
    await store.open()
    return store


def call(call_id: str = "call-1", started: dt.datetime = T0, transport: str = "ws") -> CallRecord:
    return CallRecord(id=call_id, transport=transport, started_at=started, fingerprint="abc123",
                      settings={"llm": {"model": "qwen"}}, caller="127.0.0.1")


def turn(turn_id: int, *, start: dt.datetime = T0, offset_s: float | None = None, status: str = "completed",
         v2v: float | None = 400.0, first_audio: float = 300.0, spec: bool = True,
         error: str | None = None) -> TurnRecord:
    offset = 5.0 * turn_id + 2.0 if offset_s is None else offset_s
    return TurnRecord(
        turn_id=turn_id, at=start + dt.timedelta(seconds=offset), offset_s=offset, status=status,
        user_text=f"question {turn_id}", generated_text=f"answer {turn_id}, all of it",
        sent_text=f"answer {turn_id}, all", heard_text=f"answer {turn_id}",
        latency_ms={"speech_end": 0.0, "asr_final": 80.0, "llm_first_token": 150.0, "first_phrase": 200.0,
                    "tts_first_audio": 260.0, "first_audio_sent": first_audio},
        voice_to_voice_ms=v2v,
        spec={"method": "ngram", "drafts": 4, "draft_tokens": 16, "accepted_tokens": 8,
              "accepted_per_position": [4, 2, 1, 1], "k_chosen": [4, 4, 4, 4], "tokens_per_second": 31.5,
              "acceptance_rate": 0.5, "completion_tokens": 20, "time_to_first_token_ms": 120.0} if spec else None,
        error=error, barge_in=status == "interrupted", dtmf="12#" if turn_id == 1 else None,
        deadline_missed=v2v is not None and v2v > 1000, underruns=turn_id % 2)
