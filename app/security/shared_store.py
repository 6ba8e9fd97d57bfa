"""The store that replicas share (Redis or Valkey, server.redis_url), whether it answers, and what
to do while it does not (server.shared_state_failure, docs/security.md):

- `open` (the default): the per-client rate limits let requests through and each replica counts its
  own calls, so an outage of Redis is not an outage of the service; a client's limits are then
  per replica, N times larger with N replicas.
- `closed`: whatever needs the shared store (a rate-limited request, a new call, a key check that
  must know the address's wrong keys) is refused with a try-later answer, so no limit ever grows
  with the number of replicas; calls already in progress go on.

One-use tokens are refused either way (a token cannot be known unused). Every answer and every
failure is reported to `watch` (the `voice_agent_shared_state_*` metrics); the first failure of an
outage is logged, and so is the first answer after it. /readyz asks with `check()` (a PING), which
is also how a replica that refuses everything while `closed` learns that Redis is back."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from core.errors import VoiceAgentError

log = logging.getLogger(__name__)
TIMEOUT_S = 0.5  # a Redis that answers slower than this counts as down for the request
RETRY_S = 5  # what a refusal while `closed` tells the client to wait before it tries again

Failure = Literal["open", "closed"]


class SharedStoreDown(VoiceAgentError):
    """The shared store cannot be reached and server.shared_state_failure is `closed`: what needed
    it is refused; trying again in a few seconds may work."""

    code = "shared_state_unavailable"
    retryable = True

    def __init__(self, what: str) -> None:
        super().__init__(f"the shared store (server.redis_url) cannot be reached to check your {what}, and this "
                         f"server refuses rather than guess (server.shared_state_failure=closed); try again in "
                         f"{RETRY_S} s")

    @property
    def reason(self) -> str:
        """The same, short enough for a WebSocket close reason (123 bytes)."""
        return f"the shared store is unreachable (server.shared_state_failure=closed); retry in {RETRY_S} s"


def connect(url: str) -> Redis:
    """A client for server.redis_url (redis://, rediss://, unix://); it connects on first use. A
    command that meets a closed connection is sent once more on a new one: after Redis restarts,
    every idle pooled connection is dead, and without this the first command on each of them
    failed (a limit let through, a one-use token refused) though Redis was back. A timeout is not
    sent again: a slow Redis would cost twice TIMEOUT_S, and a command it did run (a bucket spent,
    a call's place taken) would run twice."""
    return Redis.from_url(url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S, decode_responses=True,
                          retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)))


class SharedStore:
    """A Redis client with the policy for its outages and a record of whether it last answered."""

    def __init__(self, redis: Redis, failure: Failure = "open", watch: Callable[[bool], None] | None = None) -> None:
        self.redis = redis
        self.failure: Failure = failure
        self.watch = watch  # told True for every answer, False for every failure
        self.up = True  # whether the last request answered
        self.failures = 0  # requests that failed, since start

    @classmethod
    def from_url(cls, url: str, failure: Failure = "open", watch: Callable[[bool], None] | None = None) -> SharedStore:
        return cls(connect(url), failure, watch)

    @property
    def closed(self) -> bool:
        """Whether what needs the store is refused while it cannot be reached."""
        return self.failure == "closed"

    def answered(self) -> None:
        if not self.up:
            log.info("Redis answers again (server.redis_url): the limits are shared again")
        self.up = True
        if self.watch is not None:
            self.watch(True)

    def failed(self, what: str, exc: BaseException) -> None:
        """A request for `what` (the connections limit, the key calls count...) got no answer."""
        self.failures += 1
        if self.up:
            then = ("what needs it is refused (try later) until it answers" if self.closed else
                    "rate limits let requests through and each replica counts its own calls until it answers")
            log.warning("Redis cannot be reached for the %s (%s): %s (server.shared_state_failure=%s); one-use "
                        "tokens are refused; check server.redis_url", what, exc, then, self.failure)
        self.up = False
        if self.watch is not None:
            self.watch(False)

    async def check(self) -> bool:
        """Ask the store (PING): whether it answers now."""
        try:
            await self.redis.ping()
        except (RedisError, OSError) as exc:
            self.failed("readiness check", exc)
            return False
        self.answered()
        return True

    async def aclose(self) -> None:
        await self.redis.aclose()
