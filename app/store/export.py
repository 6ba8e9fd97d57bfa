"""Exports, streamed a call at a time: jsonl (one call per line with its turns, the shape of
GET /api/calls/{id}) and csv (one row per turn with its call's columns, text that a spreadsheet would
run as a formula escaped)."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import AsyncIterator
from typing import Any, Literal

from app.store.records import CallRecord, TurnRecord
from app.store.shapes import CSV_COLUMNS, call_json, csv_rows

ExportFormat = Literal["jsonl", "csv"]
MEDIA_TYPES: dict[str, str] = {"jsonl": "application/x-ndjson", "csv": "text/csv; charset=utf-8"}
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def spreadsheet_safe(value: Any) -> Any:
    """A text cell that a spreadsheet would take for a formula (it begins with = + - @, a tab or a
    carriage return: CSV injection) with a single quote in front, which shows it as text. Numbers,
    and text that is a plain number ("-3.5", "+15551234567"), are left as they are."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS) and not _PLAIN_NUMBER.fullmatch(value):
        return "'" + value
    return value


async def export_lines(calls: AsyncIterator[tuple[CallRecord, list[TurnRecord]]],
                       fmt: ExportFormat, chunk_calls: int = 50) -> AsyncIterator[str]:
    """The export's text, in chunks of `chunk_calls` calls."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if fmt == "csv":
        writer.writerow(CSV_COLUMNS)
    count = 0
    async for call, turns in calls:
        if fmt == "jsonl":
            buffer.write(json.dumps(call_json(call, turns), ensure_ascii=False) + "\n")
        else:
            writer.writerows([spreadsheet_safe(cell) for cell in row] for row in csv_rows(call, turns))
        count += 1
        if count % chunk_calls == 0:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    if buffer.tell():
        yield buffer.getvalue()
