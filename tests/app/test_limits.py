"""Limits (docs/security.md): per-client rates and calls in progress (429 with Retry-After, or close
1013, each with its reason), body size (413) and slow senders (408), and idle sockets closed. The
app runs with fake engines (named as fakes); WebSocket cases go through a real server and client."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from app.security.limits import OVERFLOW, CallCounter, RateLimiter, address_key, parse_networks
from core.clock import FakeClock
from core.errors import ConfigError
from tests.app.live import fake_app, live
from tests.pipeline.fakes import FakeLLM

START = json.dumps({"type": "session.start", "audio": {"sample_rate": 16000}})


def client_for(**server: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=fake_app(**server)), base_url="http://127.0.0.1")


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


def test_the_rate_limiter_forgets_only_clients_whose_bucket_has_refilled() -> None:
    clock = FakeClock()
    limiter = RateLimiter(1, clock, max_clients=2)
    for client in ("a", "b", "c"):
        limiter.take(client)
    # a and b are still limited (their buckets are empty): forgetting one would reset its limit, so
    # the newcomer c shares the overflow bucket instead
    assert list(limiter.buckets) == ["a", "b", OVERFLOW]
    assert limiter.take("a") > 0 and limiter.take("d") > 0  # d shares the overflow bucket c emptied
    clock.advance(60.0)  # every bucket has refilled: forgetting them changes nothing
    assert limiter.take("e") == 0.0 and "e" in limiter.buckets


def test_an_abuser_cannot_reset_its_limit_by_flooding_the_table_with_new_addresses() -> None:
    limiter = RateLimiter(2, FakeClock(), max_clients=100)
    assert limiter.take("abuser") == 0.0 and limiter.take("abuser") == 0.0
    for n in range(1000):  # a flood of addresses, each seen once
        limiter.take(f"203.0.113.{n}")
    assert limiter.take("abuser") > 0


def test_a_newcomer_counted_in_the_overflow_bucket_is_limited_like_any_client() -> None:
    clock = FakeClock()
    limiter = RateLimiter(2, clock, max_clients=2)
    for client in ("a", "b"):  # the table is full of clients that are still limited
        limiter.take(client)
        limiter.take(client)
    assert limiter.wait("c") == 0.0 and limiter.standing("c") == (2, 0.0)  # nothing counted yet
    assert [limiter.take("c"), limiter.take("c")] == [0.0, 0.0]
    assert limiter.wait("c") == pytest.approx(30.0)  # what its next take would say
    assert limiter.standing("c") == (0, pytest.approx(60.0))
    assert limiter.wait("d") == pytest.approx(30.0)  # newcomers share the overflow bucket
    assert list(limiter.buckets) == ["a", "b", OVERFLOW]
    clock.advance(60.0)  # everyone has refilled: room again, and nobody is held back
    assert limiter.wait("c") == 0.0 and limiter.take("c") == 0.0 and "c" in limiter.buckets


async def test_wrong_keys_from_an_address_in_the_overflow_bucket_are_limited() -> None:
    """The guard's wrong-key limit (server.max_auth_failures_per_minute) when its table is full of
    addresses still limited: a new address's wrong keys count, and past the limit it gets 429."""
    app = fake_app(api_keys=["the-right-key"], max_auth_failures_per_minute=2)
    failures = app.state.access.failures
    failures.memory.max_clients = 2
    for address in ("192.0.2.1", "192.0.2.2"):
        await failures.take(address)
        await failures.take(address)
    transport = httpx.ASGITransport(app=app, client=("203.0.113.9", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        wrong = {"Authorization": "Bearer a-wrong-key"}
        assert [(await client.get("/v1/models", headers=wrong)).status_code for _ in range(2)] == [401, 401]
        reply = await client.get("/v1/models", headers={"Authorization": "Bearer the-right-key"})
        assert reply.status_code == 429 and reply.json()["error"]["code"] == "too_many_failures"
        assert int(reply.headers["retry-after"]) >= 1


def test_ipv6_clients_count_by_their_64_and_mapped_ipv4_as_ipv4() -> None:
    assert address_key("2001:db8:1:2::1") == address_key("2001:db8:1:2:ffff:ffff:ffff:ffff") == "2001:db8:1:2::/64"
    assert address_key("2001:db8:1:3::1") != address_key("2001:db8:1:2::1")
    assert address_key("::ffff:198.51.100.7") == address_key("198.51.100.7") == "198.51.100.7"
    assert address_key("unknown") == "unknown"


def test_calls_in_progress_are_counted_per_client_and_forgotten_at_zero() -> None:
    calls = CallCounter(2)
    a1, a2 = calls.enter("a"), calls.enter("a")
    assert a1 and a2 and not calls.enter("a")
    b = calls.enter("b")
    assert b
    a1.release()
    a1.release()  # a slot is given back once, however often it is released
    a3 = calls.enter("a")
    assert a3 and not calls.enter("a")
    for slot in (a2, a3, b):
        slot.release()
    assert calls.calls == {}
    assert all(CallCounter(0).enter("x") for _ in range(100))  # 0: counted, never limited


def test_a_bad_network_is_a_config_error() -> None:
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
        # the client may write anything left of what the proxy added: the nearest untrusted hop counts
        spoofed = {"x-forwarded-for": "1.2.3.4, 198.51.100.1"}
        assert (await client.get("/v1/models", headers=spoofed)).status_code == 429


async def test_forwarded_for_from_an_untrusted_peer_is_ignored() -> None:
    async with client_for(max_api_requests_per_minute=1) as client:
        assert (await client.get("/v1/models", headers={"x-forwarded-for": "198.51.100.1"})).status_code == 200
        assert (await client.get("/v1/models", headers={"x-forwarded-for": "198.51.100.2"})).status_code == 429


def test_the_served_app_trusts_no_proxy_headers_but_its_own_setting() -> None:
    """uvicorn on its own trusts loopback's X-Forwarded-For (anyone on the machine could pick an
    address for each call); `voice-agent serve` leaves that to server.trusted_proxies."""
    import app.shutdown as shutdown

    seen: list[Any] = []

    class Capture(shutdown.DrainingServer):
        def run(self, sockets: Any = None) -> None:
            seen.append(self.config)

    original = shutdown.DrainingServer
    shutdown.DrainingServer = Capture  # type: ignore[misc]
    try:
        shutdown.serve(fake_app(), fake_app().state.runtime.settings)
    finally:
        shutdown.DrainingServer = original  # type: ignore[misc]
    assert seen and seen[0].proxy_headers is False


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


async def _wait_until(condition: Any, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def test_a_call_s_slots_are_free_the_moment_its_caller_hangs_up() -> None:
    """One call slot on the server and one per address: a caller who hangs up and calls again at
    once gets in, while the first call's clean-up (here held open by the fake LLM) goes on."""
    app = fake_app(max_calls_per_client=1, max_sessions=1)
    runtime = app.state.runtime
    llm: FakeLLM = runtime.backends.llm
    llm.close_gate = threading.Event()
    try:
        with live(app) as address:
            async with connect(f"ws://{address}/ws") as first:
                await first.send(START)
                assert json.loads(await first.recv())["type"] == "session.started"
            await _wait_until(lambda: llm.closing == 1)  # the first call's clean-up has begun, and waits
            await _wait_until(lambda: not runtime.sessions)
            assert llm.closed == 0  # free while the clean-up still runs (not once it was given up on)
            async with connect(f"ws://{address}/ws") as second:
                await second.send(START)
                assert json.loads(await second.recv())["type"] == "session.started"
                assert not llm.close_gate.is_set()
            llm.close_gate.set()
    finally:
        llm.close_gate.set()


async def test_a_socket_that_never_starts_its_call_is_closed() -> None:
    with live(fake_app(start_timeout_s=0.3)) as address:
        async with connect(f"ws://{address}/ws") as ws:
            await ws.send(b"\x00\x00")  # not a start
            code, _ = await _close_of(ws)
        assert code == 1008


async def test_an_idle_socket_is_closed_with_a_reason() -> None:
    with live(fake_app(idle_timeout_s=0.5)) as address:
        async with connect(f"ws://{address}/ws") as ws:
            await ws.send(START)  # then nothing
            code, reason = await _close_of(ws)
        assert code == 1001 and "server.idle_timeout_s" in reason


def test_a_bad_trusted_proxy_is_refused_when_the_app_is_made() -> None:
    with pytest.raises(ConfigError, match=r"server\.trusted_proxies"):
        fake_app(trusted_proxies=["10.0.0.0/33"])


def test_the_rate_limiter_says_what_a_client_has_left_without_spending_it() -> None:
    clock = FakeClock()
    limiter = RateLimiter(6, clock)
    assert limiter.standing("a") == (6, 0.0)
    limiter.take("a")
    limiter.take("a")
    assert limiter.standing("a") == (4, pytest.approx(20.0))  # one token every 10 s
    clock.advance(5.0)
    assert limiter.standing("a") == (4, pytest.approx(15.0))
    assert limiter.standing("a") == (4, pytest.approx(15.0))  # asking spends nothing


async def test_a_realtime_response_tells_the_client_its_connection_limit() -> None:
    """rate_limits.updated: the guard's count of the client's new connections a minute, left as it
    stands after this socket (server.max_connections_per_minute)."""
    with live(fake_app(max_connections_per_minute=12)) as address:
        async with connect(f"ws://{address}/v1/realtime") as ws:
            await ws.send(json.dumps({"type": "response.create", "response": {"output_modalities": ["text"]}}))
            while (event := json.loads(await asyncio.wait_for(ws.recv(), 10)))["type"] != "rate_limits.updated":
                pass
    [requests] = event["rate_limits"]
    assert requests["name"] == "requests" and requests["limit"] == 12 and requests["remaining"] == 11
    assert 0 < requests["reset_seconds"] <= 5.0
