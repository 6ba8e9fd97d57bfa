"""A real Redis server for the tests: Debian's redis-server (scripts/setup.sh --test installs it),
started on a free port with nothing persisted, stopped after. `redis_process` yields the server
itself, which can be stopped and started again on the same port (a restart under running replicas:
what was kept in it is gone, as after a real restart without persistence)."""

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


class RedisServer:
    """redis-server on `port`, its log and working folder in `folder`."""

    def __init__(self, binary: str, folder: Path, port: int) -> None:
        self.binary, self.folder, self.port = binary, folder, port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.log = folder / "redis.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.process is not None

    def start(self) -> None:
        """Start it and return once it answers PING."""
        assert self.process is None, "already running"
        self.process = subprocess.Popen([self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                         "--appendonly", "no", "--dir", str(self.folder), "--logfile", str(self.log)])
        client = redis.Redis.from_url(self.url, socket_timeout=1)
        deadline = time.monotonic() + 20
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.exceptions.ConnectionError:
                    if time.monotonic() > deadline or self.process.poll() is not None:
                        said = self.log.read_text() if self.log.exists() else ""
                        raise RuntimeError(f"redis-server did not start: {said[-4000:]}") from None
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        """Stop it (SIGTERM: its clients' connections are closed) and wait until it has exited."""
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.process = None


@contextmanager
def redis_process(folder: Path) -> Iterator[RedisServer]:
    """A running redis-server, which a test may stop and start again."""
    binary = shutil.which("redis-server")
    if binary is None:
        missing("redis-server is not installed: scripts/setup.sh --test installs Debian's redis-server")
    server = RedisServer(binary, folder, free_port())
    try:
        server.start()
        yield server
    finally:
        server.stop()


@contextmanager
def redis_server(folder: Path) -> Iterator[str]:
    """A running redis-server; yields its URL."""
    with redis_process(folder) as server:
        yield server.url
