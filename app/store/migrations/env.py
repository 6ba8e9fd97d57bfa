"""Alembic's environment, run by app/store/db.py with an open connection in
`config.attributes["connection"]` (there is no alembic.ini: the URL comes from the service's settings).

A new revision: copy the last module in versions/, chain its down_revision, and write its
operations; tests/store/test_migrations.py fails while the tables and the migrations disagree.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from app.store.tables import Base


def run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True,
                      compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("the store's migrations run through app.store.db (they need an open connection)")
run(connection)
