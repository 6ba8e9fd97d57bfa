"""Handing a record to the store never waits on the database: not when it is slow, not when it is
stuck. A full queue drops records (logged, counted); a failing write is retried when the failure is
transient and skipped otherwise, and the writer goes on with the next record."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy.exc import IntegrityError, OperationalError

from app.store import CallStore
from app.store.writer import Op, TurnEnded, Writer
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
