"""Graceful shutdown with a real SIGTERM: a real server process (tests/app/fake_server.py: the serving
code of `voice-agent serve` over fake engines, named as fakes) is told to stop while it is
mid-reply. The reply finishes, the caller is told goodbye, new callers are refused, the call's turn
is in the store, and the process exits 0 within the drain timeout and its grace."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import websockets

from app.settings import Settings
from app.shutdown import GRACE_S
from app.store import CallStore
from app.store.config import StorageConfig

DRAIN_S = 8.0
START = json.dumps({"type": "session.start", "audio": {"sample_rate": 16000}})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_fake_server(tmp: Path, **env: str) -> tuple[str, subprocess.Popen[bytes], Path]:
    port = free_port()
    log_path = tmp / "server.log"
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "VOICE_AGENT_SERVER__PORT": str(port),
                "VOICE_AGENT_STORAGE__DATA_DIR": str(tmp / "data"), **env}
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tests.app.fake_server"], stdout=log,
                                stderr=subprocess.STDOUT, env=full_env)
    base = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://{base}/healthz", timeout=2).status_code == 200:
                return base, proc, log_path
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the server did not start:\n{log_path.read_text()[-3000:]}")


def utterance() -> list[bytes]:
    """0.6 s of loud tone (speech to the fake VAD) then 1.2 s of silence, as 20 ms PCM16 frames."""
    t = np.arange(int(0.6 * 16000)) / 16000
    tone = (0.5 * np.sin(2 * np.pi * 300 * t) * 32767).astype(np.int16)
    audio = np.concatenate([tone, np.zeros(int(1.2 * 16000), dtype=np.int16)])
    return [audio[i:i + 320].tobytes() for i in range(0, len(audio), 320)]


async def refused(base: str) -> tuple[dict[str, Any], int | None]:
    async with websockets.connect(f"ws://{base}/ws") as ws:
        first = json.loads(await asyncio.wait_for(ws.recv(), 5))
        await asyncio.wait_for(ws.wait_closed(), 5)
        return first, ws.close_code


async def speak_until_mid_reply(ws: Any, seen: list[dict[str, Any]]) -> dict[str, Any]:
    """Start a session, say one utterance, and return (session.started) at the reply's first audio,
    the events before it kept in `seen`: the server is then mid-reply."""
    await ws.send(START)
    started: dict[str, Any] = json.loads(await ws.recv())
    for frame in utterance():
        await ws.send(frame)
        await asyncio.sleep(0.005)
    while True:
        message = await asyncio.wait_for(ws.recv(), 10)
        if isinstance(message, bytes):
            return started
        seen.append(json.loads(message))


async def call_through_shutdown(base: str, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    seen: list[dict[str, Any]] = []
    async with websockets.connect(f"ws://{base}/ws") as ws:
        started = await speak_until_mid_reply(ws, seen)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        new_call, new_code = await refused(base)
        health = httpx.get(f"http://{base}/healthz", timeout=5)
        async for message in ws:  # the reply goes on to its end, then the goodbye and the close
            if isinstance(message, str):
                seen.append(json.loads(message))
        return {"started": started, "seen": seen, "close_code": ws.close_code, "signalled": signalled,
                "new_call": new_call, "new_code": new_code, "health": (health.status_code, health.json())}


async def kept_turns(data_dir: Path, call_id: str) -> tuple[str | None, int]:
    store = CallStore(StorageConfig(data_dir=str(data_dir)))
    await store.open()
    try:
        found = await store.get_call(call_id)
    finally:
        await store.close()
    assert found is not None, f"call {call_id} is not in the store"
    call, turns = found
    return call.end_reason, len(turns)


async def test_sigterm_lets_the_reply_finish_refuses_new_calls_keeps_records_and_exits_0(tmp_path: Path) -> None:
    assert Settings().server.drain_timeout_s > 0  # on by default
    base, proc, log_path = start_fake_server(tmp_path, VOICE_AGENT_SERVER__DRAIN_TIMEOUT_S=str(DRAIN_S),
                                             FAKE_TOKEN_DELAY_S="0.1")
    try:
        result = await call_through_shutdown(base, proc)
        code = await asyncio.to_thread(proc.wait, DRAIN_S + GRACE_S + 5)
        exited = time.monotonic() - result["signalled"]
    finally:
        if proc.poll() is None:
            proc.kill()
    log = log_path.read_text()
    kinds = [m.get("type") for m in result["seen"]]
    done = [m for m in result["seen"] if m.get("type") == "response.done"]
    assert done and done[0]["status"] == "completed", (kinds, log[-3000:])
    goodbye = result["seen"][-1]
    assert goodbye["type"] == "error" and goodbye["code"] == "server_shutting_down", kinds
    assert result["close_code"] == 1001
    assert result["new_call"]["code"] == "shutting_down" and result["new_code"] == 1013
    assert result["health"][0] == 503 and result["health"][1]["status"] == "draining"
    assert code == 0, log[-3000:]
    assert exited < DRAIN_S + GRACE_S, exited
    end_reason, turns = await kept_turns(tmp_path / "data", result["started"]["session_id"])
    assert end_reason == "server_shutdown" and turns >= 1


async def test_a_phone_call_is_closed_1001_with_the_reason_and_v1_answers_503_while_draining(tmp_path: Path) -> None:
    from app.main import create_app
    from app.transports.phone.messages import TWILIO
    from app.transports.phone.wire import phone_call
    from tests.app.fake_server import fake_backends
    from tests.app.test_phone import Line

    settings = Settings(storage=StorageConfig(enabled=False))
    app = create_app(settings, backends=fake_backends(0.001))
    runtime = app.state.runtime
    runtime.ready.set()
    line = Line()
    call = phone_call(line.socket, runtime, TWILIO)  # type: ignore[arg-type]
    runner = asyncio.create_task(call.run())
    line.start(runtime)
    await line.wait(lambda: call.session is not None)
    assert list(runtime.sessions) == [call.session_id]  # the call took its slot at start
    drained = asyncio.create_task(runtime.drain(grace_s=1.0))
    await asyncio.wait_for(runner, 5)  # not replying: closed at once
    await asyncio.wait_for(drained, 5)
    assert line.socket.closed_with == 1001 and line.socket.close_reason == "the server is shutting down"
    assert call.end_reason == "server_shutdown"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http:
        response = await http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 503 and response.json()["error"]["code"] == "shutting_down"


async def test_a_call_cut_by_a_forced_shutdown_is_still_recorded_as_ended(tmp_path: Path) -> None:
    """uvicorn cancels the calls still running past its graceful timeout. A call whose clean-up
    is that slow (here the fake LLM's conversation never lets go) still gets its end and its
    recording written: the runtime waits for the calls before it closes the store."""
    import threading

    import uvicorn

    from app.main import create_app
    from tests.app.fake_server import fake_backends

    settings = Settings(storage=StorageConfig(data_dir=str(tmp_path), recordings=True))
    backends = fake_backends(0.001)
    gate = threading.Event()
    backends.llm.close_gate = gate  # type: ignore[attr-defined]
    app = create_app(settings, backends=backends)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on",
                                           proxy_headers=False, timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        async with websockets.connect(f"ws://127.0.0.1:{port}/ws") as ws:
            await ws.send(START)
            call_id = json.loads(await ws.recv())["session_id"]
            for _ in range(25):  # half a second of the caller's line, for the recording
                await ws.send(np.full(320, 3000, dtype="<i2").tobytes())
            await asyncio.sleep(0.2)
            server.should_exit = True  # shutdown: the socket is closed, its clean-up hangs, uvicorn cancels it
            await asyncio.to_thread(thread.join, 30)
        assert not thread.is_alive()
    finally:
        gate.set()
        server.should_exit = True
    store = CallStore(settings.storage)
    await store.open()
    try:
        kept = await store.get_call(call_id)
    finally:
        await store.close()
    assert kept is not None
    call, _ = kept
    assert call.ended_at is not None and call.end_reason == "server_shutdown", call
    assert call.recording is not None and (tmp_path / call.recording).is_file()
