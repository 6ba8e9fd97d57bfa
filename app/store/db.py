"""The database engine and its schema: the async engine for a storage URL (SQLite in WAL mode with
foreign keys on; PostgreSQL through asyncpg), and `upgrade`, which brings the schema to the newest
migration. Several replicas may start at once against one PostgreSQL: an advisory lock makes the
later ones wait for the first one's migration instead of racing it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import event, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

MIGRATIONS = Path(__file__).parent / "migrations"
# The project's PostgreSQL advisory locks, each with a key of its own (a replica migrating and another
# purging must not wait for each other): any constants, "voic" and "vopg".
MIGRATION_LOCK = 0x766F6963  # held by the migrating replica, for its transaction
PURGE_LOCK = 0x766F7067  # held by the replica purging old calls (app/store/store.py)


def make_engine(url: str) -> AsyncEngine:
    """An async engine for a URL that already names its async driver (StorageConfig.database_url)."""
    if url.startswith("sqlite"):
        engine = create_async_engine(url, connect_args={"timeout": 30})
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    return create_async_engine(url, pool_pre_ping=True)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    """WAL: readers (the API) never block the writer, and a write is one append to the log.
    synchronous=NORMAL in WAL mode keeps every committed transaction through a process crash (only a
    power loss can take the last ones back). Foreign keys: deleting a call deletes its turns."""
    cursor = dbapi_connection.cursor()
    for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON", "busy_timeout=30000"):
        cursor.execute(f"PRAGMA {pragma}")
    cursor.close()


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


async def upgrade(engine: AsyncEngine) -> None:
    """`alembic upgrade head` on this engine (a no-op when the schema is current)."""
    async with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            await connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        await connection.run_sync(_upgrade)


def _upgrade(connection: Connection) -> None:
    if current_revision(connection) != head_revision():
        command.upgrade(alembic_config(connection), "head")
