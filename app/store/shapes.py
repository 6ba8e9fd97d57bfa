"""The JSON shapes of the QA API and of the exports (docs/qa.md). The dashboard codes against exactly
these keys: change them only together with app/static/qa/."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from app.store.records import SPEC_FIELDS, CallRecord, TurnRecord, as_utc
from pipeline.turns import MARKS


def iso(value: dt.datetime | None) -> str | None:
    """ISO-8601 in UTC with milliseconds and a Z: 2025-01-31T18:04:05.123Z."""
    if value is None:
        return None
    return as_utc(value).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def call_summary(call: CallRecord) -> dict[str, Any]:
    return {
        "id": call.id,
        "transport": call.transport,
        "started_at": iso(call.started_at),
        "ended_at": iso(call.ended_at),
        "duration_s": call.duration_s,
        "end_reason": call.end_reason,
        "status": call.status,
        "fingerprint": call.fingerprint,
        "settings": call.settings,
        "caller": call.caller,
        "turns": call.turns_count,
        "interruptions": call.interruptions,
        "errors": call.errors,
        "v2v_median_ms": call.v2v_median_ms,
        "v2v_max_ms": call.v2v_max_ms,
        "has_recording": call.recording is not None,
    }


def turn_json(turn: TurnRecord) -> dict[str, Any]:
    return {
        "turn_id": turn.turn_id,
        "at": iso(turn.at),
        "offset_s": round(turn.offset_s, 3),
        "user_text": turn.user_text,
        "generated_text": turn.generated_text,
        "sent_text": turn.sent_text,
        "heard_text": turn.heard_text,
        "status": turn.status,
        "latency_ms": turn.latency_ms,
        "voice_to_voice_ms": turn.voice_to_voice_ms,
        "spec": {name: turn.spec.get(name) for name in SPEC_FIELDS} if turn.spec is not None else None,
        "error": turn.error,
        "barge_in": turn.barge_in,
        "dtmf": turn.dtmf,
        "deadline_missed": turn.deadline_missed,
        "underruns": turn.underruns,
        "tool_calls": turn.tool_calls,
    }


def call_json(call: CallRecord, turns: list[TurnRecord]) -> dict[str, Any]:
    """GET /api/calls/{id}, and one line of the jsonl export."""
    return {"call": call_summary(call), "turns": [turn_json(t) for t in turns]}


CALL_COLUMNS = ("call_id", "transport", "started_at", "ended_at", "duration_s", "end_reason", "call_status",
                "fingerprint", "caller", "turns", "interruptions", "errors", "v2v_median_ms", "v2v_max_ms",
                "has_recording", "settings")
TURN_COLUMNS = ("turn_id", "at", "offset_s", "user_text", "generated_text", "sent_text", "heard_text", "turn_status",
                *(f"{mark}_ms" for mark in MARKS), "voice_to_voice_ms", *(f"spec_{name}" for name in SPEC_FIELDS),
                "error", "barge_in", "dtmf", "deadline_missed", "underruns", "tool_calls")
CSV_COLUMNS = CALL_COLUMNS + TURN_COLUMNS


def csv_rows(call: CallRecord, turns: list[TurnRecord]) -> list[list[Any]]:
    """One row per turn with the call's columns repeated (a call without turns: one row, turn columns
    empty). Lists and objects are written as JSON."""
    summary = call_summary(call)
    head = [call.id, *(summary[k] for k in CALL_COLUMNS[1:6]), call.status, call.fingerprint, call.caller,
            call.turns_count, call.interruptions, call.errors, call.v2v_median_ms, call.v2v_max_ms,
            summary["has_recording"], json.dumps(call.settings, sort_keys=True)]
    if not turns:
        return [head + [None] * len(TURN_COLUMNS)]
    rows = []
    for turn in turns:
        data = turn_json(turn)
        spec = data["spec"] or {}
        rows.append([
            *head, turn.turn_id, data["at"], data["offset_s"], turn.user_text, turn.generated_text, turn.sent_text,
            turn.heard_text, turn.status, *(turn.latency_ms.get(mark) for mark in MARKS), turn.voice_to_voice_ms,
            *(_cell(spec.get(name)) for name in SPEC_FIELDS), turn.error, turn.barge_in, turn.dtmf,
            turn.deadline_missed, turn.underruns, _cell(turn.tool_calls) if turn.tool_calls else None])
    return rows


def _cell(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, list | dict) else value
