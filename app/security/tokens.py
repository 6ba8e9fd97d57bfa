"""Tokens that any replica sharing the secret can check (docs/security.md, docs/deployment.md):
session tokens for browsers' WebSockets, login cookies, the Realtime API's ephemeral keys and the
phone lines' stream nonces.

A token is signed data (itsdangerous, HMAC-SHA256): its owner, its expiry in wall-clock seconds,
a random nonce, and what it carries (an ephemeral key's session). Nothing is kept to check one, so
a token minted by one replica opens a call on another. A one-use token is struck off when used, by
its nonce, until it expires: in Redis when server.redis_url is set (every replica), else in this
process's memory. The secret comes from server.token_secret or server.token_secret_file; without
one, each process makes its own, and its tokens are good on it alone."""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict
from pathlib import Path
from typing import Any

from itsdangerous import BadData, URLSafeSerializer

from app.security.shared import RedisUsedTokens
from app.settings import ServerConfig
from core.clock import Clock
from core.errors import ConfigError

log = logging.getLogger(__name__)
MAX_USED = 10_000  # one-use tokens struck off and not yet expired, per store
_PROCESS_SECRET = secrets.token_bytes(32)  # without a configured secret: this process's own


def token_secret(server: ServerConfig) -> bytes:
    """The secret tokens are signed with: server.token_secret, else server.token_secret_file's first
    line, else this process's own (good on this replica alone)."""
    secret = server.token_secret.get_secret_value().strip()
    if not secret and server.token_secret_file:
        path = Path(server.token_secret_file)
        try:
            secret = next(iter(path.read_text().splitlines()), "").strip()
        except OSError as exc:
            raise ConfigError(f"server.token_secret_file: cannot read {path}: {exc.strerror}") from None
        if not secret:
            raise ConfigError(f"server.token_secret_file: {path} is empty; put a long random secret on its first line")
    if secret and len(secret) < 16:
        raise ConfigError("server.token_secret must be at least 16 characters (a long random string: "
                          "python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return secret.encode() if secret else _PROCESS_SECRET


class UsedTokens:
    """The nonces of one-use tokens already used, each until its token expires; at most `max_count`
    (when that many are live, no more tokens can be used until some expire: never a reuse)."""

    def __init__(self, clock: Clock, max_count: int = MAX_USED) -> None:
        self.clock = clock
        self.max_count = max_count
        self._until: OrderedDict[str, float] = OrderedDict()

    async def strike(self, nonce: str, until: float) -> bool:
        """Strike the nonce off; False when it was already (or the store is full of live ones)."""
        if len(self._until) >= self.max_count:
            now = self.clock.wall()
            for old in [n for n, expiry in self._until.items() if expiry <= now]:
                del self._until[old]
        if nonce in self._until:
            return False
        if len(self._until) >= self.max_count:
            log.warning("%d one-use tokens are in use and unexpired; refusing more until some expire", self.max_count)
            return False
        self._until[nonce] = until
        return True

    async def struck(self, nonce: str) -> bool:
        return nonce in self._until and self._until[nonce] > self.clock.wall()

    def __len__(self) -> int:
        return len(self._until)


class Tokens:
    """Signed, expiring tokens of one kind (`purpose`: a token of one kind is never taken for
    another), for an owner (the client that asked for them), valid for `ttl_s` at most."""

    def __init__(self, ttl_s: float, clock: Clock, secret: bytes, purpose: str,
                 used: UsedTokens | RedisUsedTokens | None = None) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self.used = used if used is not None else UsedTokens(clock)
        self._signer = URLSafeSerializer(secret, salt=f"voice-agent {purpose}")

    def issue(self, owner: str = "", ttl_s: float | None = None, prefix: str = "", data: Any = None) -> str:
        """A new token for `owner`, valid for `ttl_s` (at most the kind's ttl_s, its default),
        carrying `data` (JSON)."""
        expiry = round(self.clock.wall() + min(ttl_s or self.ttl_s, self.ttl_s), 3)
        claims = {"o": owner, "x": expiry, "n": secrets.token_urlsafe(12), **({"d": data} if data is not None else {})}
        return prefix + self._signer.dumps(claims)

    async def _claims(self, token: str, prefix: str = "") -> dict[str, Any] | None:
        if not token or not token.startswith(prefix):
            return None
        try:
            claims = self._signer.loads(token[len(prefix):])
        except BadData:
            return None
        if not isinstance(claims, dict) or not isinstance(claims.get("x"), int | float):
            return None
        if claims["x"] <= self.clock.wall() or await self.used.struck(str(claims.get("n"))):
            return None
        return claims

    async def owner(self, token: str, prefix: str = "") -> str | None:
        """The owner of a live token (it stays usable), or None."""
        claims = await self._claims(token, prefix)
        return str(claims.get("o", "")) if claims is not None else None

    async def take(self, token: str, prefix: str = "") -> str | None:
        """A live token's owner, once: it is struck off after. None for an unknown, expired or used one."""
        redeemed = await self.redeem(token, prefix)
        return redeemed[0] if redeemed is not None else None

    async def redeem(self, token: str, prefix: str = "") -> tuple[str, Any] | None:
        """A live token's owner and the data it carries, once (as `take`)."""
        claims = await self._claims(token, prefix)
        if claims is None or not await self.used.strike(str(claims["n"]), float(claims["x"])):
            return None
        return str(claims.get("o", "")), claims.get("d")

    async def drop(self, token: str) -> None:
        """The token is good no more (a logout)."""
        claims = await self._claims(token)
        if claims is not None:
            await self.used.strike(str(claims["n"]), float(claims["x"]))
