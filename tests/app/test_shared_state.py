"""What replicas share through a real Redis (Debian's redis-server, started here): a one-use
token used on one replica is used on all, a per-client rate limit and a per-client count of calls
in progress hold across replicas (a dead replica's calls lapse), and when Redis is down the limits
let requests through while one-use tokens are refused. The live
test runs two replicas of the app (fake engines, named as fakes) on one Redis."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator

import httpx
import pytest
import redis
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from app.security.access import Access
from app.security.shared import RedisUsedTokens, SharedCallCounter, SharedLimit
from app.security.shared import connect as redis_connect
from app.settings import ServerConfig
from core.clock import MonotonicClock
from tests.app.live import fake_app, live
from tests.redis_server import free_port, redis_server

KEY = "a-key-for-the-replica-tests"
SECRET = "one-secret-for-both-replicas"
START = json.dumps({"type": "session.start", "audio": {"sample_rate": 16000}})


@pytest.fixture(scope="module")
def redis_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture
def redis_url(redis_server_url: str) -> str:
    """The server, emptied: a test sees nothing an earlier one left (a lease still running out)."""
    with redis.Redis.from_url(redis_server_url) as client:
        client.flushdb()
    return redis_server_url


async def test_a_one_use_token_used_on_one_replica_is_used_on_all(redis_url: str) -> None:
    clock = MonotonicClock()
    server = ServerConfig(api_keys=[KEY], token_secret=SECRET)
    first = Access(server, clock, redis=redis_connect(redis_url))
    second = Access(server, clock, redis=redis_connect(redis_url))
    token = first.session_tokens.issue("key:abc")
    assert await second.session_tokens.take(token) == "key:abc"
    assert await first.session_tokens.take(token) is None  # struck off for every replica
    cookie = second.logins.issue("key:abc")
    assert await first.cookie_owner(cookie) == "key:abc"
    await first.logins.drop(cookie)  # a logout on one replica ends the login on all
    assert await second.cookie_owner(cookie) is None
    for access in (first, second):
        assert access.redis is not None
        await access.redis.aclose()


async def test_a_rate_limit_holds_across_replicas(redis_url: str) -> None:
    clock = MonotonicClock()
    one, other = redis_connect(redis_url), redis_connect(redis_url)
    first, second = SharedLimit("connections", 3, clock, one), SharedLimit("connections", 3, clock, other)
    assert [await first.take("10.0.0.7"), await second.take("10.0.0.7"), await first.take("10.0.0.7")] == [0, 0, 0]
    wait = await second.take("10.0.0.7")
    assert 19.0 < wait <= 20.0  # one request every 20 s, counted once for both replicas
    assert await first.take("10.0.0.8") == 0  # per client
    remaining, reset = await second.standing("10.0.0.7")
    assert remaining == 0 and 39.0 < reset <= 60.0
    await one.aclose()
    await other.aclose()


async def test_without_redis_the_limits_let_requests_through_and_one_use_tokens_are_refused(
        caplog: pytest.LogCaptureFixture) -> None:
    gone = redis_connect(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    limit = SharedLimit("connections", 1, MonotonicClock(), gone)
    with caplog.at_level(logging.WARNING):
        assert [await limit.take("10.0.0.7") for _ in range(3)] == [0, 0, 0]
        assert not await RedisUsedTokens(gone, "session token").strike("nonce", 2e9)
    assert "requests are let through unlimited" in caplog.text and "it is refused" in caplog.text
    await gone.aclose()


async def _closed_with(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    async with connect(url, additional_headers=headers) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await ws.recv()
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code, closed.value.rcvd.reason


async def test_two_replicas_share_session_tokens_and_the_connection_limit(redis_url: str) -> None:
    settings = {"api_keys": [KEY], "token_secret": SECRET, "redis_url": redis_url, "max_connections_per_minute": 3}
    with live(fake_app(**settings)) as first, live(fake_app(**settings)) as second:
        minted = httpx.post(f"http://{first}/api/session-token", headers={"Authorization": f"Bearer {KEY}"}, timeout=5)
        token = minted.json()["token"]
        async with connect(f"ws://{second}/ws?token={token}") as ws:  # minted on the first, used on the second
            await ws.send(START)
            assert json.loads(await ws.recv())["type"] == "session.started"
        code, reason = await _closed_with(f"ws://{first}/ws?token={token}")  # and used up for both
        assert code == 1008, reason
        # three new connections a minute for this key, whichever replica takes them: the session
        # token's (on the second), then one on each; a fourth is refused (the used token's was
        # refused before it was counted)
        bearer = {"Authorization": f"Bearer {KEY}"}
        for address in (first, second):
            async with connect(f"ws://{address}/ws", additional_headers=bearer) as ws:
                await ws.send(START)
                assert json.loads(await ws.recv())["type"] == "session.started"
        code, reason = await _closed_with(f"ws://{first}/ws", bearer)
        assert code == 1013 and "server.max_connections_per_minute" in reason


async def test_two_replicas_count_a_keys_calls_together(redis_url: str) -> None:
    settings = {"api_keys": [KEY], "token_secret": SECRET, "redis_url": redis_url, "max_calls_per_key": 1}
    bearer = {"Authorization": f"Bearer {KEY}"}
    with live(fake_app(**settings)) as first, live(fake_app(**settings)) as second:
        async with connect(f"ws://{first}/ws", additional_headers=bearer) as ws:
            await ws.send(START)
            assert json.loads(await ws.recv())["type"] == "session.started"
            code, reason = await _closed_with(f"ws://{second}/ws", bearer)
            assert code == 1013 and "server.max_calls_per_key" in reason


async def _enters(counter: SharedCallCounter, client: str) -> object:
    async with asyncio.timeout(10):
        while (slot := await counter.enter(client)) is None:
            await asyncio.sleep(0.05)
    return slot


async def test_calls_in_progress_count_across_replicas_and_a_dead_ones_lapse(redis_url: str) -> None:
    one, other = redis_connect(redis_url), redis_connect(redis_url)
    first = SharedCallCounter("key calls", 1, one)
    second = SharedCallCounter("key calls", 1, other)
    slot = await first.enter("key:abc")
    assert slot is not None
    assert await second.enter("key:abc") is None  # one call at once for this key, on any replica
    assert await second.enter("key:other") is not None  # per client
    # the lease's first term running out (its score, and its set's expiry): a renewal keeps it
    [(lease, key)] = first.held.items()
    await one.zadd(key, {lease: 0}, xx=True)
    await one.expire(key, 1)
    await first.renew()
    seconds, _ = await one.time()
    assert await one.zscore(key, lease) > seconds + first.lease_s - 5 and await one.ttl(key) > first.lease_s - 5
    assert await second.enter("key:abc") is None
    slot.release()  # hung up
    await _enters(second, "key:abc")
    # a replica that dies holds its places until their leases lapse (nobody renews them)
    dead = SharedCallCounter("address calls", 1, one, lease_s=1.0)
    assert await dead.enter("10.0.0.9") is not None
    assert dead._renewer is not None
    dead._renewer.cancel()  # as SIGKILL would
    survivor = SharedCallCounter("address calls", 1, other, lease_s=1.0)
    assert await survivor.enter("10.0.0.9") is None
    await _enters(survivor, "10.0.0.9")
    await one.aclose()
    await other.aclose()
