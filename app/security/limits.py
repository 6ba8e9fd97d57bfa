"""Per-client limits (docs/security.md): who the client is, a rate limiter per client, and a count
of calls in progress per client.

A client is an API key when the request carries one (keys are accountable: a call centre's gateway
puts many callers behind one address), else its address; IPv6 addresses count by their /64, the
block one subscriber gets. The proxy headers of trusted proxies are applied before the guard sees
the request (uvicorn's ProxyHeadersMiddleware in app/main.py), so the address is the client's.

Both tables are bounded without letting an abuser reset its own limit: a rate bucket is forgotten
only once it has refilled (it then says the same as a new one), and when the table is full of
buckets that have not, newcomers share one overflow bucket, which counts and limits them like one
client: asking a newcomer's standing (`wait`, `standing`) reads the bucket its requests are
counted in, so a wrong-key limit holds for addresses in the overflow too."""

from __future__ import annotations

import ipaddress
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from core.clock import Clock
from core.errors import ConfigError

MAX_CLIENTS = 10_000  # clients remembered per table; an idle one costs ~200 bytes
OVERFLOW = "(overflow)"  # the bucket that clients share while the table is full of active ones

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(values: Iterable[str], setting: str) -> list[Network]:
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ConfigError(f"{setting}: {value!r} is not an IP address or network") from None
    return networks


def address_key(address: str) -> str:
    """The client an address stands for: an IPv4 address itself (also written IPv4-mapped), an
    IPv6 address's /64 (one subscriber's block: rotating addresses inside it is free)."""
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]"))
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


@dataclass
class _Bucket:
    tokens: float
    at: float


class RateLimiter:
    """A token bucket per client: `per_minute` at once, refilled evenly over the minute."""

    def __init__(self, per_minute: int, clock: Clock, max_clients: int = MAX_CLIENTS) -> None:
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0  # tokens a second
        self.clock = clock
        self.max_clients = max_clients
        self.buckets: OrderedDict[str, _Bucket] = OrderedDict()  # least recently seen first

    def _key(self, client: str, now: float) -> str:
        """The bucket the client's requests are counted in: its own, or, while the table is full of
        clients that are still limited, the overflow bucket that newcomers share."""
        if client in self.buckets or len(self.buckets) < self.max_clients:
            return client
        self._forget_refilled(now)
        return client if len(self.buckets) < self.max_clients else OVERFLOW

    def _bucket(self, client: str, now: float) -> _Bucket:
        key = self._key(client, now)
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = _Bucket(self.capacity, now)
        self.buckets.move_to_end(key)
        bucket.tokens = min(self.capacity, bucket.tokens + (now - bucket.at) * self.rate)
        bucket.at = now
        return bucket

    def _tokens(self, client: str) -> float:
        """What the client's bucket holds now, spending nothing (a client with none has a full one)."""
        now = self.clock.now()
        bucket = self.buckets.get(self._key(client, now))
        if bucket is None:
            return self.capacity
        return min(self.capacity, bucket.tokens + (now - bucket.at) * self.rate)

    def _forget_refilled(self, now: float) -> None:
        """Drop the buckets that are full again: forgetting one changes nothing."""
        for client in [c for c, b in self.buckets.items()
                       if b.tokens + (now - b.at) * self.rate >= self.capacity]:
            del self.buckets[client]

    def take(self, client: str) -> float:
        """0 when the client may go on (and one token is spent), else the seconds to wait."""
        bucket = self._bucket(client, self.clock.now())
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self.rate

    def wait(self, client: str) -> float:
        """The seconds until the client may go on (0: now), spending nothing."""
        tokens = self._tokens(client)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate

    def standing(self, client: str) -> tuple[int, float]:
        """What the client has left now, spending nothing: whole tokens, and the seconds until its
        bucket is full again."""
        tokens = self._tokens(client)
        return int(tokens), (self.capacity - tokens) / self.rate if self.rate else 0.0

    @staticmethod
    def retry_after(wait_s: float) -> str:
        return str(max(1, math.ceil(wait_s)))


class Slot:
    """A place taken in a count; `release()` gives it back, once, however often it is called."""

    def __init__(self, release: Callable[[], None]) -> None:
        self._release: Callable[[], None] | None = release

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()

    @property
    def held(self) -> bool:
        return self._release is not None


class CallCounter:
    """Calls in progress per client; a limit of 0 counts without limiting."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.calls: dict[str, int] = {}

    def enter(self, client: str) -> Slot | None:
        """A slot for a new call of `client`, or None when it has `limit` calls already."""
        count = self.calls.get(client, 0)
        if self.limit and count >= self.limit:
            return None
        self.calls[client] = count + 1
        return Slot(lambda: self._leave(client))

    def _leave(self, client: str) -> None:
        count = self.calls.get(client, 0) - 1
        if count > 0:
            self.calls[client] = count
        else:
            self.calls.pop(client, None)  # a client with no call costs nothing
