"""End-to-end fixtures: a real server (real models, real sockets) started once per test session.

The server runs `voice-agent serve` in a subprocess on a free port, with greedy decoding so replies
are repeatable. Models come from the cache (`voice-agent models fetch`, done by scripts/setup.sh).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.client import VoiceClient
from tests.speech import speech_samples


@dataclass
class Server:
    base_url: str
    ws_url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    tmp: Path, env: dict[str, str] | None = None, timeout: float = 480.0, port: int | None = None
) -> tuple[Server, subprocess.Popen[bytes]]:
    port = port or _free_port()
    log_path = tmp / f"server-{port}.log"
    full_env = {
        **os.environ,
        "VOICE_AGENT_LLM__TEMPERATURE": "0",
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    with log_path.open("ab") as log:  # a restart on the same port adds to its log
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, env=full_env,
        )
    server = Server(f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}/ws", log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{server.log()[-4000:]}")
        try:
            if httpx.get(server.base_url + "/healthz", timeout=2).status_code == 200:
                return server, proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"the server was not healthy within {timeout} s:\n{server.log()[-4000:]}")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="package")  # shut down after the e2e tests, before the model tests load theirs
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv, proc = start_server(tmp_path_factory.mktemp("server"))
    yield srv
    stop_server(proc)


async def ask_once(server: Server, question: str, tmp: Path, rate: int = 16000, lead_s: float = 0.0) -> VoiceClient:
    """A fresh call: speak `question` in real time (then silence) and return, still connected, once
    its response.done has arrived."""
    client = VoiceClient(server.ws_url, rate)
    started = await client.connect()
    assert started["type"] == "session.started", started
    if lead_s:
        await client.silence(lead_s)
    await client.stream(speech_samples(question, tmp, rate))
    trailing = asyncio.create_task(client.silence(15))
    try:
        await client.wait_for(lambda e: e["type"] == "response.done", 90)
    finally:
        trailing.cancel()
    return client


async def kept_call(server: Server, call_id: str, turns: int, ended: bool = True, timeout: float = 20) -> dict:
    """The API's record of a call, once it holds `turns` turns (and has ended, if asked)."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=server.base_url, timeout=5) as http:
        while True:
            response = await http.get(f"/api/calls/{call_id}")
            if response.status_code == 200:
                body: dict = response.json()
                if len(body["turns"]) >= turns and (body["call"]["ended_at"] is not None or not ended):
                    return body
            assert time.monotonic() < deadline, f"call {call_id} not kept: {response.status_code} {response.text}"
            await asyncio.sleep(0.2)
