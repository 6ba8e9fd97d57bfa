"""The migrations run from empty on SQLite and on a real PostgreSQL (tests/postgres_server.py), leave
the schema the tables describe, and run again as a no-op."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, make_url, text
from sqlalchemy.engine import Connection

from app.store import CallFilter, StorageConfig
from app.store.db import MIGRATION_LOCK, PURGE_LOCK, current_revision, head_revision, make_engine, upgrade
from app.store.store import CallStore
from app.store.tables import Base
from tests.postgres_server import postgres_server
from tests.store.helpers import call, open_store, turn


def _schema_differences(connection: Connection) -> list[object]:
    context = MigrationContext.configure(connection, opts={"compare_type": True})
    diffs: list[object] = compare_metadata(context, Base.metadata)
    return diffs


async def _check_fresh_database(url: str) -> None:
    engine = make_engine(StorageConfig(url=url).database_url())
    try:
        await upgrade(engine)
        async with engine.connect() as connection:
            tables = set(await connection.run_sync(lambda c: inspect(c).get_table_names()))
            assert {"calls", "turns", "alembic_version"} <= tables
            assert await connection.run_sync(current_revision) == head_revision()
            assert await connection.run_sync(_schema_differences) == []
            indexes = await connection.run_sync(lambda c: {i["name"] for i in inspect(c).get_indexes("calls")})
            assert {"ix_calls_started_at", "ix_calls_status_started_at", "ix_calls_v2v_max_ms"} <= indexes
        await upgrade(engine)  # at head: nothing to do, nothing fails
    finally:
        await engine.dispose()


async def test_migrations_run_from_empty_on_sqlite(tmp_path: Path) -> None:
    await _check_fresh_database(f"sqlite:///{tmp_path / 'fresh.db'}")


async def test_sqlite_runs_in_wal_mode_with_foreign_keys(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    try:
        assert (tmp_path / "calls.db").is_file() and (tmp_path / "recordings").is_dir()
        engine = make_engine(store.config.database_url())
        async with engine.connect() as connection:
            assert (await connection.execute(text("PRAGMA journal_mode"))).scalar() == "wal"
            assert (await connection.execute(text("PRAGMA foreign_keys"))).scalar() == 1
        await engine.dispose()
    finally:
        await store.close()


async def test_a_store_opens_again_on_its_own_database(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    store.call_started(call("kept"))
    store.turn_ended("kept", turn(0))
    await store.close()
    store = await open_store(tmp_path)
    try:
        found = await store.get_call("kept")
        assert found is not None and len(found[1]) == 1
    finally:
        await store.close()


@pytest.fixture(scope="module")
def postgres_server_url() -> Iterator[str]:
    with postgres_server() as url:
        yield url


@pytest.fixture
async def postgres_url(postgres_server_url: str) -> AsyncIterator[str]:
    """A throwaway database on the test's PostgreSQL server, dropped afterwards."""
    name = f"voice_agent_test_{uuid.uuid4().hex[:8]}"
    engine = make_engine(StorageConfig(url=postgres_server_url).database_url())
    admin = engine.execution_options(isolation_level="AUTOCOMMIT")
    async with admin.connect() as connection:
        await connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(postgres_server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        async with admin.connect() as connection:
            await connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        await engine.dispose()


async def test_migrations_run_from_empty_on_postgresql(postgres_url: str) -> None:
    await _check_fresh_database(postgres_url)


async def test_calls_and_turns_round_trip_on_postgresql(postgres_url: str, tmp_path: Path) -> None:
    store = await open_store(tmp_path, url=postgres_url)
    try:
        store.call_started(call("pg-call"))
        store.turn_ended("pg-call", turn(0))
        store.turn_ended("pg-call", turn(1, status="interrupted", v2v=900.0))
        await store.flush()
        found = await store.get_call("pg-call")
        assert found is not None
        record, turns = found
        assert record.started_at == call().started_at and record.status == "interrupted"
        assert record.v2v_max_ms == 900.0 and [t.turn_id for t in turns] == [0, 1]
        assert turns[0].spec == turn(0).spec and turns[0].latency_ms == turn(0).latency_ms
        page = await store.list_calls(CallFilter(min_v2v_ms=800.0))
        assert [c.id for c in page.calls] == ["pg-call"]
    finally:
        await store.close()


async def first_rounds_done(*stores: CallStore) -> None:
    """Wait (an event, not a time) until each store's retention task has done its first round, so
    that no background purge holds the lock while a test takes it."""
    async def done() -> None:
        while any(store.purge_rounds < 1 for store in stores):
            await asyncio.sleep(0.01)
    await asyncio.wait_for(done(), 60)


def test_migration_and_purge_have_locks_of_their_own() -> None:
    assert MIGRATION_LOCK != PURGE_LOCK  # else a replica migrating and another purging wait for each other


async def test_one_replica_at_a_time_purges_on_postgresql(postgres_url: str, tmp_path: Path) -> None:
    """Two stores on one PostgreSQL database (two replicas): while one holds the purge's advisory
    lock, the other's purge waits for its next round; then it purges."""
    recent = dt.datetime.now(dt.UTC) - dt.timedelta(hours=12)  # not past retention by the real clock
    later = recent + dt.timedelta(days=2)  # past it at the purge's `now`
    first = await open_store(tmp_path / "first", url=postgres_url, retention_days=1)
    second = await open_store(tmp_path / "second", url=postgres_url, retention_days=1)
    engine = make_engine(StorageConfig(url=postgres_url).database_url())
    try:
        await first_rounds_done(first, second)  # each store's retention task purges once when it opens
        first.call_started(call("old", started=recent))
        await first.flush()
        async with engine.connect() as other_replica:  # purging now, as far as the others can tell
            assert (await other_replica.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": PURGE_LOCK})).scalar()
            assert await second.purge(now=later) == 0
            assert await second.get_call("old") is not None
            await other_replica.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": PURGE_LOCK})
        assert await second.purge(now=later) == 1
        assert await first.get_call("old") is None
    finally:
        await engine.dispose()
        await first.close()
        await second.close()
