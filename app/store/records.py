"""What the rest of the service hands the store, and what its queries give back: plain dataclasses,
so that no SQLAlchemy object leaves app/store. Times are timezone-aware UTC datetimes (wall time);
the pipeline's monotonic clock stays in the pipeline, and whoever builds a record converts.

Glossary of a turn's figures:
- latency_ms: each mark (pipeline.turns.MARKS) as milliseconds since the turn's speech_end;
- voice_to_voice_ms: from the caller's true end of speech to the first reply audio sent, where known;
- spec: the turn's speculative-decoding statistics (see `spec_from_stats`), None when nothing was generated.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from models.protocols import GenerationStats

TURN_STATUSES = ("completed", "interrupted", "failed")
CALL_STATUSES = ("completed", "interrupted", "failed")
SPEC_FIELDS = ("method", "drafts", "draft_tokens", "accepted_tokens", "accepted_per_position", "k_chosen",
               "tokens_per_second", "acceptance_rate", "completion_tokens", "time_to_first_token_ms",
               "prompt_tokens", "prefill_tokens", "steps")


def utc_now() -> dt.datetime:
    """The wall clock (UTC). Only the store's retention and the API's default windows read it."""
    return dt.datetime.now(dt.UTC)


def as_utc(value: dt.datetime) -> dt.datetime:
    """A naive datetime is taken as UTC (SQLite gives them back so); an aware one is converted."""
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


@dataclass(frozen=True)
class CallTimeline:
    """One call's moments on the pipeline's monotonic clock as wall times and as offsets from the
    call's start (where a turn sits in the recording), from one reading of each clock at the start."""

    started_at: dt.datetime  # wall time (UTC) at the call's start: CallRecord.started_at
    started_mono: float  # the pipeline clock's time then: the recorder's started_at

    def wall(self, mono: float) -> dt.datetime:
        return self.started_at + dt.timedelta(seconds=mono - self.started_mono)

    def offset_s(self, mono: float) -> float:
        return round(mono - self.started_mono, 3)


@dataclass
class CallRecord:
    """A call. The service fills the first six fields at call start; the store keeps the rest up to
    date as turns arrive and when the call ends."""

    id: str
    transport: str  # ws, twilio, telnyx, ...
    started_at: dt.datetime
    fingerprint: str = ""  # short hash of `settings`: calls with equal fingerprints ran alike
    settings: dict[str, Any] = field(default_factory=dict)  # model names, precision, key settings
    caller: str | None = None  # a phone number, a client address
    ended_at: dt.datetime | None = None
    end_reason: str | None = None  # hangup, timeout, client_closed, ...
    end_error: str | None = None  # the error the call ended with, if it did
    status: str = "completed"  # failed | interrupted | completed, kept up to date turn by turn (see rows.summarize)
    turns_count: int = 0
    interruptions: int = 0
    errors: int = 0
    v2v_median_ms: float | None = None
    v2v_max_ms: float | None = None
    recording: str | None = None  # the WAV's path relative to the data folder

    @property
    def duration_s(self) -> float | None:
        if self.ended_at is None:
            return None
        return round((as_utc(self.ended_at) - as_utc(self.started_at)).total_seconds(), 3)


@dataclass
class TurnRecord:
    """One finished turn: the caller's utterance and the reply to it."""

    turn_id: int
    at: dt.datetime  # wall time of the caller's end of speech (or of the reply's start when there is none)
    offset_s: float  # seconds from the call's start to `at`: where the turn sits in the recording
    status: str  # completed | interrupted | failed
    user_text: str = ""  # the final transcript
    generated_text: str = ""  # everything the LLM wrote
    sent_text: str = ""  # what went out as audio
    heard_text: str = ""  # what the caller heard (played, per the client's reports; else what was sent)
    latency_ms: dict[str, float] = field(default_factory=dict)
    voice_to_voice_ms: float | None = None
    spec: dict[str, Any] | None = None
    error: str | None = None
    barge_in: bool = False
    dtmf: str | None = None  # keys pressed during the turn
    deadline_missed: bool = False
    underruns: int = 0
    # the turn's tool calls: name, arguments, who ran it, output or error, times in ms since speech_end,
    # whether the caller heard the filler (pipeline.tools.ToolRun.as_dict)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def v2v_ms(self) -> float | None:
        """The turn's voice-to-voice figure for summaries: the true one where known, else the time from
        speech_end (the VAD's decision) to the first audio sent."""
        if self.voice_to_voice_ms is not None:
            return self.voice_to_voice_ms
        return self.latency_ms.get("first_audio_sent")


def spec_from_stats(stats: GenerationStats | None, steps: Sequence[dict[str, Any]] = ()) -> dict[str, Any] | None:
    """A turn's `spec` column from the LLM's statistics of its reply; `steps`: every LLM reply to
    the turn (a tool call's, then the follow-up's), each with its prompt's cost (a follow-up that
    prefills most of its prompt has lost its cache)."""
    if stats is None:
        return None
    return {
        "method": stats.method,
        "drafts": stats.drafts,
        "draft_tokens": stats.draft_tokens,
        "accepted_tokens": stats.accepted_tokens,
        "accepted_per_position": list(stats.accepted_per_position),
        "k_chosen": list(stats.k_chosen),
        "tokens_per_second": round(stats.tokens_per_second, 2),
        "acceptance_rate": round(stats.acceptance_rate, 4) if stats.draft_tokens else None,
        "completion_tokens": stats.completion_tokens,
        "time_to_first_token_ms": round(stats.time_to_first_token_ms, 1),
        "prompt_tokens": stats.prompt_tokens,
        "prefill_tokens": stats.prefill_tokens,
        "steps": [dict(step) for step in steps],
    }
