"""The call store: every call and every finished turn, kept for QA (docs/qa.md).

Writing is off the audio path. `call_started`, `turn_ended` and `call_ended` only put the record on a
bounded queue (a microsecond, never a wait) that one writer task drains in order, one short
transaction per record, so a crash loses at most the turn in progress (app/store/writer.py).

Hook points (all on the event loop's thread; `runtime.store` is None when storage.enabled is false):
    timeline = CallTimeline(started_at=utc_now(), started_mono=clock.now())   # at the call's start
    store.call_started(CallRecord(call_id, transport, timeline.started_at, fingerprint=fingerprint(kept),
                                  settings=kept, caller=...))  # kept = call_settings(runtime.settings)
    recorder = store.recorder(call_id, started_at=timeline.started_mono)  # None unless storage.recordings
    store.turn_ended(call_id, TurnRecord(turn_id, at=timeline.wall(speech_end), offset_s=timeline.offset_s(
        speech_end), status=..., latency_ms=done.latency_ms, voice_to_voice_ms=done.voice_to_voice_ms,
        spec=spec_from_stats(done.stats), ...))              # as each turn ends (ResponseDone), and
    runtime.tracer.turn_ended(call_record, turn_record)      # the same records, when tracing is on
    store.call_ended(call_id, ended_at=utc_now(), end_reason="hangup", error=None, recorder=recorder)
The recorder's own calls (caller audio, bot audio, a barge-in) are in app/store/recording.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import logging
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.store import queries
from app.store.config import StorageConfig, redact_url
from app.store.db import PURGE_LOCK, make_engine, upgrade
from app.store.export import ExportFormat, export_lines
from app.store.objects import Fetched, RecordingBucket, is_object
from app.store.overview import buckets
from app.store.queries import CallFilter, CallPage
from app.store.recording import CallRecorder
from app.store.recording_writer import RecordingWriter
from app.store.records import CallRecord, TurnRecord, utc_now
from app.store.writer import CallEnded, CallStarted, Op, RecordingSaved, TurnEnded, Writer
from core.clock import Clock, MonotonicClock

log = logging.getLogger(__name__)


class CallStore:
    def __init__(self, config: StorageConfig, *, clock: Clock | None = None,
                 wall: Callable[[], dt.datetime] = utc_now, on_drop: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.data_dir = config.data_path()
        self.recordings_dir = config.recordings_path()
        self._clock = clock or MonotonicClock()
        self._wall = wall
        self._on_drop = on_drop
        self._engine: AsyncEngine | None = None
        self._sessions: async_sessionmaker[AsyncSession] | None = None
        self._writer: Writer | None = None
        self._purger: asyncio.Task[None] | None = None
        self.purge_rounds = 0  # rounds the retention task has finished (purged, waited for another replica, or failed)
        self._saving: set[asyncio.Task[None]] = set()  # recordings being written after their calls ended
        self.bucket: RecordingBucket | None = None  # storage.recordings_url: recordings in object storage
        self.recording_writer = RecordingWriter(config.max_recording_pending, on_drop)  # every call's recording

    async def open(self) -> None:
        """Create the data folder, bring the schema to the newest migration, start the writer (and the
        retention task when retention_days > 0)."""
        await asyncio.to_thread(self.recordings_dir.mkdir, parents=True, exist_ok=True)
        if self.config.recordings_url:
            bucket = RecordingBucket(self.config.recordings_url, self.config.s3_endpoint_url, self.config.s3_region)
            await bucket.check()
            self.bucket = bucket
        url = self.config.database_url()
        self._engine = make_engine(url)
        await upgrade(self._engine)
        self._sessions = async_sessionmaker(self._engine, expire_on_commit=False)
        self._writer = Writer(self._sessions, self._clock, self.config.max_pending, self._on_drop,
                              retry_s=self.config.write_retry_s)
        self._writer.start()
        if self.config.retention_days > 0:
            self._purger = asyncio.create_task(self._purge_periodically(), name="call-store-purge")
        log.info("call store: %s (retention %s, recordings %s)", redact_url(url),
                 f"{self.config.retention_days:g} days" if self.config.retention_days else "forever",
                 ("to " + self.bucket.where() if self.bucket else "on") if self.config.recordings else "off")

    # Writing: never waits.

    def call_started(self, call: CallRecord) -> None:
        self._put(CallStarted(call))

    def turn_ended(self, call_id: str, turn: TurnRecord) -> None:
        self._put(TurnEnded(call_id, turn))

    def call_ended(self, call_id: str, ended_at: dt.datetime, end_reason: str, *, error: str | None = None,
                   recorder: CallRecorder | None = None) -> None:
        """The call is over. `error`: what it failed with, if it did (its status becomes failed). The
        recorder, if any, is closed in the background and its file kept with the call."""
        self._put(CallEnded(call_id, ended_at, end_reason, error))
        if recorder is not None:
            if self._writer is None:  # closed: the recording is still written whole, but not listed
                log.warning("call store: closed before call %s ended; its recording is not listed", call_id)
            task = asyncio.create_task(self._save_recording(call_id, recorder), name=f"recording-{call_id}")
            self._saving.add(task)
            task.add_done_callback(self._saving.discard)

    def recorder(self, call_id: str, started_at: float) -> CallRecorder | None:
        """A recorder for the call (started_at: the clock's time at the call's start), or None when
        recordings are off."""
        if not self.config.recordings or self._writer is None:
            return None
        return CallRecorder(self.recordings_dir / recording_name(call_id), started_at,
                            max_s=self.config.max_recording_s, writer=self.recording_writer)

    def _put(self, op: Op) -> None:
        if self._writer is None:
            log.warning("call store: not open; a %s record is not kept", type(op).__name__)
            if self._on_drop is not None:
                self._on_drop("not_open")
            return
        self._writer.put(op)

    async def _save_recording(self, call_id: str, recorder: CallRecorder) -> None:
        path = await recorder.close()
        if path is None or self._writer is None:
            return
        if self.bucket is not None:
            try:
                url = await self.bucket.put(path)
            except Exception as exc:  # the recording is kept on this replica's disk, and served from here
                log.warning("call store: call %s's recording could not go to %s (%s); it stays in %s",
                            call_id, self.bucket.where(), exc, path)
            else:
                await asyncio.to_thread(path.unlink, True)
                self._put(RecordingSaved(call_id, url))
                return
        self._put(RecordingSaved(call_id, path.relative_to(self.data_dir).as_posix()))

    @property
    def dropped(self) -> int:
        return self._writer.dropped if self._writer is not None else 0

    async def flush(self) -> None:
        """Wait until every record handed over so far (and every recording of an ended call) is written."""
        while self._saving:
            await asyncio.gather(*self._saving, return_exceptions=True)
        if self._writer is not None:
            await self._writer.flush()

    async def close(self) -> None:
        if self._purger is not None:
            self._purger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._purger
            self._purger = None
        while self._saving:  # recordings of ended calls, each listed with its call before the writer stops
            await asyncio.gather(*self._saving, return_exceptions=True)
        if self._writer is not None:
            await self._writer.stop()
            self._writer = None
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None

    # Reading.

    def _open_sessions(self) -> async_sessionmaker[AsyncSession]:
        if self._sessions is None:
            raise RuntimeError("the call store is not open")
        return self._sessions

    async def list_calls(self, filters: CallFilter | None = None, *, limit: int = 50, offset: int = 0) -> CallPage:
        return await queries.list_calls(self._open_sessions(), filters or CallFilter(), limit, offset)

    async def get_call(self, call_id: str) -> tuple[CallRecord, list[TurnRecord]] | None:
        return await queries.get_call(self._open_sessions(), call_id)

    def export(self, fmt: ExportFormat, filters: CallFilter | None = None) -> AsyncIterator[str]:
        """The export's text in chunks (jsonl: a call per line; csv: a row per turn)."""
        return export_lines(queries.calls_with_turns(self._open_sessions(), filters or CallFilter()), fmt)

    async def overview(self, since: dt.datetime, until: dt.datetime, bucket_s: float,
                       limit: int = 100_000) -> list[dict[str, Any]]:
        turns = await queries.turns_between(self._open_sessions(), since, until, limit)
        return buckets(turns, since, until, bucket_s)

    def recording_file(self, call: CallRecord) -> Path | None:
        """The call's WAV on this replica's disk, if it has one there and it is still there."""
        if call.recording is None or is_object(call.recording):
            return None
        path = (self.data_dir / call.recording).resolve()
        if not path.is_relative_to(self.recordings_dir.resolve()) or not path.is_file():
            return None
        return path

    async def recording_object(self, call: CallRecord, byte_range: str | None) -> Fetched | None:
        """The call's WAV in object storage (or the byte range asked for), if it has one there."""
        if call.recording is None or not is_object(call.recording):
            return None
        if self.bucket is None:
            log.warning("call store: call %s's recording is in object storage, and storage.recordings_url is not "
                        "set on this replica", call.id)
            return None
        return await self.bucket.get(call.recording, byte_range)

    # Retention.

    async def purge(self, now: dt.datetime | None = None) -> int:
        """Delete the calls started more than retention_days before `now`, their turns and recordings,
        and any stray file in the recordings folder older than that. Returns how many calls went."""
        if self.config.retention_days <= 0:
            return 0
        cutoff = (now or self._wall()) - dt.timedelta(days=self.config.retention_days)
        async with self._purge_lock() as held:
            if not held:
                log.info("call store: another replica is purging old calls; this one waits for its next round")
                return 0
            deleted, files = await queries.delete_calls_before(self._open_sessions(), cutoff)
        objects = [f for f in files if is_object(f)]
        removed = await asyncio.to_thread(self._remove_files, [f for f in files if not is_object(f)], cutoff)
        if objects and self.bucket is not None:
            removed += await self.bucket.delete(objects)
        elif objects:
            log.warning("call store: %d purged calls had recordings in object storage, and storage.recordings_url "
                        "is not set here: they are left there", len(objects))
        if deleted or removed:
            log.info("call store: purged %d calls and %d recordings older than %s", deleted, removed, cutoff)
        return deleted

    @contextlib.asynccontextmanager
    async def _purge_lock(self) -> AsyncIterator[bool]:
        """On PostgreSQL, a session advisory lock that one replica at a time holds while it purges
        (held by a connection of its own, so it goes with the connection if the replica dies);
        whether it was had. SQLite is one replica's own file: always had."""
        assert self._engine is not None, "the store is not open"
        if self._engine.dialect.name != "postgresql":
            yield True
            return
        async with self._engine.connect() as connection:
            held = bool((await connection.execute(text("SELECT pg_try_advisory_lock(:key)"),
                                                  {"key": PURGE_LOCK})).scalar())
            try:
                yield held
            finally:
                if held:
                    await connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": PURGE_LOCK})
                await connection.commit()

    def _remove_files(self, relative: list[str], cutoff: dt.datetime) -> int:
        removed = 0
        for name in relative:
            path = self.data_dir / name
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed += 1
        if self.recordings_dir.is_dir():
            for path in self.recordings_dir.iterdir():
                with contextlib.suppress(FileNotFoundError):
                    if path.is_file() and path.stat().st_mtime < cutoff.timestamp():
                        path.unlink()
                        removed += 1
        return removed

    async def _purge_periodically(self) -> None:
        while True:
            try:
                await self.purge()
            except Exception:
                log.exception("call store: purging old calls failed; trying again in %.0f s",
                              self.config.purge_interval_s)
            self.purge_rounds += 1
            await self._clock.sleep(self.config.purge_interval_s)


def recording_name(call_id: str) -> str:
    """A file name for the call's WAV: the id where it is safe as a name, else a cleaned id and a hash."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", call_id)[:100].lstrip(".")
    if safe != call_id or not safe:
        safe = f"{safe}-{hashlib.sha256(call_id.encode()).hexdigest()[:10]}"
    return f"{safe}.wav"
