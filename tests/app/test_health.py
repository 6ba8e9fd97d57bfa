"""/livez, /readyz and /healthz on a real server with fake engines (named as fakes): readiness
follows the admission checks every call passes (loading, draining, no free call slot), liveness
fails only when the models failed to load, and /metrics says the replica's slots. What failed to
load is shown whole only to a loopback or keyed probe; anyone else reads its code."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
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
        status, body = probe(address, "/readyz")  # from loopback: the detail; the reason is plain
        assert status == 503 and body["status"] == "not_ready" and "checksum" in str(body["error"])
        assert "model_fetch_failed" in str(body["reason"]) and "checksum" not in str(body["reason"])


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


# -- what a probe may read of a failed load ---------------------------------------------------------

KEY = "k-0123456789abcdef-secret"
LOAD_ERROR = "model_missing: /srv/models/qwen2.5-7b-instruct-q4.gguf is not in the cache (http://models.internal/packs)"


def failed_app(**server: object) -> FastAPI:
    app = fake_app(**server)
    runtime = app.state.runtime
    runtime.ready.clear()  # the state a failed load leaves (Runtime.load)
    runtime.load_error, runtime.status = LOAD_ERROR, "failed"
    return app


def client_at(app: FastAPI, address: str, host: str = "127.0.0.1") -> httpx.AsyncClient:
    """A client whose requests come from `address` (as the server sees it), naming `host`."""
    transport = httpx.ASGITransport(app=app, client=(address, 40123))
    return httpx.AsyncClient(transport=transport, base_url=f"http://{host}")


@pytest.mark.parametrize("path", ["/livez", "/readyz", "/healthz"])
async def test_a_failed_load_s_detail_is_for_loopback_or_keyed_probes_only(path: str) -> None:
    """Anyone who reaches a probe reads the failure's code; its text (model paths, internal URLs)
    only a loopback client, or one with a valid key, reads."""
    app = failed_app(api_keys=[KEY], host="0.0.0.0")
    async with client_at(app, "203.0.113.7") as far:
        body = (await far.get(path)).json()
        assert body["error"] == "model_missing", body
        assert "/srv/models" not in json.dumps(body) and "models.internal" not in json.dumps(body)
        keyed = (await far.get(path, headers={"authorization": f"Bearer {KEY}"})).json()
        assert keyed["error"] == LOAD_ERROR
    async with client_at(app, "127.0.0.1") as near:
        assert (await near.get(path)).json()["error"] == LOAD_ERROR
    for loopback in ("::1", "::ffff:127.0.0.1"):  # IPv6, and an IPv4 client on a dual-stack socket
        async with client_at(app, loopback) as near:
            assert (await near.get(path)).json()["error"] == LOAD_ERROR
    async with client_at(app, "::ffff:203.0.113.7") as mapped:
        assert (await mapped.get(path)).json()["error"] == "model_missing"


async def test_a_loopback_probe_for_a_foreign_host_gets_the_code_alone() -> None:
    """A web page that points its own name at 127.0.0.1 (DNS rebinding) reaches the probe from
    loopback, but names its own host: it reads no more than anyone."""
    async with client_at(failed_app(), "127.0.0.1", host="attacker.example") as page:
        assert (await page.get("/healthz")).json()["error"] == "model_missing"


async def test_wrong_keys_on_a_probe_count_and_read_nothing() -> None:
    """A probe is no key oracle: a wrong key reads the code alone and counts as a wrong key on any
    route; past the limit even the right key reads no detail (and the probe still answers)."""
    app = failed_app(api_keys=[KEY], host="0.0.0.0", max_auth_failures_per_minute=2)
    async with client_at(app, "203.0.113.7") as far:
        for n in range(2):
            guessed = await far.get("/livez", headers={"authorization": f"Bearer guess-{n}"})
            assert guessed.status_code == 503 and guessed.json()["error"] == "model_missing"
        right = await far.get("/livez", headers={"authorization": f"Bearer {KEY}"})
        assert right.status_code == 503 and right.json()["error"] == "model_missing"
        assert (await far.get("/v1/models", headers={"authorization": f"Bearer {KEY}"})).status_code == 429


async def test_a_refused_call_is_told_the_code_not_the_detail() -> None:
    """Admission's reason (the /readyz `reason`, a refused call's close reason, a /v1 503) is plain."""
    app = failed_app()
    async with client_at(app, "127.0.0.1") as near:
        reply = await near.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert reply.status_code == 503
    message = reply.json()["error"]["message"]
    assert "model_missing" in message and "/srv/models" not in message and "models.internal" not in message
