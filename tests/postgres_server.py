"""A real PostgreSQL server for the tests: Debian's (scripts/setup.sh --test installs it), a
throwaway cluster made with initdb in a temporary folder and started with pg_ctl on a free port,
trusting local connections, stopped and deleted after. Run as root, the cluster belongs to the
`postgres` user (PostgreSQL refuses to run as root). VOICE_AGENT_TEST_POSTGRES_URL names an
existing server instead (which the tests cannot stop: `postgres_cluster` skips them).

`postgres_cluster` yields the server itself, which can be stopped and started again on the same
port and data folder (a restart of the shared database under running replicas)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.needs import missing
from tests.redis_server import free_port

GIVEN_URL = os.environ.get("VOICE_AGENT_TEST_POSTGRES_URL", "")


def _binaries() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(versions[-1]).parent if versions else None


def _as_owner(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


class PostgresServer:
    """A throwaway cluster in `folder`, served on `port`; `url` reaches its `postgres` database as a
    superuser. stop() and start() keep the data and the port."""

    def __init__(self, binaries: Path, folder: Path, port: int) -> None:
        self.binaries, self.folder, self.port = binaries, folder, port
        self.data = folder / "data"
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def _pg_ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(_as_owner([str(self.binaries / "pg_ctl"), "-D", str(self.data), *args]),
                              capture_output=True, text=True)

    def start(self) -> None:
        """Start it and return once it accepts connections (pg_ctl -w)."""
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100"
        started = self._pg_ctl("-l", str(self.folder / "log"), "-o", options, "-w", "-t", "60", "start")
        if started.returncode != 0:
            log = (self.folder / "log").read_text() if (self.folder / "log").exists() else ""
            raise RuntimeError(f"PostgreSQL did not start: {started.stderr}{log[-4000:]}")

    def running(self) -> bool:
        return self._pg_ctl("status").returncode == 0

    def stop(self) -> None:
        """Stop it as an operator's restart does (fast: open sessions are ended) and wait until it is down."""
        self._pg_ctl("-m", "fast", "-w", "stop")


@contextmanager
def postgres_cluster() -> Iterator[PostgresServer]:
    """A running PostgreSQL of the tests' own, which a test may stop and start again."""
    if GIVEN_URL:
        missing("a test that restarts PostgreSQL needs its own server, not VOICE_AGENT_TEST_POSTGRES_URL")
    binaries = _binaries()
    if binaries is None:
        missing("PostgreSQL is not installed: scripts/setup.sh --test installs Debian's postgresql "
                "(or set VOICE_AGENT_TEST_POSTGRES_URL)")
    folder = Path(tempfile.mkdtemp(prefix="voice-agent-pg-"))
    server = PostgresServer(binaries, folder, free_port())
    try:
        if os.geteuid() == 0:
            shutil.chown(folder, "postgres", "postgres")
        subprocess.run(_as_owner([str(binaries / "initdb"), "-D", str(server.data), "-U", "postgres",
                                  "--auth=trust", "--no-sync", "-E", "UTF8"]), check=True, capture_output=True)
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def postgres_server() -> Iterator[str]:
    """A running PostgreSQL (VOICE_AGENT_TEST_POSTGRES_URL's, or the tests' own); yields a URL to its
    `postgres` database as a superuser."""
    if GIVEN_URL:
        yield GIVEN_URL
        return
    with postgres_cluster() as server:
        yield server.url
