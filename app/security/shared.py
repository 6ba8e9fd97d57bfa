"""State that several replicas share through Redis (or Valkey) when server.redis_url is set, and
keep in memory otherwise (docs/deployment.md): the per-client rate limits, the per-client counts of
calls in progress, and the one-use tokens already used.

Redis's own clock times the rate buckets (one clock for every replica). When Redis cannot be
reached, server.shared_state_failure decides (app/security/shared_store.py): `open` lets a
rate-limited request through and counts a call on this replica alone, `closed` refuses them
(SharedStoreDown); a one-use token is refused either way (it cannot be known unused)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
from typing import Any

from redis.exceptions import RedisError

from app.security.limits import CallCounter, RateLimiter, Slot
from app.security.shared_store import SharedStore, SharedStoreDown
from core.clock import Clock

log = logging.getLogger(__name__)
KEY_PREFIX = "voice-agent:"

# A token bucket, atomically: capacity, tokens a second, whether to spend one. Returns the tokens
# left and the seconds to wait for one (0: there was one). Times come from Redis's clock.
BUCKET = """
local capacity, rate, spend = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3] == '1'
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local kept = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(kept[1]) or capacity
local at = tonumber(kept[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - at) * rate)
local wait = 0
if tokens >= 1 then
  if spend then tokens = tokens - 1 end
else
  wait = (1 - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil((capacity - tokens) / rate) + 1)
return {tostring(tokens), tostring(wait)}
"""


class SharedLimit:
    """A per-client rate limit (`per_minute` at once, refilled evenly): this process's own buckets,
    or, with `shared`, one bucket per client for every replica. While the shared store cannot be
    reached, `take` and `wait` let the client through (`open`) or raise SharedStoreDown (`closed`)."""

    def __init__(self, name: str, per_minute: int, clock: Clock, shared: SharedStore | None = None) -> None:
        self.name = name
        self.memory = RateLimiter(per_minute, clock)
        self.capacity, self.rate = self.memory.capacity, self.memory.rate
        self.shared = shared
        self._script: Any = shared.redis.register_script(BUCKET) if shared is not None else None

    async def _bucket(self, client: str, spend: bool) -> tuple[float, float] | None:
        """(tokens left, seconds to wait) from Redis; None when it cannot be reached."""
        assert self.shared is not None
        try:
            tokens, wait = await self._script(keys=[f"{KEY_PREFIX}rate:{self.name}:{client}"],
                                              args=[self.capacity, self.rate, "1" if spend else "0"])
        except (RedisError, OSError) as exc:
            self.shared.failed(f"{self.name} limit", exc)
            return None
        self.shared.answered()
        return float(tokens), float(wait)

    async def _wait(self, client: str, spend: bool) -> float:
        assert self.shared is not None
        bucket = await self._bucket(client, spend)
        if bucket is None and self.shared.closed:
            raise SharedStoreDown(f"{self.name} limit")
        return bucket[1] if bucket is not None else 0.0

    async def take(self, client: str) -> float:
        """0 when the client may go on (and one request is counted), else the seconds to wait."""
        if self.shared is None:
            return self.memory.take(client)
        return await self._wait(client, spend=True)

    async def wait(self, client: str) -> float:
        """The seconds until the client may go on (0: now), counting nothing."""
        if self.shared is None:
            return self.memory.wait(client)
        return await self._wait(client, spend=False)

    async def standing(self, client: str) -> tuple[int, float]:
        """Whole requests the client has left now, and the seconds until its bucket is full (what
        it was allowed, when the store cannot be reached: this only informs, it lets nothing through)."""
        if self.shared is None:
            return self.memory.standing(client)
        bucket = await self._bucket(client, spend=False)
        tokens = bucket[0] if bucket is not None else self.capacity
        return int(tokens), (self.capacity - tokens) / self.rate if self.rate else 0.0


# A client's calls in progress, every replica's: a sorted set of call leases scored by when they
# lapse. Lapsed leases (a replica that died) are dropped, then a new one is added if there is room.
ENTER = """
local now_t = redis.call('TIME')
local now = tonumber(now_t[1]) + tonumber(now_t[2]) / 1000000
local limit, lease = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if limit > 0 and redis.call('ZCARD', KEYS[1]) >= limit then return 0 end
redis.call('ZADD', KEYS[1], now + lease, ARGV[3])
redis.call('EXPIRE', KEYS[1], math.ceil(lease) + 1)
return 1
"""
RENEW = """
local now_t = redis.call('TIME')
local until_ = tonumber(now_t[1]) + tonumber(now_t[2]) / 1000000 + tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[i - 1], until_, ARGV[i])
  redis.call('EXPIRE', KEYS[i - 1], math.ceil(tonumber(ARGV[1])) + 1)
end
return 1
"""
POLL_S = 0.1  # a call waiting for a client's place asks Redis again this often (another replica's may come free)
LEASE_S = 60.0  # a call's place lapses this long after its replica last renewed it (a replica that died)


class SharedCallCounter:
    """Calls in progress per client (a limit of 0 counts without limiting): this process's own
    count, or, with `shared`, every replica's. Each call holds a lease that its replica renews every
    third of `lease_s`, so the places of a replica that died (SIGKILL) come free when they lapse.
    While the shared store cannot be reached, a new call is counted on this replica alone (`open`)
    or refused with SharedStoreDown (`closed`)."""

    def __init__(self, name: str, limit: int, shared: SharedStore | None = None, lease_s: float = LEASE_S) -> None:
        self.name = name
        self.limit = limit
        self.memory = CallCounter(limit)
        self.shared = shared
        self.lease_s = lease_s
        self._enter: Any = shared.redis.register_script(ENTER) if shared is not None else None
        self._renew: Any = shared.redis.register_script(RENEW) if shared is not None else None
        self.held: dict[str, str] = {}  # lease -> its client's key
        self._renewer: asyncio.Task[None] | None = None
        self._leaving: set[asyncio.Task[None]] = set()
        self._freed: asyncio.Event | None = None  # set when this replica gives a place back

    async def enter(self, client: str, wait_s: float = 0.0) -> Slot | None:
        """A place for a new call of `client`, or None when it has `limit` calls already and none is
        given back within `wait_s` (server.admission_wait_s): the call its caller just hung up on may
        not have been heard ending yet. Places given back on this replica wake the wait at once;
        another replica's are seen by asking Redis again every POLL_S."""
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            slot = await self._try_enter(client)
            left = deadline - asyncio.get_running_loop().time()
            if slot is not None or left <= 0:
                return slot
            if self._freed is None:
                self._freed = asyncio.Event()
            freed = self._freed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left, POLL_S) if self.shared is not None else left):
                    await freed.wait()

    def _wake(self) -> None:
        freed, self._freed = self._freed, None
        if freed is not None:
            freed.set()

    async def _try_enter(self, client: str) -> Slot | None:
        if self.shared is None or not self.limit:  # no limit: nothing to share
            return self._woken(self.memory.enter(client))
        key, lease = f"{KEY_PREFIX}calls:{self.name}:{client}", secrets.token_hex(12)
        try:
            entered = await self._enter(keys=[key], args=[self.limit, self.lease_s, lease])
        except (RedisError, OSError) as exc:
            self.shared.failed(f"{self.name} count", exc)
            if self.shared.closed:
                raise SharedStoreDown(f"{self.name} count") from exc
            return self._woken(self.memory.enter(client))  # this replica counts the call alone
        self.shared.answered()
        if not entered:
            return None
        self.held[lease] = key
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.create_task(self._renew_leases(), name=f"renew-{self.name}")
        return Slot(lambda: self._leave(key, lease))

    def _woken(self, slot: Slot | None) -> Slot | None:
        """The memory count's place, which wakes the calls waiting for one when it is given back."""
        if slot is None:
            return None
        inner = slot

        def release() -> None:
            inner.release()
            self._wake()

        return Slot(release)

    def _leave(self, key: str, lease: str) -> None:
        self.held.pop(lease, None)
        task = asyncio.create_task(self._remove(key, lease))
        self._leaving.add(task)
        task.add_done_callback(self._leaving.discard)

    async def _remove(self, key: str, lease: str) -> None:
        assert self.shared is not None
        try:
            await self.shared.redis.zrem(key, lease)
        except (RedisError, OSError) as exc:  # it lapses on its own within lease_s
            self.shared.failed(f"{self.name} count", exc)
            log.warning("Redis cannot be reached to free a %s place (%s); it lapses in %.0f s", self.name, exc,
                        self.lease_s)
        else:
            self.shared.answered()
        self._wake()  # a call of this replica waiting for the place looks again

    async def _renew_leases(self) -> None:
        while self.held:
            await asyncio.sleep(self.lease_s / 3)
            await self.renew()

    async def renew(self) -> None:
        """Every call this replica holds keeps its place for another `lease_s`; a place Redis lost
        (a restart without persistence) is put back, so the calls in progress count again."""
        held = dict(self.held)
        if not held or self.shared is None:
            return
        try:
            await self._renew(keys=list(held.values()), args=[self.lease_s, *held])
        except (RedisError, OSError) as exc:
            self.shared.failed(f"{self.name} count", exc)
            log.warning("Redis cannot be reached to renew %d %s places (%s)", len(held), self.name, exc)
        else:
            self.shared.answered()
        for lease, key in held.items():  # a call that ended meanwhile: its removal may have run first
            if lease not in self.held:
                self._leave(key, lease)


class RedisUsedTokens:
    """One-use tokens struck off in Redis by their nonce until they expire: a token used on one
    replica is used on all. While Redis cannot be reached a token is refused, whatever
    server.shared_state_failure says (it cannot be known unused)."""

    def __init__(self, shared: SharedStore, kind: str) -> None:
        self.shared = shared
        self.kind = kind

    async def strike(self, nonce: str, until: float) -> bool:
        try:
            struck = bool(await self.shared.redis.set(f"{KEY_PREFIX}used:{self.kind}:{nonce}", "1", nx=True,
                                                      exat=max(1, math.ceil(until))))
        except (RedisError, OSError) as exc:
            self.shared.failed(f"one-use {self.kind}s", exc)
            log.error("Redis cannot be reached to check a one-use %s (%s): it is refused; check server.redis_url",
                      self.kind, exc)
            return False
        self.shared.answered()
        return struck

    async def struck(self, nonce: str) -> bool:
        try:
            struck = bool(await self.shared.redis.exists(f"{KEY_PREFIX}used:{self.kind}:{nonce}"))
        except (RedisError, OSError) as exc:
            self.shared.failed(f"{self.kind}s", exc)
            log.error("Redis cannot be reached to check a %s (%s): it is refused; check server.redis_url",
                      self.kind, exc)
            return True
        self.shared.answered()
        return struck
