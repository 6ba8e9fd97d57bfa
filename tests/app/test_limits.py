"""Limits (docs/security.md): per-client rates and calls in progress (429 with Retry-After, or close
1013, each with its reason), body size (413) and slow senders (408), and idle sockets closed. The
app runs with fake engines (named as fakes); WebSocket cases go through a real server and client."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from app.limits import CallCounter, RateLimiter, client_address, parse_networks
from core.clock import FakeClock
from core.errors import ConfigError
from tests.app.live import fake_app, live

START = json.dumps({"type": "session.start", "audio": {"sample_rate": 16000}})


def client_for(**server: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=fake_app(**server)), base_url="http://testserver")


def test_the_rate_limiter_lets_a_minute_s_worth_through_then_refills_evenly() -> None:
    clock = FakeClock()
    limiter = RateLimiter(3, clock)
    assert [limiter.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("a") == pytest.approx(20.0)  # one token every 20 s
    assert limiter.take("b") == 0.0  # per client
    clock.advance(20.0)
    assert limiter.take("a") == 0.0
    assert limiter.take("a") > 0
    assert RateLimiter.retry_after(0.2) == "1" and RateLimiter.retry_after(19.1) == "20"


def test_the_rate_limiter_forgets_the_least_recently_seen_clients() -> None:
    limiter = RateLimiter(1, FakeClock(), max_clients=2)
    for client in ("a", "b", "c"):
        limiter.take(client)
    assert list(limiter.buckets) == ["b", "c"]


def test_calls_in_progress_are_counted_per_client_and_forgotten_at_zero() -> None:
    calls = CallCounter(2)
    assert calls.enter("a") and calls.enter("a") and not calls.enter("a")
    assert calls.enter("b")
    calls.leave("a")
    assert calls.enter("a")
    for client in ("a", "a", "b"):
        calls.leave(client)
    assert calls.calls == {}


def test_forwarded_for_counts_only_from_a_trusted_proxy() -> None:
    proxies = parse_networks(["10.0.0.0/8", "::1"], "server.trusted_proxies")
    assert client_address("203.0.113.9", "198.51.100.1", proxies) == "203.0.113.9"  # not a proxy: ignored
    assert client_address("10.0.0.2", "198.51.100.1", proxies) == "198.51.100.1"
    # the client may write anything left of what the proxies added
    assert client_address("10.0.0.2", "1.2.3.4, 198.51.100.1, 10.0.0.7", proxies) == "198.51.100.1"
    assert client_address("10.0.0.2", None, proxies) == "10.0.0.2"
    with pytest.raises(ConfigError, match="trusted_proxies"):
        parse_networks(["not-an-address"], "server.trusted_proxies")


async def test_v1_requests_beyond_the_rate_get_429_with_retry_after_and_a_reason() -> None:
    async with client_for(max_api_requests_per_minute=2) as client:
        assert [(await client.get("/v1/models")).status_code for _ in range(2)] == [200, 200]
        reply = await client.get("/v1/models")
        assert reply.status_code == 429
        assert int(reply.headers["retry-after"]) >= 1
        error = reply.json()["error"]
        assert error["code"] == "rate_limited" and "server.max_api_requests_per_minute" in error["message"]
        assert (await client.get("/healthz")).status_code != 429  # only /v1 (and logins) count


async def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_rate() -> None:
    # the test transport's peer is 127.0.0.1
    async with client_for(max_api_requests_per_minute=1, trusted_proxies=["127.0.0.1"]) as client:
        first = {"x-forwarded-for": "198.51.100.1"}
        assert (await client.get("/v1/models", headers=first)).status_code == 200
        assert (await client.get("/v1/models", headers=first)).status_code == 429
        assert (await client.get("/v1/models", headers={"x-forwarded-for": "198.51.100.2"})).status_code == 200


async def test_a_body_over_the_limit_gets_413() -> None:
    async with client_for(max_body_bytes=2048) as client:
        reply = await client.post("/v1/chat/completions", content=b"x" * 4096,
                                  headers={"content-type": "application/json"})
        assert reply.status_code == 413
        assert "server.max_body_bytes" in reply.json()["error"]["message"]

        async def streamed() -> AsyncIterator[bytes]:  # no Content-Length: counted as it arrives
            for _ in range(8):
                yield b"x" * 512

        reply = await client.post("/v1/chat/completions", content=streamed())
        assert reply.status_code == 413
        small = await client.post("/v1/chat/completions", json={"messages": []})
        assert small.status_code not in (408, 413)  # the route saw it (and judged it)


async def test_a_slow_sender_gets_408() -> None:
    async with client_for(body_timeout_s=0.2) as client:
        async def slow() -> AsyncIterator[bytes]:
            yield b"{"
            await asyncio.sleep(1.0)
            yield b"}"

        reply = await client.post("/v1/chat/completions", content=slow())
        assert reply.status_code == 408
        assert "server.body_timeout_s" in reply.json()["error"]["message"]


async def _close_of(ws: Any) -> tuple[int, str]:
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await asyncio.wait_for(ws.recv(), 5)
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code, closed.value.rcvd.reason


async def test_new_connections_beyond_the_rate_are_closed_1013_with_a_reason() -> None:
    with live(fake_app(max_connections_per_minute=2)) as address:
        for _ in range(2):
            async with connect(f"ws://{address}/ws") as ws:
                await ws.send(START)
                assert json.loads(await ws.recv())["type"] == "session.started"
        async with connect(f"ws://{address}/ws") as ws:
            code, reason = await _close_of(ws)
        assert code == 1013 and "server.max_connections_per_minute" in reason and "retry in" in reason


async def test_calls_in_progress_beyond_the_limit_are_closed_1013_with_a_reason() -> None:
    with live(fake_app(max_calls_per_client=1)) as address:
        async with connect(f"ws://{address}/ws") as first:
            await first.send(START)
            assert json.loads(await first.recv())["type"] == "session.started"
            async with connect(f"ws://{address}/ws") as second:
                code, reason = await _close_of(second)
            assert code == 1013 and "server.max_calls_per_client" in reason
        for _ in range(50):  # the first call ended: a slot again, once the server has let it go
            with contextlib.suppress(ConnectionClosed):
                async with connect(f"ws://{address}/ws") as third:
                    await third.send(START)
                    if json.loads(await third.recv())["type"] == "session.started":
                        return
            await asyncio.sleep(0.05)
        raise AssertionError("the slot of the call that ended was never freed")


async def test_an_idle_socket_is_closed_with_a_reason() -> None:
    with live(fake_app(idle_timeout_s=0.5)) as address:
        async with connect(f"ws://{address}/ws") as ws:
            await ws.send(START)  # then nothing
            code, reason = await _close_of(ws)
        assert code == 1001 and "server.idle_timeout_s" in reason


def test_a_bad_trusted_proxy_is_refused_when_the_app_is_made() -> None:
    with pytest.raises(ConfigError, match=r"server\.trusted_proxies"):
        fake_app(trusted_proxies=["10.0.0.0/33"])
