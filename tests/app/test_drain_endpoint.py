"""Draining under an ASGI server other than `voice-agent serve`: plain uvicorn, whose SIGTERM closes
every WebSocket at once (1012). `voice-agent drain --wait` first (POST /api/drain, with the key the
settings hold) lets the call in progress finish its reply and hear the goodbye; readiness fails
meanwhile; the command returns once no call is left; the SIGTERM after finds nothing to cut. A real
process over fake engines (tests/app/fake_server.py, named as fakes), real sockets, real signals."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import websockets

from tests.app.test_shutdown import free_port, kept_turns, speak_until_mid_reply

KEY = "drain-test-key-0123456789"
DRAIN_S = 8.0


def start_under_uvicorn(tmp: Path) -> tuple[str, subprocess.Popen[bytes], Path, dict[str, str]]:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "VOICE_AGENT_SERVER__PORT": str(port),
           "VOICE_AGENT_STORAGE__DATA_DIR": str(tmp / "data"), "VOICE_AGENT_SERVER__API_KEYS": json.dumps([KEY]),
           "VOICE_AGENT_SERVER__DRAIN_TIMEOUT_S": str(DRAIN_S), "FAKE_TOKEN_DELAY_S": "0.1"}
    log_path = tmp / "uvicorn.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "--factory", "tests.app.fake_server:create_fake_app",
                                 "--host", "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                                env=env)
    base = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, log_path.read_text()[-3000:]
        try:
            if httpx.get(f"http://{base}/readyz", timeout=2).status_code == 200:
                return base, proc, log_path, env
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, log_path.read_text()[-3000:]
        time.sleep(0.2)


async def call_through_drain(base: str, env: dict[str, str]) -> dict[str, Any]:
    seen: list[dict[str, Any]] = []
    auth = {"Authorization": f"Bearer {KEY}"}
    async with websockets.connect(f"ws://{base}/ws", additional_headers=auth) as ws:
        started = await speak_until_mid_reply(ws, seen)
        drain = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "app.cli", "drain", "--wait", env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        async with httpx.AsyncClient(timeout=5) as http:
            deadline = time.monotonic() + 10
            while (ready := await http.get(f"http://{base}/readyz")).status_code == 200:
                assert time.monotonic() < deadline, "readiness never failed"
                await asyncio.sleep(0.05)
            unkeyed = await http.post(f"http://{base}/api/drain")
        async for message in ws:  # the reply goes on to its end, then the goodbye and the close
            if isinstance(message, str):
                seen.append(json.loads(message))
        said, _ = await asyncio.wait_for(drain.communicate(), DRAIN_S + 20)
        return {"started": started, "seen": seen, "close_code": ws.close_code, "ready": ready.json(),
                "unkeyed": unkeyed.status_code, "drain_code": drain.returncode, "drain_said": said.decode()}


async def test_drain_before_sigterm_under_plain_uvicorn_lets_the_reply_finish_and_keeps_the_record(
        tmp_path: Path) -> None:
    base, proc, log_path, env = start_under_uvicorn(tmp_path)
    try:
        result = await call_through_drain(base, env)
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 20)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = log_path.read_text()
    kinds = [m.get("type") for m in result["seen"]]
    done = [m for m in result["seen"] if m.get("type") == "response.done"]
    assert done and done[0]["status"] == "completed", (kinds, log[-3000:])
    goodbye = result["seen"][-1]
    assert goodbye["type"] == "error" and goodbye["code"] == "server_shutting_down", kinds
    assert result["close_code"] == 1001  # not uvicorn's 1012: the call was over before the signal
    assert result["ready"]["status"] == "shutting_down", result["ready"]
    assert result["unkeyed"] == 401  # /api/drain takes a key, as all of /api
    assert result["drain_code"] == 0 and result["drain_said"].startswith("drained: 0 calls"), result["drain_said"]
    # uvicorn (0.29 and later) shuts down cleanly, then dies of the signal it caught, as the process would have
    assert code in (0, -signal.SIGTERM) and "Application shutdown complete" in log, (code, log[-3000:])
    end_reason, turns = await kept_turns(tmp_path / "data", result["started"]["session_id"])
    assert end_reason == "server_shutdown" and turns >= 1
