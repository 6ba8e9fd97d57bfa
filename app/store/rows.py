"""Between records (app/store/records.py) and table rows (app/store/tables.py), both ways, and the
call summary that follows from a call's turns."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from app.store.records import CallRecord, TurnRecord
from app.store.tables import Call, Turn


def call_row(call: CallRecord) -> Call:
    return Call(
        id=call.id, transport=call.transport, started_at=call.started_at, ended_at=call.ended_at,
        end_reason=call.end_reason, end_error=call.end_error, status=call.status, fingerprint=call.fingerprint,
        settings=call.settings, caller=call.caller, turns_count=call.turns_count, interruptions=call.interruptions,
        errors=call.errors, v2v_median_ms=call.v2v_median_ms, v2v_max_ms=call.v2v_max_ms, recording=call.recording)


def call_record(row: Call) -> CallRecord:
    return CallRecord(
        id=row.id, transport=row.transport, started_at=row.started_at, fingerprint=row.fingerprint,
        settings=dict(row.settings or {}), caller=row.caller, ended_at=row.ended_at, end_reason=row.end_reason,
        end_error=row.end_error,
        status=row.status, turns_count=row.turns_count, interruptions=row.interruptions, errors=row.errors,
        v2v_median_ms=row.v2v_median_ms, v2v_max_ms=row.v2v_max_ms, recording=row.recording)


def turn_row(call_id: str, turn: TurnRecord) -> Turn:
    return Turn(
        call_id=call_id, turn_id=turn.turn_id, at=turn.at, offset_s=turn.offset_s, user_text=turn.user_text,
        generated_text=turn.generated_text, sent_text=turn.sent_text, heard_text=turn.heard_text,
        status=turn.status, latency_ms=dict(turn.latency_ms), voice_to_voice_ms=turn.voice_to_voice_ms,
        spec=turn.spec, error=turn.error, barge_in=turn.barge_in, dtmf=turn.dtmf,
        deadline_missed=turn.deadline_missed, underruns=turn.underruns, tool_calls=turn.tool_calls or None)


def turn_record(row: Turn) -> TurnRecord:
    return TurnRecord(
        turn_id=row.turn_id, at=row.at, offset_s=row.offset_s, status=row.status, user_text=row.user_text,
        generated_text=row.generated_text, sent_text=row.sent_text, heard_text=row.heard_text,
        latency_ms=dict(row.latency_ms or {}), voice_to_voice_ms=row.voice_to_voice_ms, spec=row.spec,
        error=row.error, barge_in=row.barge_in, dtmf=row.dtmf, deadline_missed=row.deadline_missed,
        underruns=row.underruns, tool_calls=list(row.tool_calls or []))


@dataclass(frozen=True)
class Summary:
    turns_count: int
    interruptions: int
    errors: int
    v2v_median_ms: float | None
    v2v_max_ms: float | None
    status: str


def summarize(turns: Iterable[TurnRecord], call_error: bool = False) -> Summary:
    """A call's summary from its turns. status: failed if a turn failed or the call ended with an
    error, else interrupted if a turn was interrupted, else completed."""
    count = interrupted = errors = failed = 0
    v2v: list[float] = []
    for turn in turns:
        count += 1
        interrupted += turn.status == "interrupted"
        failed += turn.status == "failed"
        errors += turn.status == "failed" or turn.error is not None
        value = turn.v2v_ms()
        if value is not None:
            v2v.append(value)
    errors += call_error
    status = "failed" if failed or call_error else "interrupted" if interrupted else "completed"
    return Summary(count, interrupted, errors, round(statistics.median(v2v), 1) if v2v else None,
                   max(v2v) if v2v else None, status)
