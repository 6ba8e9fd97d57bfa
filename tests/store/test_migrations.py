"""The migrations run from empty on SQLite (and on PostgreSQL when VOICE_AGENT_TEST_POSTGRES_URL names
a server), leave the schema the tables describe, and run again as a no-op."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, make_url, text
from sqlalchemy.engine import Connection

from app.store import CallFilter, StorageConfig
from app.store.db import current_revision, head_revision, make_engine, upgrade
from app.store.tables import Base
from tests.store.helpers import call, open_store, turn

POSTGRES_URL = os.environ.get("VOICE_AGENT_TEST_POSTGRES_URL", "")


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


@pytest.fixture
async def postgres_url() -> AsyncIterator[str]:
    """A throwaway database on the server VOICE_AGENT_TEST_POSTGRES_URL names, dropped afterwards."""
    if not POSTGRES_URL:
        pytest.skip("VOICE_AGENT_TEST_POSTGRES_URL is not set (a PostgreSQL server to use)")
    name = f"voice_agent_test_{uuid.uuid4().hex[:8]}"
    engine = make_engine(StorageConfig(url=POSTGRES_URL).database_url())
    admin = engine.execution_options(isolation_level="AUTOCOMMIT")
    async with admin.connect() as connection:
        await connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
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
