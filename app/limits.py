"""Per-client limits (docs/security.md): who the client is (its address, or behind a trusted proxy
the address the proxy names), a rate limiter per client, and a count of calls in progress per
client. Both tables are bounded: the least recently seen clients are forgotten first."""

from __future__ import annotations

import ipaddress
import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from core.clock import Clock
from core.errors import ConfigError

MAX_CLIENTS = 10_000  # clients remembered per table; an idle one costs ~200 bytes

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(values: Iterable[str], setting: str) -> list[Network]:
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ConfigError(f"{setting}: {value!r} is not an IP address or network") from None
    return networks


def _in(address: str, networks: list[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return False
    return any(ip in network for network in networks)


def client_address(peer: str, forwarded_for: str | None, trusted: list[Network]) -> str:
    """The peer's address; when the peer is a trusted proxy, the nearest address in X-Forwarded-For
    that is not itself a trusted proxy (the ones further left are the client's to write)."""
    if not forwarded_for or not _in(peer, trusted):
        return peer
    hops = [hop.strip() for hop in forwarded_for.split(",") if hop.strip()]
    for hop in reversed(hops):
        if not _in(hop, trusted):
            return hop
    return hops[0] if hops else peer


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
        self.buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def take(self, client: str) -> float:
        """0 when the client may go on (and one token is spent), else the seconds to wait."""
        now = self.clock.now()
        bucket = self.buckets.pop(client, None) or _Bucket(self.capacity, now)
        bucket.tokens = min(self.capacity, bucket.tokens + (now - bucket.at) * self.rate)
        bucket.at = now
        self.buckets[client] = bucket  # most recently seen last
        while len(self.buckets) > self.max_clients:
            self.buckets.popitem(last=False)
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self.rate

    @staticmethod
    def retry_after(wait_s: float) -> str:
        return str(max(1, math.ceil(wait_s)))


class CallCounter:
    """Calls in progress per client."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.calls: dict[str, int] = {}

    def enter(self, client: str) -> bool:
        count = self.calls.get(client, 0)
        if count >= self.limit:
            return False
        self.calls[client] = count + 1
        return True

    def leave(self, client: str) -> None:
        count = self.calls.get(client, 0) - 1
        if count > 0:
            self.calls[client] = count
        else:
            self.calls.pop(client, None)  # a client with no call costs nothing

