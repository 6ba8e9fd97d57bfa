"""/livez, /readyz and /healthz on a real server with fake engines (named as fakes): readiness
follows the admission checks every call passes (loading, draining, no free call slot), liveness
fails only when the models failed to load, and /metrics says the replica's slots."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect

from app.main import create_app
from app.settings import Settings
from app.store.config import StorageConfig
from pipeline.config import EndpointingConfig
from pipeline.session import Backends
from tests.app.live import fake_app, live
from tests.pipeline.fakes import FakeLLM, FakeRecognizer, FakeSynthesizer, FakeVad

START = json.dumps({"type": "session.start", "audio": {"sample_rate": 16000}})


def probe(address: str, path: str) -> tuple[int, dict[str, object]]:
    reply = httpx.get(f"http://{address}{path}", timeout=5)
    return reply.status_code, reply.json()


async def until_status(address: str, path: str, code: int) -> dict[str, object]:
    async with asyncio.timeout(10):
        while True:
            status, body = await asyncio.to_thread(probe, address, path)
            if status == code:
                return body
            await asyncio.sleep(0.02)


async def test_readiness_fails_while_every_call_slot_is_taken_and_comes_back_when_one_is_free() -> None:
    app = fake_app(max_sessions=1)
    with live(app) as address:
        assert probe(address, "/readyz") == (200, {"status": "ready", "sessions": 0, "max_sessions": 1})
        async with connect(f"ws://{address}/ws") as ws:
            await ws.send(START)
            assert json.loads(await ws.recv())["type"] == "session.started"
            busy = await until_status(address, "/readyz", 503)
            assert busy["status"] == "server_busy" and busy["sessions"] == 1 and "call slots" in str(busy["reason"])
            assert probe(address, "/livez")[0] == 200 and probe(address, "/healthz")[0] == 200
        assert (await until_status(address, "/readyz", 200))["sessions"] == 0
        metrics = httpx.get(f"http://{address}/metrics", timeout=5).text
        assert "voice_agent_call_slots 1.0" in metrics
        assert 'voice_agent_active_sessions{transport="realtime"}' in metrics


async def test_a_draining_replica_is_alive_but_not_ready() -> None:
    app = fake_app()
    with live(app) as address:
        app.state.runtime.draining.set()  # as SIGTERM does (app/shutdown.py)
        status, body = probe(address, "/readyz")
        assert status == 503 and body["status"] == "shutting_down"
        assert probe(address, "/healthz")[0] == 503
        assert probe(address, "/livez") == (200, {"status": "alive", "sessions": 0, "max_sessions": 8})


async def test_a_replica_whose_models_failed_to_load_is_not_alive() -> None:
    app = fake_app()
    with live(app) as address:
        runtime = app.state.runtime
        runtime.ready.clear()  # the state a failed load leaves (Runtime.load)
        runtime.load_error, runtime.status = "model_fetch_failed: the pack's checksum differs", "failed"
        status, body = probe(address, "/livez")
        assert status == 503 and body["status"] == "failed" and "checksum" in str(body["error"])
        status, body = probe(address, "/readyz")
        assert status == 503 and body["status"] == "not_ready" and "checksum" in str(body["reason"])


def test_a_missing_end_of_turn_decision_file_stops_the_server_as_it_starts(tmp_path: Path) -> None:
    """A decision file that is not there (or not usable) is a start-up error that says what to do,
    before any model is loaded or any call is taken."""
    from core.errors import ConfigError
    from pipeline.turn_model import load_turn_model

    missing = str(tmp_path / "nope.json")
    settings = Settings(storage=StorageConfig(enabled=False), endpointing=EndpointingConfig(decision_file=missing))
    backends = Backends(FakeVad(), FakeRecognizer([]), FakeSynthesizer(), FakeLLM([]))  # type: ignore[arg-type]
    load_turn_model.cache_clear()
    with pytest.raises(ConfigError, match=r"endpointing\.decision_file") as caught:
        create_app(settings, backends=backends)
    assert missing in str(caught.value)
    rule = settings.model_copy(update={"endpointing": EndpointingConfig(decision="rule", decision_file=missing)})
    assert create_app(rule, backends=backends) is not None  # the hand-set rule needs no file
