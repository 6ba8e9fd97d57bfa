"""Exports, streamed a call at a time: jsonl (one call per line with its turns, the shape of
GET /api/calls/{id}) and csv (one row per turn with its call's columns)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator
from typing import Literal

from app.store.records import CallRecord, TurnRecord
from app.store.shapes import CSV_COLUMNS, call_json, csv_rows

ExportFormat = Literal["jsonl", "csv"]
MEDIA_TYPES: dict[str, str] = {"jsonl": "application/x-ndjson", "csv": "text/csv; charset=utf-8"}


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
            writer.writerows(csv_rows(call, turns))
        count += 1
        if count % chunk_calls == 0:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    if buffer.tell():
        yield buffer.getvalue()
