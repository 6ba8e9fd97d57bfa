"""A real PostgreSQL server for the tests: Debian's (scripts/setup.sh --test installs it), a
throwaway cluster made with initdb in a temporary folder and started with pg_ctl on a free port,
trusting local connections, stopped and deleted after. Run as root, the cluster belongs to the
`postgres` user (PostgreSQL refuses to run as root). VOICE_AGENT_TEST_POSTGRES_URL names an
existing server instead."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
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


@contextmanager
def postgres_server() -> Iterator[str]:
    """A running PostgreSQL; yields a URL to its `postgres` database as a superuser."""
    if GIVEN_URL:
        yield GIVEN_URL
        return
    binaries = _binaries()
    if binaries is None:
        missing("PostgreSQL is not installed: scripts/setup.sh --test installs Debian's postgresql "
                    "(or set VOICE_AGENT_TEST_POSTGRES_URL)")
    folder = Path(tempfile.mkdtemp(prefix="voice-agent-pg-"))
    data, port = folder / "data", free_port()
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    subprocess.run(_as_owner([str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                              "--no-sync", "-E", "UTF8"]), check=True, capture_output=True)
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100"
    started = subprocess.run(_as_owner([str(binaries / "pg_ctl"), "-D", str(data), "-l", str(folder / "log"),
                                        "-o", options, "-w", "-t", "60", "start"]), capture_output=True, text=True)
    if started.returncode != 0:
        log = (folder / "log").read_text() if (folder / "log").exists() else ""
        shutil.rmtree(folder, ignore_errors=True)
        raise RuntimeError(f"PostgreSQL did not start: {started.stderr}{log}")
    try:
        time.sleep(0)  # pg_ctl -w returned once it accepts connections
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(_as_owner([str(binaries / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                       capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)
