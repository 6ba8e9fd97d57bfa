"""A process killed mid-call (SIGKILL: no shutdown, no flush) keeps every turn that had ended: each was
written, in its own transaction, soon after it was handed over."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.store.helpers import open_store

ROOT = Path(__file__).resolve().parents[2]
TURNS = 12
# The child: a call whose turns end 50 ms apart (real ones are seconds apart); after the last one it
# says so, 300 ms later, and goes on as if the caller were still talking, until it is killed.
CHILD = """
import asyncio, sys
from app.store import CallStore
from tests.store.helpers import T0, call, storage, turn

async def main() -> None:
    store = CallStore(storage(sys.argv[1]))
    await store.open()
    store.call_started(call("crash"))
    for i in range(int(sys.argv[2])):
        store.turn_ended("crash", turn(i))
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    print("ended", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def test_a_killed_process_keeps_every_turn_that_had_ended(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), str(TURNS)], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ended"
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(30)
    assert child.returncode == -signal.SIGKILL

    with sqlite3.connect(tmp_path / "calls.db") as db:  # the killed writer left a consistent file
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)

    async def read() -> None:
        store = await open_store(tmp_path)
        try:
            found = await store.get_call("crash")
            assert found is not None
            assert [t.turn_id for t in found[1]] == list(range(TURNS))
            assert found[0].turns_count == TURNS and found[0].ended_at is None
        finally:
            await store.close()

    asyncio.run(read())
