"""A PostgreSQL restart under a running store loses nothing (tests/postgres_server.py, a server of the
test's own): a turn that ends while the database is down waits in the queue and is written, in
order, once it is back (app/store/writer.py tries again for up to storage.write_retry_s); the
connections the pool held before the restart are replaced (pre-ping), for writes and reads alike."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.postgres_server import PostgresServer, postgres_cluster
from tests.store.helpers import call, open_store, turn

WAIT_S = 60.0  # for the writer to try the write at least once


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with postgres_cluster() as server:
        yield server


async def test_a_turn_that_ends_while_postgresql_restarts_is_written_once_it_is_back(
        postgres: PostgresServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = await open_store(tmp_path, url=postgres.url)
    try:
        store.call_started(call("restart-call"))
        store.turn_ended("restart-call", turn(0))
        await store.flush()  # written, and a connection left in the pool
        await asyncio.to_thread(postgres.stop)
        try:
            with caplog.at_level(logging.WARNING, logger="app.store.writer"):
                store.turn_ended("restart-call", turn(1))  # the database is down
                store.turn_ended("restart-call", turn(2))
                loop = asyncio.get_running_loop()
                deadline = loop.time() + WAIT_S
                while not store.dropped and not any("trying again" in r.getMessage() for r in caplog.records):
                    assert loop.time() < deadline, "the writer never tried the write"
                    await asyncio.sleep(0.05)
                assert store.dropped == 0, [r.getMessage() for r in caplog.records]  # failed, kept for another try
        finally:
            await asyncio.to_thread(postgres.start)
        await store.flush()
        assert store.dropped == 0
        found = await store.get_call("restart-call")
        assert found is not None and [t.turn_id for t in found[1]] == [0, 1, 2]
        assert found[0].turns_count == 3
    finally:
        await store.close()
