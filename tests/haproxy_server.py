"""A real load balancer for the tests and benchmarks: Debian's HAProxy (scripts/setup.sh --test
installs it), in front of voice-agent replicas on loopback, configured as docs/deployment.md
advises: it sends a replica calls only while its /readyz says 200, keeps WebSockets open for an
hour, retries a request that found no replica, and names the replica that answered in an
`X-Served-By` response header (the WebSocket upgrade's too). Its admin socket tells which replicas
it holds up or down."""

from __future__ import annotations

import resource
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.needs import missing
from tests.redis_server import free_port

CONFIG = """\
global
    maxconn {maxconn}
    stats socket {socket} mode 600 level admin

defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout http-request 10s
    # a WebSocket call lasts as long as the call: server.max_session_s
    timeout tunnel 1h
    retries 2
    option redispatch
    retry-on conn-failure empty-response

frontend voice
    bind 127.0.0.1:{port}
    option forwardfor
    default_backend replicas

backend replicas
    balance {balance}
    option httpchk
    http-check send meth GET uri /readyz
    http-check expect status 200
    http-response set-header X-Served-By %s
    default-server check inter {check_ms}ms fall 1 rise 2
{servers}
"""


@dataclass
class Balancer:
    url: str  # http://127.0.0.1:port
    admin: Path  # HAProxy's admin socket
    process: subprocess.Popen[bytes]

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/ws"

    def command(self, line: str) -> str:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(self.admin))
            s.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def states(self) -> dict[str, str]:
        """Each replica's state as HAProxy holds it: UP, DOWN, or a transition ("UP 1/2")."""
        lines = self.command("show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        rows = [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]
        return {row["svname"]: row["status"] for row in rows
                if row["pxname"] == "replicas" and row["svname"] not in ("BACKEND", "FRONTEND")}

    def wait_for(self, name: str, state: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while (now := self.states().get(name)) != state:
            assert time.monotonic() < deadline, f"HAProxy holds {name} {now}, not {state}: {self.states()}"
            time.sleep(0.05)


@contextmanager
def haproxy(folder: Path, replicas: dict[str, int], balance: str = "roundrobin",
            check_ms: int = 250) -> Iterator[Balancer]:
    """HAProxy on a free port in front of `replicas` (name -> port on 127.0.0.1); yields once every
    replica is UP."""
    binary = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if binary is None:
        missing("HAProxy is not installed: scripts/setup.sh --test installs Debian's haproxy")
    port, admin = free_port(), folder / "haproxy.sock"
    servers = "\n".join(f"    server {name} 127.0.0.1:{replica}" for name, replica in replicas.items())
    config = folder / "haproxy.cfg"
    # two descriptors a connection (client and replica side), within this process's limit
    maxconn = min(10000, (resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 200) // 2)
    config.write_text(CONFIG.format(socket=admin, port=port, balance=balance, check_ms=check_ms, servers=servers,
                                    maxconn=maxconn))
    log = (folder / "haproxy.log").open("wb")
    process = subprocess.Popen([binary, "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
    balancer = Balancer(f"http://127.0.0.1:{port}", admin, process)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if all(state == "UP" for state in balancer.states().values()):
                    break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                said = (folder / "haproxy.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"HAProxy did not come up with every replica UP: {said}")
            time.sleep(0.05)
        yield balancer
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
