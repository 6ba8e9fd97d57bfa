"""A real Redis server for the tests: Debian's redis-server (scripts/setup.sh --test installs it),
started on a free port with nothing persisted, stopped after."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from tests.needs import missing


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def redis_server(folder: Path) -> Iterator[str]:
    """A running redis-server; yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        missing("redis-server is not installed: scripts/setup.sh --test installs Debian's redis-server")
    port = free_port()
    log = folder / "redis.log"
    process = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                "--dir", str(folder), "--logfile", str(log)])
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url, socket_timeout=1)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    said = log.read_text() if log.exists() else ""
                    raise RuntimeError(f"redis-server did not start: {said}") from None
                time.sleep(0.05)
        client.close()
        yield url
    finally:
        process.terminate()
        process.wait(10)
