"""The private metrics port's server (prometheus_client's own): the registry's exposition in the
format the scraper asks for, and nothing once it is closed."""

from __future__ import annotations

import httpx
import pytest

from app.metrics import Metrics
from app.metrics_server import start_metrics_server
from pipeline.events import ResponseDone


def test_it_serves_the_registry_in_the_format_asked_for_until_closed() -> None:
    metrics = Metrics()
    metrics.observe_turn(ResponseDone(1, "a", "completed", {}, voice_to_voice_ms=640.0), "sess_0123abcd")
    server = start_metrics_server("127.0.0.1", 0, metrics.registry)
    url = f"http://127.0.0.1:{server.port}/metrics"
    try:
        classic = httpx.get(url)
        assert classic.status_code == 200 and classic.headers["content-type"].startswith("text/plain")
        assert "voice_agent_voice_to_voice_seconds_count 1.0" in classic.text and "call_id" not in classic.text
        # what Prometheus sends: OpenMetrics, with the call as the exemplar
        scraped = httpx.get(url, headers={"accept": "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"})
        assert scraped.headers["content-type"].startswith("application/openmetrics-text")
        assert 'call_id="sess_0123abcd"' in scraped.text and scraped.text.endswith("# EOF\n")
        assert httpx.post(url).status_code == 405
    finally:
        server.close()
    assert not server.thread.is_alive()
    with pytest.raises(httpx.ConnectError):
        httpx.get(url)
