"""The store's one writer: records handed over on the audio path wait on a bounded queue, and one
task writes them in order, each in its own short transaction, as soon as it can. Handing a record
over costs a queue append (about a microsecond) and never waits: when the queue is full the record
is dropped, logged and counted, so a slow or unreachable database can never stall a call.

A write that fails for a passing reason (the database restarting, out of reach, out of connections;
a locked SQLite file) is tried again, ever less often, for up to storage.write_retry_s (60 s: a
PostgreSQL restart), while the records behind it wait their turn; past that its record is dropped
and counted, and the writer goes on with the next. A record the database refuses is dropped at once."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import sqlite3
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.store.records import CallRecord, TurnRecord
from app.store.rows import call_row, summarize, turn_row
from app.store.tables import Call, Turn
from core.clock import Clock

log = logging.getLogger(__name__)
MAX_TALLIES = 1024  # calls whose turns' figures are kept in memory (live calls; more are read back)
RETRY_DELAYS_S = (0.2, 0.5, 1.0, 2.0, 5.0)  # the waits between the tries of a failing write; the last repeats
RETRY_S = 60.0  # storage.write_retry_s: how long a failing write is tried again
# SQLSTATE classes of a server that cannot take the write now: 08 connection exception, 53 insufficient
# resources (too many connections), 57P operator intervention (shutting down, "the database system is
# starting up")
TRANSIENT_SQLSTATES = ("08", "53", "57P")
SQLITE_BUSY, SQLITE_LOCKED = 5, 6  # SQLite's primary result codes for a file another writer holds


@dataclass(frozen=True)
class CallStarted:
    call: CallRecord


@dataclass(frozen=True)
class TurnEnded:
    call_id: str
    turn: TurnRecord


@dataclass(frozen=True)
class CallEnded:
    call_id: str
    ended_at: dt.datetime
    end_reason: str
    error: str | None


@dataclass(frozen=True)
class RecordingSaved:
    call_id: str
    path: str  # relative to the data folder


Op = CallStarted | TurnEnded | CallEnded | RecordingSaved


class Writer:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], clock: Clock, max_pending: int,
                 on_drop: Callable[[str], None] | None = None, retry_s: float = RETRY_S) -> None:
        self._sessions = sessions
        self._clock = clock
        self.retry_s = retry_s
        self._queue: asyncio.Queue[Op] = asyncio.Queue(max_pending)
        self._on_drop = on_drop
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0  # records lost: queue full, or a write that kept failing
        # the figures of each live call's turns, so a turn's write does not read back the whole call
        self._tallies: OrderedDict[str, dict[int, TurnRecord]] = OrderedDict()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="call-store-writer")

    def put(self, op: Op) -> None:
        """Queue a record; never waits. Call from the event loop's thread."""
        try:
            self._queue.put_nowait(op)
        except asyncio.QueueFull:
            self._drop("queue_full", op, f"the write queue is full ({self._queue.maxsize} records)")

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    async def flush(self) -> None:
        """Wait until every record queued so far is written (or dropped)."""
        await self._queue.join()

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Write what is queued (waiting at most timeout_s), then end the task."""
        if self._task is None:
            return
        try:
            await asyncio.wait_for(self.flush(), timeout_s)
        except TimeoutError:
            log.error("call store: %d records not written after %.0f s; they are lost", self.pending, timeout_s)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    async def _run(self) -> None:
        while True:
            op = await self._queue.get()
            try:
                await self._write_with_retries(op)
            except Exception as exc:
                log.exception("call store: writing %s failed", type(op).__name__)
                self._drop("write_failed", op, f"{type(exc).__name__}: {exc}", logged=True)
            finally:
                self._queue.task_done()

    async def _write_with_retries(self, op: Op) -> None:
        """Write the record, trying again after a passing failure until retry_s have gone by since the
        first; then (or for a failure that is not passing) raise the last error."""
        first_failed: float | None = None
        tries = 0
        while True:
            try:
                await self.write(op)
            except Exception as exc:
                if not transient(exc):
                    raise
                now = self._clock.now()
                first_failed = now if first_failed is None else first_failed
                waited, tries = now - first_failed, tries + 1
                if waited >= self.retry_s:
                    log.error("call store: a %s record of call %s could not be written in %d tries over %.1f s "
                              "(storage.write_retry_s)", type(op).__name__, _call_id(op), tries, waited)
                    raise
                delay = min(RETRY_DELAYS_S[min(tries, len(RETRY_DELAYS_S)) - 1], self.retry_s - waited)
                log.warning("call store: %s; trying again in %.1f s (try %d, failing for %.1f s of at most %.0f s)",
                            _reason(exc), delay, tries, waited, self.retry_s)
                await self._clock.sleep(delay)
            else:
                if first_failed is not None:
                    log.warning("call store: the database takes writes again; the %s record of call %s is written "
                                "after %d failed tries over %.1f s", type(op).__name__, _call_id(op), tries,
                                self._clock.now() - first_failed)
                return

    async def write(self, op: Op) -> None:
        """One record, one transaction."""
        try:
            await self._write(op)
        except BaseException:
            self._tallies.pop(_call_id(op), None)  # it may hold a turn that was not written: read it back
            raise

    async def _write(self, op: Op) -> None:
        async with self._sessions.begin() as session:
            if isinstance(op, CallStarted):
                await _insert_call(session, op.call)
            elif isinstance(op, TurnEnded):
                await self._insert_turn(session, op.call_id, op.turn)
            elif isinstance(op, CallEnded):
                await self._end_call(session, op)
            else:
                call = await session.get(Call, op.call_id)
                if call is not None:
                    call.recording = op.path

    async def _insert_turn(self, session: AsyncSession, call_id: str, turn: TurnRecord) -> None:
        call = await session.get(Call, call_id)
        if call is None:
            # No start record (dropped, or the transport never sent one): keep the turn under a placeholder.
            call = call_row(CallRecord(id=call_id, transport="unknown",
                                       started_at=turn.at - dt.timedelta(seconds=turn.offset_s)))
            session.add(call)
        await session.merge(turn_row(call_id, turn))  # a turn handed over twice is written once
        tally = await self._tally(session, call)
        tally[turn.turn_id] = turn
        _set_summary(call, tally)

    async def _end_call(self, session: AsyncSession, op: CallEnded) -> None:
        call = await session.get(Call, op.call_id)
        if call is None:
            log.warning("call store: call %s ended but was never started; not kept", op.call_id)
            return
        call.ended_at, call.end_reason, call.end_error = op.ended_at, op.end_reason, op.error
        _set_summary(call, await self._tally(session, call))
        self._tallies.pop(call.id, None)

    async def _tally(self, session: AsyncSession, call: Call) -> dict[int, TurnRecord]:
        """The call's turns' figures: kept in memory while the call lasts, read from the database the
        first time (after a restart, or for a call pushed out of the cache)."""
        tally = self._tallies.get(call.id)
        if tally is None:
            rows = await session.execute(select(Turn.turn_id, Turn.status, Turn.error, Turn.voice_to_voice_ms,
                                                Turn.latency_ms).where(Turn.call_id == call.id))
            tally = {turn_id: TurnRecord(turn_id=turn_id, at=call.started_at, offset_s=0.0, status=status,
                                         error=error, voice_to_voice_ms=v2v, latency_ms=latency or {})
                     for turn_id, status, error, v2v, latency in rows}
            self._tallies[call.id] = tally
            while len(self._tallies) > MAX_TALLIES:
                self._tallies.popitem(last=False)
        self._tallies.move_to_end(call.id)
        return tally

    def _drop(self, reason: str, op: Op, why: str, logged: bool = False) -> None:
        self.dropped += 1
        if self._on_drop is not None:
            self._on_drop(reason)
        if not logged and (self.dropped == 1 or self.dropped % 100 == 0):  # the first, then every 100th
            log.warning("call store: dropped a %s record of call %s (%s); %d dropped so far",
                        type(op).__name__, _call_id(op), why, self.dropped)


def transient(exc: BaseException) -> bool:
    """Whether a failed write may succeed when tried again: the database was out of reach, restarting
    or busy, rather than refusing the record itself."""
    if isinstance(exc, OSError | PoolTimeout):  # asyncpg raises a refused or reset connection as it is
        return True
    if isinstance(exc, OperationalError):  # a locked SQLite file; a connection lost mid-way
        if isinstance(exc.orig, sqlite3.Error):  # a full disk, a read-only file, no table: never passes
            return (getattr(exc.orig, "sqlite_errorcode", SQLITE_BUSY) & 0xFF) in (SQLITE_BUSY, SQLITE_LOCKED)
        return True
    if isinstance(exc, DBAPIError):
        state = _sqlstate(exc.orig)
        return exc.connection_invalidated or (state is not None and state.startswith(TRANSIENT_SQLSTATES))
    return False


def _sqlstate(error: BaseException | None) -> str | None:
    """The PostgreSQL SQLSTATE of a driver's error (asyncpg's is the cause of SQLAlchemy's adapted one)."""
    while error is not None:
        state = getattr(error, "sqlstate", None)
        if isinstance(state, str):
            return state
        error = error.__cause__
    return None


def _reason(exc: BaseException) -> str:
    orig = exc.orig if isinstance(exc, DBAPIError) else None
    return f"{type(orig or exc).__name__}: {orig or exc}"


def _call_id(op: Op) -> str:
    return op.call.id if isinstance(op, CallStarted) else op.call_id


async def _insert_call(session: AsyncSession, call: CallRecord) -> None:
    existing = await session.get(Call, call.id)
    if existing is None:
        session.add(call_row(call))
        return
    # The call's first turn got here first and made a placeholder; the real start replaces it.
    existing.transport, existing.started_at = call.transport, call.started_at
    existing.fingerprint, existing.settings, existing.caller = call.fingerprint, call.settings, call.caller


def _set_summary(call: Call, turns: dict[int, TurnRecord]) -> None:
    summary = summarize(turns.values(), call_error=call.end_error is not None)
    call.turns_count, call.interruptions, call.errors = summary.turns_count, summary.interruptions, summary.errors
    call.v2v_median_ms, call.v2v_max_ms, call.status = summary.v2v_median_ms, summary.v2v_max_ms, summary.status
