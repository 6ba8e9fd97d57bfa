"""vLLM's speculative-decoding counters: parsing its Prometheus text, the derived rates (cumulative
and between two scrapes), and the poller that republishes them, against a real HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from app.runtime import Runtime
from app.settings import Settings
from app.vllm_metrics import SpecDecodeCounters, VllmMetricsPoller, parse_spec_decode
from core.clock import MonotonicClock
from models.config import LlmConfig

MODEL = "qwen2.5-7b-instruct"


def vllm_metrics_text(engines: list[tuple[int, int, int, list[int]]]) -> str:
    """/metrics as vLLM (v1, prometheus_client) writes it: per engine (drafts, drafted tokens,
    accepted tokens, accepted per position), beside some of its other metrics."""
    lines = [
        "# HELP python_gc_objects_collected_total Objects collected during gc",
        "# TYPE python_gc_objects_collected_total counter",
        'python_gc_objects_collected_total{generation="0"} 13221.0',
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
    ]
    lines += [f'vllm:num_requests_running{{engine="{e}",model_name="{MODEL}"}} 2.0' for e in range(len(engines))]
    counters = [
        ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", 0),
        ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", 1),
        ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", 2),
    ]
    for name, help_text, index in counters:
        lines += [f"# HELP {name}_total {help_text}", f"# TYPE {name}_total counter"]
        lines += [f'{name}_total{{engine="{e}",model_name="{MODEL}"}} {float(v[:3][index])}'
                  for e, v in enumerate(engines)]
        lines += [f"# HELP {name}_created {help_text}", f"# TYPE {name}_created gauge"]
        lines += [f'{name}_created{{engine="{e}",model_name="{MODEL}"}} 1.7523e+09' for e in range(len(engines))]
    name = "vllm:spec_decode_num_accepted_tokens_per_pos"
    lines += [f"# HELP {name}_total Accepted tokens per draft position.", f"# TYPE {name}_total counter"]
    for e, (_, _, _, per_pos) in enumerate(engines):
        lines += [f'{name}_total{{engine="{e}",model_name="{MODEL}",position="{p}"}} {float(n)}'
                  for p, n in enumerate(per_pos)]
    lines += [
        "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.",
        "# TYPE vllm:time_to_first_token_seconds histogram",
        f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",model_name="{MODEL}"}} 3.0',
        f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="{MODEL}"}} 4.0',
        f'vllm:time_to_first_token_seconds_count{{engine="0",model_name="{MODEL}"}} 4.0',
        f'vllm:time_to_first_token_seconds_sum{{engine="0",model_name="{MODEL}"}} 0.52',
    ]
    return "\n".join(lines) + "\n"


# Two engines (data parallel), K = 4. Totals: 200 drafts, 800 drafted, 500 accepted,
# per position 180, 140, 110, 70.
FIRST = vllm_metrics_text([(120, 480, 300, [110, 85, 65, 40]), (80, 320, 200, [70, 55, 45, 30])])
# Later, engine 0 drafted 50 more times (200 tokens), 120 accepted (40, 30, 30, 20); engine 1 idle.
SECOND = vllm_metrics_text([(170, 680, 420, [150, 115, 95, 60]), (80, 320, 200, [70, 55, 45, 30])])


def test_parse_sums_engines_and_derives_the_rates() -> None:
    counters = parse_spec_decode(FIRST)
    assert counters == SpecDecodeCounters(200, 800, 500, {0: 180, 1: 140, 2: 110, 3: 70})
    assert counters.acceptance_rate == pytest.approx(0.625)
    assert counters.mean_acceptance_length == pytest.approx(3.5)
    assert counters.acceptance_by_position == pytest.approx([0.9, 0.7, 0.55, 0.35])


def test_rates_between_two_scrapes() -> None:
    first, second = parse_spec_decode(FIRST), parse_spec_decode(SECOND)
    assert first is not None and second is not None
    window = second.since(first)
    assert window == SpecDecodeCounters(50, 200, 120, {0: 40, 1: 30, 2: 30, 3: 20})
    assert window.acceptance_rate == pytest.approx(0.6)
    assert window.mean_acceptance_length == pytest.approx(3.4)
    assert window.acceptance_by_position == pytest.approx([0.8, 0.6, 0.6, 0.4])
    # nothing happened: no rate, rather than 0 % or a division by zero
    idle = second.since(second)
    assert idle.drafts == 0
    assert idle.acceptance_rate is None and idle.mean_acceptance_length is None and idle.acceptance_by_position == []


def test_a_counter_reset_counts_from_zero() -> None:
    """vLLM restarted between the scrapes: its counters started again from zero."""
    restarted = parse_spec_decode(vllm_metrics_text([(10, 40, 30, [9, 8, 7, 6])]))
    before = parse_spec_decode(SECOND)
    assert restarted is not None and before is not None
    assert restarted.since(before) == restarted
    assert restarted.since(before).acceptance_rate == pytest.approx(0.75)


def test_absent_metrics() -> None:
    no_spec = "\n".join(line for line in FIRST.splitlines() if "spec_decode" not in line) + "\n"
    assert parse_spec_decode(no_spec) is None
    assert parse_spec_decode("") is None
    # speculative decoding configured, nothing drafted yet
    idle = parse_spec_decode(vllm_metrics_text([(0, 0, 0, [])]))
    assert idle == SpecDecodeCounters(0, 0, 0, {})
    assert idle.acceptance_rate is None and idle.mean_acceptance_length is None and idle.acceptance_by_position == []


def test_text_that_is_not_prometheus_raises_value_error() -> None:
    with pytest.raises(ValueError):
        parse_spec_decode("<html><body>502 Bad Gateway</body></html>")


# -- the poller, against a real HTTP server ----------------------------------------------------------------


@dataclass
class MetricsServer:
    """A fake vLLM /metrics endpoint: a real asyncio HTTP/1.1 server on a free port that answers
    every request with `status` and `body`, both changeable while it runs."""

    status: int = 200
    body: str = FIRST
    port: int = 0
    requests: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
            self.requests += 1
            payload = self.body.encode()
            writer.write(f"HTTP/1.1 {self.status} X\r\ncontent-type: text/plain; version=0.0.4\r\n"
                         f"content-length: {len(payload)}\r\nconnection: close\r\n\r\n".encode() + payload)
            await writer.drain()
        writer.close()


@pytest.fixture
async def metrics_server() -> AsyncIterator[MetricsServer]:
    fake = MetricsServer()
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    fake.port = server.sockets[0].getsockname()[1]
    async with server:
        yield fake
        server.close()


def gauges(registry: CollectorRegistry) -> dict[str, float | None]:
    names = ("voice_agent_vllm_up", "voice_agent_vllm_spec_decode_acceptance_rate",
             "voice_agent_vllm_spec_decode_mean_acceptance_length")
    return {name: registry.get_sample_value(name) for name in names}


def by_position(registry: CollectorRegistry) -> list[float | None]:
    name = "voice_agent_vllm_spec_decode_acceptance_rate_by_position"
    return [registry.get_sample_value(name, {"position": str(p)}) for p in range(4)]


async def test_poller_publishes_gauges_and_survives_bad_scrapes(metrics_server: MetricsServer) -> None:
    registry = CollectorRegistry()
    poller = VllmMetricsPoller(metrics_server.url, registry, MonotonicClock())
    async with httpx.AsyncClient(timeout=2) as client:
        # first scrape: since vLLM started
        assert await poller.scrape_once(client)
        assert gauges(registry) == {"voice_agent_vllm_up": 1.0,
                                    "voice_agent_vllm_spec_decode_acceptance_rate": pytest.approx(0.625),
                                    "voice_agent_vllm_spec_decode_mean_acceptance_length": pytest.approx(3.5)}
        assert by_position(registry) == pytest.approx([0.9, 0.7, 0.55, 0.35])

        # next: over the interval since the last scrape
        metrics_server.body = SECOND
        assert await poller.scrape_once(client)
        assert gauges(registry)["voice_agent_vllm_spec_decode_acceptance_rate"] == pytest.approx(0.6)
        assert gauges(registry)["voice_agent_vllm_spec_decode_mean_acceptance_length"] == pytest.approx(3.4)
        assert by_position(registry) == pytest.approx([0.8, 0.6, 0.6, 0.4])

        # an idle interval keeps the last values
        assert await poller.scrape_once(client)
        assert gauges(registry)["voice_agent_vllm_spec_decode_acceptance_rate"] == pytest.approx(0.6)

        # HTTP 500, then text that is not Prometheus: down, last values kept, no exception
        metrics_server.status, metrics_server.body = 500, "Internal Server Error"
        assert not await poller.scrape_once(client)
        assert gauges(registry)["voice_agent_vllm_up"] == 0.0
        assert gauges(registry)["voice_agent_vllm_spec_decode_acceptance_rate"] == pytest.approx(0.6)
        metrics_server.status, metrics_server.body = 200, "<html>not metrics</html>"
        assert not await poller.scrape_once(client)
        assert gauges(registry)["voice_agent_vllm_up"] == 0.0

        # back again
        metrics_server.body = SECOND
        assert await poller.scrape_once(client)
        assert gauges(registry)["voice_agent_vllm_up"] == 1.0


async def test_poller_against_a_server_that_is_down() -> None:
    """Nothing listens on the port: up=0, and the running poller keeps going."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    registry = CollectorRegistry()
    poller = VllmMetricsPoller(f"http://127.0.0.1:{port}/metrics", registry, MonotonicClock(), interval_s=0.05)
    poller.start()
    try:
        for _ in range(100):
            await asyncio.sleep(0.02)
            if registry.get_sample_value("voice_agent_vllm_up") == 0.0:
                break
        assert registry.get_sample_value("voice_agent_vllm_up") == 0.0
        assert math.isnan(registry.get_sample_value("voice_agent_vllm_spec_decode_acceptance_rate") or 0.0)
        failed = poller.scrapes
        while poller.scrapes < failed + 3:  # it goes on trying after failures
            await asyncio.sleep(0.02)
        assert poller._task is not None and not poller._task.done()
    finally:
        await poller.stop()
    assert poller._task is None


async def test_runtime_starts_the_poller_for_the_openai_engine_only(metrics_server: MetricsServer) -> None:
    """The app's lifespan calls runtime.start_vllm_metrics(); the gauges land in the service's own
    /metrics registry, and aclose() stops the poller."""
    embedded = Runtime(Settings(llm=LlmConfig(vllm_metrics_url=metrics_server.url)), MonotonicClock())
    embedded.start_vllm_metrics()
    assert embedded.vllm_metrics is None

    settings = Settings(llm=LlmConfig(engine="openai", vllm_metrics_url=metrics_server.url,
                                      vllm_metrics_interval_s=0.05))
    runtime = Runtime(settings, MonotonicClock())
    runtime.start_vllm_metrics()
    assert runtime.vllm_metrics is not None and runtime.vllm_metrics._task is not None
    polling = runtime.vllm_metrics._task
    try:
        for _ in range(100):
            await asyncio.sleep(0.02)
            if runtime.metrics.registry.get_sample_value("voice_agent_vllm_up") == 1.0:
                break
        text = generate_latest(runtime.metrics.registry).decode()
        assert "voice_agent_vllm_up 1.0" in text
        assert "voice_agent_vllm_spec_decode_acceptance_rate 0.625" in text
        assert "voice_agent_vllm_spec_decode_mean_acceptance_length 3.5" in text
    finally:
        await runtime.aclose()
    assert runtime.vllm_metrics._task is None
    assert polling.done()  # stopped (and awaited): nothing scrapes any more
