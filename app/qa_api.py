"""The call QA API (docs/qa.md): calls by filter and page, a call with its turns, its recording, an
export, and the dashboard's overview over time. JSON shapes: app/store/shapes.py."""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from pydantic import TypeAdapter, ValidationError

from app.runtime import Runtime
from app.store import CallFilter, CallStore, utc_now
from app.store.export import MEDIA_TYPES
from app.store.shapes import call_json, call_summary, iso

router = APIRouter(prefix="/api", tags=["call QA"])
MAX_LIMIT = 500
MAX_BUCKETS = 2000
_OFFSET_AS_SPACE = re.compile(r"(?<=\d) (\d{2}(?::?\d{2})?)$")
_TIME = TypeAdapter(dt.datetime)
OVERVIEW_TURNS = 100_000  # the overview reads at most this many turns of its window


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"code": self.code, "message": self.message}}, status_code=self.status)


def parse_time(value: str | None, name: str) -> dt.datetime | None:
    """A time in a query, as pydantic reads a datetime: ISO-8601 (`2025-03-01`, `2025-03-01T12:03`,
    `2025-03-01T12:03:07.5Z`, `...+02:00`; a time without an offset is UTC) or epoch seconds (`1740830587`,
    `1740830587.25`). A number above 2e10 is read as epoch milliseconds (pydantic's rule: as seconds it
    would be past the year 2603), so a JavaScript `Date.now()` works too. Anything else, or a time outside
    the years 1-9999, is a 400 `bad_time`."""
    if value is None or value == "":
        return None
    # a "+" left unescaped in a query string arrives as a space: 10:00:00 02:00 is 10:00:00+02:00
    text = _OFFSET_AS_SPACE.sub(r"+\1", value.strip())
    try:
        parsed = _TIME.validate_python(text)
        return parsed.replace(tzinfo=dt.UTC) if parsed.tzinfo is None else parsed.astimezone(dt.UTC)
    except ValidationError as exc:
        reason = exc.errors()[0]["msg"].removeprefix("Input should be a valid datetime or date, ")
        raise ApiError(400, "bad_time", f"{name}: {value[:60]!r} is not a time: give ISO-8601 "
                                        f"(2025-03-01T12:03:07Z) or epoch seconds ({reason})") from None
    except OverflowError:  # an offset that moves the time past year 1 or 9999 in UTC
        raise ApiError(400, "bad_time", f"{name}: {value[:60]!r} is outside the years 1-9999 in UTC") from None


def _store(request: Request) -> CallStore:
    runtime: Runtime = request.app.state.runtime
    if runtime.store is None:
        why = runtime.store_error or ("storage.enabled is false" if not runtime.settings.storage.enabled
                                      else "it is not open yet")
        raise ApiError(503, "store_unavailable", f"the call store is off: {why}")
    return runtime.store


def _filters(since: str | None, until: str | None, transport: str | None, status: str | None,
             min_v2v_ms: float | None) -> CallFilter:
    return CallFilter(since=parse_time(since, "since"), until=parse_time(until, "until"),
                      transport=transport or None, status=status or None, min_v2v_ms=min_v2v_ms)


Since = Annotated[str | None, Query(description="calls started at or after this (ISO-8601 or epoch seconds)")]
Until = Annotated[str | None, Query(description="calls started before this (ISO-8601 or epoch seconds)")]
Transport = Annotated[str | None, Query(description="ws, twilio, telnyx, ...")]
Status = Annotated[str | None, Query(description="completed, interrupted or failed")]
MinV2v = Annotated[float | None, Query(ge=0, description="calls whose worst voice-to-voice ms is at least this")]


@router.get("/calls")
async def list_calls(request: Request, since: Since = None, until: Until = None, transport: Transport = None,
                     status: Status = None, min_v2v_ms: MinV2v = None,
                     limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
                     offset: Annotated[int, Query(ge=0)] = 0) -> JSONResponse:
    try:
        store = _store(request)
        page = await store.list_calls(_filters(since, until, transport, status, min_v2v_ms), limit=limit,
                                      offset=offset)
    except ApiError as exc:
        return exc.response()
    return JSONResponse({"calls": [call_summary(c) for c in page.calls], "total": page.total,
                         "next_offset": page.next_offset})


@router.get("/calls/export", response_model=None)
async def export_calls(request: Request, format: Literal["jsonl", "csv"] = "jsonl", since: Since = None,
                       until: Until = None, transport: Transport = None, status: Status = None,
                       min_v2v_ms: MinV2v = None) -> StreamingResponse | JSONResponse:
    """Every matching call, streamed: jsonl (a call per line, as GET /api/calls/{id}) or csv (a row per turn)."""
    try:
        store = _store(request)
        chunks = store.export(format, _filters(since, until, transport, status, min_v2v_ms))
    except ApiError as exc:
        return exc.response()
    name = f"calls-{utc_now().strftime('%Y%m%dT%H%M%SZ')}.{format}"
    return StreamingResponse(chunks, media_type=MEDIA_TYPES[format],
                             headers={"Content-Disposition": f'attachment; filename="{name}"'})


@router.get("/calls/{call_id}")
async def get_call(request: Request, call_id: str) -> JSONResponse:
    try:
        found = await _store(request).get_call(call_id)
    except ApiError as exc:
        return exc.response()
    if found is None:
        return ApiError(404, "call_not_found", f"no call with id {call_id!r}").response()
    return JSONResponse(call_json(*found))


@router.get("/calls/{call_id}/recording", response_model=None)
async def get_recording(request: Request, call_id: str) -> FileResponse | JSONResponse | StreamingResponse:
    try:
        store = _store(request)
        found = await store.get_call(call_id)
    except ApiError as exc:
        return exc.response()
    if found is None:
        return ApiError(404, "call_not_found", f"no call with id {call_id!r}").response()
    fetched = await store.recording_object(found[0], request.headers.get("range"))
    if fetched is not None:  # from object storage, whichever replica recorded it; a player's Range passed on
        name = found[0].recording.rsplit("/", 1)[-1] if found[0].recording else "recording.wav"
        headers = {**fetched.headers, "Content-Disposition": f'inline; filename="{name}"'}
        return StreamingResponse(fetched.chunks(), status_code=fetched.status, headers=headers, media_type="audio/wav")
    path = store.recording_file(found[0])
    if path is None:
        return ApiError(404, "recording_not_found", f"call {call_id!r} has no recording").response()
    # inline: an <audio> element plays it; FileResponse answers Range requests, so the player can seek
    return FileResponse(path, media_type="audio/wav", filename=path.name, content_disposition_type="inline")


@router.get("/overview")
async def overview(request: Request, since: Annotated[str | None, Query()] = None,
                   until: Annotated[str | None, Query()] = None,
                   bucket_s: Annotated[float | None, Query(gt=0)] = None) -> JSONResponse:
    """Per time bucket of the window (default: the last 24 hours, about 48 buckets): voice-to-voice
    p50/p95/p99, each mark's p50, the acceptance rate and the number of turns."""
    try:
        store = _store(request)
        end = parse_time(until, "until") or utc_now()
        start = parse_time(since, "since") or _day_before(end)
        if start >= end:
            raise ApiError(400, "bad_window", "since must be before until")
        span = (end - start).total_seconds()
        step = bucket_s or _nice_bucket(span / 48)
        if span / step > MAX_BUCKETS:
            raise ApiError(400, "too_many_buckets", f"{math.ceil(span / step)} buckets; at most {MAX_BUCKETS}")
        data: list[dict[str, Any]] = await store.overview(start, end, step, OVERVIEW_TURNS)
    except ApiError as exc:
        return exc.response()
    return JSONResponse({"since": iso(start), "until": iso(end), "bucket_s": step,
                         "buckets": data})


def _day_before(until: dt.datetime) -> dt.datetime:
    try:
        return until - dt.timedelta(hours=24)
    except OverflowError:
        raise ApiError(400, "bad_time", f"until: {iso(until)} has no 24 hours before it; give since") from None


def _nice_bucket(seconds: float) -> float:
    """The first of 1 min, 5 min, 15 min, 30 min, 1 h, 3 h, 6 h, 1 day at least `seconds` long."""
    for step in (60.0, 300.0, 900.0, 1800.0, 3600.0, 10800.0, 21600.0, 86400.0):
        if step >= seconds:
            return step
    return 86400.0 * math.ceil(seconds / 86400.0)
