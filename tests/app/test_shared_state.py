"""What replicas share through a real Redis (Debian's redis-server, started here): a one-use
token used on one replica is used on all, a per-client rate limit and a per-client count of calls
in progress hold across replicas (a dead replica's calls lapse), and when Redis is down the limits
let requests through while one-use tokens are refused, unless server.shared_state_failure=closed
says to refuse them (and /readyz and the metrics say so either way). The live tests run replicas
of the app (fake engines, named as fakes) on one Redis."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from app.security.access import Access
from app.security.shared import RedisUsedTokens, SharedCallCounter, SharedLimit
from app.security.shared_store import SharedStore, SharedStoreDown
from app.settings import ServerConfig
from core.clock import MonotonicClock
from tests.app.live import fake_app, live
from tests.redis_server import free_port, redis_process, redis_server

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
    first = Access(server, clock, shared=SharedStore.from_url(redis_url))
    second = Access(server, clock, shared=SharedStore.from_url(redis_url))
    token = first.session_tokens.issue("key:abc")
    assert await second.session_tokens.take(token) == "key:abc"
    assert await first.session_tokens.take(token) is None  # struck off for every replica
    cookie = second.logins.issue("key:abc")
    assert await first.cookie_owner(cookie) == "key:abc"
    await first.logins.drop(cookie)  # a logout on one replica ends the login on all
    assert await second.cookie_owner(cookie) is None
    for access in (first, second):
        assert access.shared is not None
        await access.shared.aclose()


async def test_a_rate_limit_holds_across_replicas(redis_url: str) -> None:
    clock = MonotonicClock()
    one, other = SharedStore.from_url(redis_url), SharedStore.from_url(redis_url)
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
    gone = SharedStore.from_url(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    limit = SharedLimit("connections", 1, MonotonicClock(), gone)
    with caplog.at_level(logging.WARNING):
        assert [await limit.take("10.0.0.7") for _ in range(3)] == [0, 0, 0]
        assert not await RedisUsedTokens(gone, "session token").strike("nonce", 2e9)
    assert "rate limits let requests through" in caplog.text and "it is refused" in caplog.text
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
    one, other = SharedStore.from_url(redis_url), SharedStore.from_url(redis_url)
    first = SharedCallCounter("key calls", 1, one)
    second = SharedCallCounter("key calls", 1, other)
    slot = await first.enter("key:abc")
    assert slot is not None
    assert await second.enter("key:abc") is None  # one call at once for this key, on any replica
    assert await second.enter("key:other") is not None  # per client
    # the lease's first term running out (its score, and its set's expiry): a renewal keeps it
    [(lease, key)] = first.held.items()
    await one.redis.zadd(key, {lease: 0}, xx=True)
    await one.redis.expire(key, 1)
    await first.renew()
    seconds, _ = await one.redis.time()
    assert (await one.redis.zscore(key, lease) > seconds + first.lease_s - 5
            and await one.redis.ttl(key) > first.lease_s - 5)
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


def _metric(address: str, name: str) -> float:
    for line in httpx.get(f"http://{address}/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not in /metrics")


async def test_closed_refuses_what_needs_the_shared_store_while_it_cannot_be_reached() -> None:
    """server.shared_state_failure=closed: a limit or a count that cannot ask Redis refuses (try
    later) instead of letting the client through; every failure is reported to the watcher."""
    seen: list[bool] = []
    gone = SharedStore.from_url(f"redis://127.0.0.1:{free_port()}/0", "closed", seen.append)
    with pytest.raises(SharedStoreDown, match=r"server\.shared_state_failure=closed"):
        await SharedLimit("connections", 5, MonotonicClock(), gone).take("10.0.0.7")
    with pytest.raises(SharedStoreDown):
        await SharedLimit("auth failures", 5, MonotonicClock(), gone).wait("10.0.0.7")
    with pytest.raises(SharedStoreDown):
        await SharedCallCounter("key calls", 1, gone).enter("key:abc")
    assert not gone.up and gone.failures == 3 and seen == [False, False, False]
    assert not await gone.check()
    await gone.aclose()


async def test_with_closed_a_replica_refuses_calls_and_requests_and_is_not_ready_while_redis_is_down() -> None:
    app = fake_app(redis_url=f"redis://127.0.0.1:{free_port()}/0", shared_state_failure="closed")
    with live(app) as address:
        reply = await asyncio.to_thread(httpx.get, f"http://{address}/v1/models", timeout=5)
        assert reply.status_code == 503 and reply.headers["retry-after"] == "5"
        error = reply.json()["error"]
        assert error["code"] == "shared_state_unavailable" and "server.redis_url" in error["message"]
        code, reason = await _closed_with(f"ws://{address}/ws")
        assert code == 1013 and "server.shared_state_failure=closed" in reason
        assert not app.state.runtime.sessions  # no call was started
        ready = await asyncio.to_thread(httpx.get, f"http://{address}/readyz", timeout=5)
        assert ready.status_code == 503
        body = ready.json()
        assert body["status"] == "shared_state_down" and "server.redis_url" in body["reason"]
        assert body["shared_state"] == {"up": False, "on_failure": "closed"}
        assert _metric(address, "voice_agent_shared_state_up") == 0.0
        assert _metric(address, "voice_agent_shared_state_failures_total") >= 3


async def test_with_open_a_replica_lets_calls_and_requests_through_and_is_ready_but_says_redis_is_down() -> None:
    app = fake_app(redis_url=f"redis://127.0.0.1:{free_port()}/0", shared_state_failure="open")
    with live(app) as address:
        reply = await asyncio.to_thread(httpx.get, f"http://{address}/v1/models", timeout=5)
        assert reply.status_code == 200
        async with connect(f"ws://{address}/ws") as ws:
            await ws.send(START)
            assert json.loads(await ws.recv())["type"] == "session.started"
        ready = await asyncio.to_thread(httpx.get, f"http://{address}/readyz", timeout=5)
        assert ready.status_code == 200
        body = ready.json()
        assert body["status"] == "ready" and body["shared_state"] == {"up": False, "on_failure": "open"}
        assert _metric(address, "voice_agent_shared_state_up") == 0.0
        assert _metric(address, "voice_agent_shared_state_failures_total") >= 3


async def test_a_closed_replica_is_ready_again_once_redis_answers(tmp_path: Path) -> None:
    """Readiness asks Redis itself: a replica that refuses everything while Redis is down (and so
    is sent nothing) still learns that it is back."""
    with redis_process(tmp_path) as server:
        app = fake_app(redis_url=server.url, shared_state_failure="closed")
        with live(app) as address:
            ready = await asyncio.to_thread(httpx.get, f"http://{address}/readyz", timeout=5)
            assert ready.status_code == 200 and ready.json()["shared_state"]["up"] is True
            assert _metric(address, "voice_agent_shared_state_up") == 1.0
            server.stop()
            assert (await asyncio.to_thread(httpx.get, f"http://{address}/readyz", timeout=5)).status_code == 503
            assert (await asyncio.to_thread(httpx.get, f"http://{address}/v1/models", timeout=5)).status_code == 503
            assert _metric(address, "voice_agent_shared_state_up") == 0.0
            server.start()
            ready = await asyncio.to_thread(httpx.get, f"http://{address}/readyz", timeout=5)
            assert ready.status_code == 200 and ready.json()["shared_state"]["up"] is True
            assert (await asyncio.to_thread(httpx.get, f"http://{address}/v1/models", timeout=5)).status_code == 200
            async with connect(f"ws://{address}/ws") as ws:
                await ws.send(START)
                assert json.loads(await ws.recv())["type"] == "session.started"


async def test_after_redis_restarts_the_first_check_on_an_idle_connection_answers(tmp_path: Path) -> None:
    """A Redis restart leaves every pooled connection dead: the next command on one is sent again on
    a new connection instead of counting as an outage (a limit let through, a token refused)."""
    with redis_process(tmp_path) as server:
        seen: list[bool] = []
        store = SharedStore.from_url(server.url, "closed", seen.append)
        limit = SharedLimit("restart", 100, MonotonicClock(), store)
        assert await limit.take("127.0.0.9") == 0
        server.stop()
        server.start()
        assert await limit.take("127.0.0.9") == 0  # `closed` raises SharedStoreDown had the command failed
        assert False not in seen and store.failures == 0
        await store.redis.aclose()


async def test_calls_in_progress_count_again_after_redis_restarts_and_forgets_them(tmp_path: Path) -> None:
    """Redis runs without saving: a restart forgets every call's place. The next renewal puts the
    places of this replica's calls back, so a key's limit holds again; a call that ended stays out."""
    with redis_process(tmp_path) as server:
        one, other = SharedStore.from_url(server.url), SharedStore.from_url(server.url)
        first, second = SharedCallCounter("key calls", 2, one), SharedCallCounter("key calls", 2, other)
        staying, leaving = await first.enter("key:abc"), await first.enter("key:abc")
        assert staying is not None and leaving is not None
        server.stop()
        server.start()
        leaving.release()  # hung up while Redis was away
        await first.renew()
        newcomer = await second.enter("key:abc")
        assert newcomer is not None
        assert await second.enter("key:abc") is None  # the limit of 2: `staying` counts again
        newcomer.release()
        staying.release()
        await one.aclose()
        await other.aclose()
