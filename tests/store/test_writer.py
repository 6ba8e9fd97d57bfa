"""Handing a record to the store never waits on the database: not when it is slow, not when it is
stuck. A full queue drops records (logged, counted); a failing write is retried when the failure is
transient (through a database restart, up to storage.write_retry_s) and skipped otherwise, and the
writer goes on with the next record."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from asyncpg.exceptions import AdminShutdownError, CannotConnectNowError, TooManyConnectionsError, UniqueViolationError
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.store import CallStore
from app.store.writer import RETRY_DELAYS_S, Op, TurnEnded, Writer, transient
from core.clock import FakeClock
from tests.store.helpers import call, storage, turn


class PausedDatabase:
    """A fake database that takes no write until released (a stuck server, a locked disk)."""

    def __init__(self, writer: Writer) -> None:
        self.released = asyncio.Event()
        self.entered = asyncio.Event()  # a write has begun (and waits)
        self._write = writer.write
        self.started = 0

    async def write(self, op: Op) -> None:
        self.started += 1
        self.entered.set()
        await self.released.wait()
        await self._write(op)


@pytest.fixture
async def dropped(tmp_path: Path) -> AsyncIterator[tuple[CallStore, list[str]]]:
    reasons: list[str] = []
    store = CallStore(storage(tmp_path, max_pending=10), clock=FakeClock(), on_drop=reasons.append)
    await store.open()
    yield store, reasons
    await store.close()


def _pause(store: CallStore, monkeypatch: pytest.MonkeyPatch) -> PausedDatabase:
    writer = store._writer
    assert writer is not None
    paused = PausedDatabase(writer)
    monkeypatch.setattr(writer, "write", paused.write)
    return paused


async def test_handing_over_never_waits_for_a_stuck_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CallStore(storage(tmp_path, max_pending=5000))
    await store.open()
    paused = _pause(store, monkeypatch)
    store.call_started(call("c1"))
    await asyncio.wait_for(paused.entered.wait(), 5)  # the writer holds the first record and waits on the database
    for i in range(1000):  # handed over while it waits: each returns without the database (none is awaited)
        assert store.turn_ended("c1", turn(i)) is None
    assert paused.started == 1 and store.dropped == 0  # still stuck on the first, and nothing lost
    paused.released.set()
    await store.flush()
    found = await store.get_call("c1")
    assert found is not None and found[0].turns_count == 1000
    await store.close()


async def test_a_full_queue_drops_records_with_a_warning_and_a_count(
        dropped: tuple[CallStore, list[str]], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    store, reasons = dropped
    paused = _pause(store, monkeypatch)
    store.call_started(call("c1"))
    await asyncio.sleep(0.01)  # the writer took the start record and is stuck on it: 10 places left
    with caplog.at_level(logging.WARNING, logger="app.store.writer"):
        for i in range(25):
            store.turn_ended("c1", turn(i))
    assert reasons == ["queue_full"] * 15 and store.dropped == 15
    assert any("write queue is full" in r.getMessage() for r in caplog.records)
    paused.released.set()
    await store.flush()
    found = await store.get_call("c1")
    assert found is not None and [t.turn_id for t in found[1]] == list(range(10))  # the first ten, in order


async def test_a_transient_failure_is_retried_and_a_bad_record_skipped(
        dropped: tuple[CallStore, list[str]], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    store, reasons = dropped
    writer = store._writer
    assert writer is not None
    real_write = writer.write
    failures = {"locked": 2}

    async def flaky(op: Op) -> None:  # a fake database: locked twice, and one record it refuses
        if failures["locked"]:
            failures["locked"] -= 1
            raise OperationalError("INSERT", {}, Exception("database is locked"))
        if isinstance(op, TurnEnded) and op.turn.turn_id == 1:
            raise IntegrityError("INSERT", {}, Exception("refused"))
        await real_write(op)

    monkeypatch.setattr(writer, "write", flaky)
    with caplog.at_level(logging.WARNING, logger="app.store.writer"):
        store.call_started(call("c1"))
        for i in range(3):
            store.turn_ended("c1", turn(i))
        await store.flush()
    found = await store.get_call("c1")
    assert found is not None and [t.turn_id for t in found[1]] == [0, 2]
    assert reasons == ["write_failed"]
    assert sum("trying again" in r.getMessage() for r in caplog.records) == 2


async def test_records_handed_over_before_open_are_dropped_not_raised() -> None:
    reasons: list[str] = []
    store = CallStore(storage(Path("/nonexistent")), on_drop=reasons.append)
    store.turn_ended("c1", turn(0))
    assert reasons == ["not_open"]


class FakeRestartingDatabase:
    """A fake database server that is restarting until the clock reaches `up_at`: it refuses connections
    (as asyncpg raises it, a bare OSError), then says it is starting up (SQLSTATE 57P03), then drops a
    connection; from `up_at` on, the real database behind it takes the writes."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], clock: FakeClock, down_s: float) -> None:
        self._sessions = sessions
        self._clock = clock
        self.up_at = clock.now() + down_s
        self.refused = 0

    def begin(self) -> Any:
        if self._clock.now() < self.up_at:
            self.refused += 1
            failures: list[Exception] = [
                ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 5432)"),
                DBAPIError("INSERT", {}, CannotConnectNowError("the database system is starting up")),
                OperationalError("INSERT", {}, Exception("server closed the connection unexpectedly"))]
            raise failures[self.refused % len(failures)]
        return self._sessions.begin()


async def _restarting_store(tmp: Path, down_s: float, **settings: object) -> tuple[
        CallStore, FakeClock, FakeRestartingDatabase, list[float]]:
    """A store whose database restarts for `down_s` of fake time; returns the clock times of its drops too."""
    clock = FakeClock()
    drops: list[float] = []
    store = CallStore(storage(tmp, **settings), clock=clock, on_drop=lambda _: drops.append(clock.now()))
    await store.open()
    writer = store._writer
    assert writer is not None
    database = FakeRestartingDatabase(writer._sessions, clock, down_s)
    writer._sessions = database  # type: ignore[assignment]
    return store, clock, database, drops


async def test_a_write_is_tried_again_through_a_database_restart_of_half_a_minute(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store, clock, database, drops = await _restarting_store(tmp_path, down_s=30.0)  # storage.write_retry_s: 60
    started = clock.now()
    with caplog.at_level(logging.WARNING, logger="app.store.writer"):
        store.call_started(call("c1"))
        for i in range(3):
            store.turn_ended("c1", turn(i))
        await store.flush()
    assert clock.now() - started >= 30.0 and database.refused > 3  # it waited the restart out, trying again
    assert drops == [] and store.dropped == 0
    found = await store.get_call("c1")
    assert found is not None and found[0].transport == "ws" and [t.turn_id for t in found[1]] == [0, 1, 2]
    said = [r.getMessage() for r in caplog.records]
    assert sum("trying again" in line for line in said) == database.refused, said
    assert any("takes writes again" in line for line in said), said
    await store.close()


async def test_a_write_failing_past_storage_write_retry_s_is_dropped_and_counted_and_the_next_is_written(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store, clock, _, drops = await _restarting_store(tmp_path, down_s=30.0, write_retry_s=20.0)
    started = clock.now()
    with caplog.at_level(logging.WARNING, logger="app.store.writer"):
        store.call_started(call("c1"))  # fails for 20 s: dropped
        store.turn_ended("c1", turn(0))  # tried from then on: written once the database is back, 10 s later
        await store.flush()
    assert len(drops) == 1 and store.dropped == 1
    assert 20.0 <= drops[0] - started < 20.0 + RETRY_DELAYS_S[-1], drops  # not before the bound, nor long after
    assert any("could not be written" in r.getMessage() and "storage.write_retry_s" in r.getMessage()
               for r in caplog.records)
    found = await store.get_call("c1")
    assert found is not None and [t.turn_id for t in found[1]] == [0]
    assert found[0].transport == "unknown"  # its start record was the one dropped
    await store.close()


def _sqlite_error(message: str, code: int) -> sqlite3.OperationalError:
    error = sqlite3.OperationalError(message)
    error.sqlite_errorcode = code  # as the driver sets it
    return error


@pytest.mark.parametrize(("error", "passing"), [
    (ConnectionRefusedError(111, "Connect call failed"), True),
    (TimeoutError(), True),
    (OperationalError("INSERT", {}, Exception("database is locked")), True),
    (OperationalError("INSERT", {}, _sqlite_error("database is locked", 5)), True),
    (OperationalError("INSERT", {}, _sqlite_error("database table is locked", 262)), True),  # SQLITE_LOCKED_SHAREDCACHE
    (OperationalError("INSERT", {}, _sqlite_error("attempt to write a readonly database", 8)), False),
    (OperationalError("INSERT", {}, _sqlite_error("database or disk is full", 13)), False),
    (DBAPIError("INSERT", {}, CannotConnectNowError("the database system is starting up")), True),
    (DBAPIError("INSERT", {}, AdminShutdownError("terminating connection due to administrator command")), True),
    (DBAPIError("INSERT", {}, TooManyConnectionsError("sorry, too many clients already")), True),
    (DBAPIError("INSERT", {}, Exception("gone"), connection_invalidated=True), True),
    (IntegrityError("INSERT", {}, UniqueViolationError("duplicate key")), False),
    (DBAPIError("INSERT", {}, Exception("value too long")), False),
    (ValueError("bad record"), False),
])
def test_which_failures_are_passing(error: BaseException, passing: bool) -> None:
    assert transient(error) is passing
