"""The service's own Prometheus counters for deadline misses and playback underruns."""

from __future__ import annotations

import httpx
from fastapi import FastAPI
from prometheus_client import generate_latest

from app.metrics import Metrics
from pipeline.events import ResponseDone
from tests.app.live import fake_app

OPENMETRICS = "application/openmetrics-text; version=1.0.0,text/plain;q=0.5"  # what Prometheus sends


def test_deadline_misses_and_underruns_are_counted_per_turn() -> None:
    metrics = Metrics()
    metrics.observe_turn(ResponseDone(1, "a", "completed", {}, deadline_missed=True, underruns=2, underrun_ms=500.0))
    metrics.observe_turn(ResponseDone(2, "b", "completed", {}))
    metrics.observe_turn(ResponseDone(3, "c", "interrupted", {}, underruns=1, underrun_ms=250.0))
    value = metrics.registry.get_sample_value
    assert value("voice_agent_deadline_misses_total") == 1
    assert value("voice_agent_playback_underruns_total") == 3
    assert value("voice_agent_playback_underrun_seconds_total") == 0.75


def test_calls_are_counted_by_transport() -> None:
    from app.runtime import Runtime
    from app.settings import Settings
    from core.clock import MonotonicClock

    runtime = Runtime(Settings(), MonotonicClock())
    value = runtime.metrics.registry.get_sample_value
    for transport in ("ws", "twilio", "telnyx"):  # every series is there from the start
        assert value("voice_agent_active_sessions", {"transport": transport}) == 0
        assert value("voice_agent_sessions_total", {"transport": transport}) == 0
    runtime.open_session("a", "twilio")
    runtime.open_session("b", "twilio")
    runtime.open_session("c", "ws")
    runtime.close_session("a")
    runtime.close_session("a")  # twice: no harm
    assert value("voice_agent_active_sessions", {"transport": "twilio"}) == 1
    assert value("voice_agent_active_sessions", {"transport": "ws"}) == 1
    assert value("voice_agent_active_sessions", {"transport": "telnyx"}) == 0
    assert len(runtime.sessions) == 2


async def test_voice_to_voice_samples_carry_their_call_for_openmetrics_scrapers() -> None:
    app = fake_app()
    metrics = app.state.runtime.metrics
    metrics.observe_turn(ResponseDone(1, "a", "completed", {}, voice_to_voice_ms=640.0), "sess_0123abcd")
    metrics.observe_turn(ResponseDone(2, "b", "completed", {}, voice_to_voice_ms=900.0))  # no call: no exemplar
    async with _client(app) as client:
        scraped = await client.get("/metrics", headers={"accept": OPENMETRICS})
        classic = await client.get("/metrics")
    assert scraped.headers["content-type"].startswith("application/openmetrics-text")
    lines = [line for line in scraped.text.splitlines() if 'call_id="sess_0123abcd"' in line]
    assert len(lines) == 1 and lines[0].startswith("voice_agent_voice_to_voice_seconds_bucket"), lines
    assert lines[0].rstrip().split(" # ")[1].startswith('{call_id="sess_0123abcd"} 0.64')
    assert classic.headers["content-type"].startswith("text/plain") and "call_id" not in classic.text


async def test_metrics_is_prometheus_client_s_own_asgi_app() -> None:
    """The main port's /metrics is make_asgi_app's: the registry's exposition as generate_latest writes
    it, gzipped for a scraper that takes gzip, and only the series a scraper names with ?name[]=."""
    app = fake_app()
    registry = app.state.runtime.metrics.registry
    async with _client(app) as client:
        plain = await client.get("/metrics", headers={"accept-encoding": "identity"})
        gzipped = await client.get("/metrics", headers={"accept-encoding": "gzip"})
        named = await client.get("/metrics", params={"name[]": "voice_agent_call_slots"})
        posted = await client.post("/metrics")
    assert plain.status_code == 200 and plain.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert plain.content == generate_latest(registry) and "content-encoding" not in plain.headers
    assert gzipped.headers["content-encoding"] == "gzip" and gzipped.content == plain.content  # httpx unzips it
    series = [line for line in named.text.splitlines() if not line.startswith("#")]
    assert series == ["voice_agent_call_slots 8.0"]
    assert posted.status_code == 405


def _client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")
