"""One-use stream tokens for Telnyx media sockets (the format is in app/transports/phone/telnyx.py)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections import OrderedDict

from app.settings import TelnyxConfig
from app.store.records import utc_now

MAX_USED = 100_000  # used tokens remembered until they expire; beyond, the soonest to expire go first


def _mac(secret: str, message: str) -> str:
    digest = hmac.new(secret.encode(), message.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def mint_token(secret: str, ttl_s: float, now: float) -> str:
    """A one-use stream token that expires `ttl_s` after `now` (Unix seconds)."""
    body = f"v1.{int(now + ttl_s)}.{secrets.token_urlsafe(12)}"
    return f"{body}.{_mac(secret, body)}"


class StreamTokens:
    """Checks stream tokens and remembers the used ones until they expire."""

    def __init__(self, config: TelnyxConfig) -> None:
        self.config = config
        self._used: OrderedDict[str, int] = OrderedDict()  # nonce -> expiry, in the order used

    def mint(self, now: float | None = None) -> str:
        return mint_token(self.config.stream_token.get_secret_value(), self.config.token_ttl_s,
                          utc_now().timestamp() if now is None else now)

    def take(self, token: str | None, now: float | None = None) -> bool:
        """True once for a valid, unexpired token minted with the secret (or for the secret itself,
        when telnyx.allow_static_token says so)."""
        secret = self.config.stream_token.get_secret_value()
        if not secret or not token:
            return False
        if self.config.allow_static_token and hmac.compare_digest(_mac(secret, token), _mac(secret, secret)):
            return True
        parts = token.split(".")
        if len(parts) != 4 or parts[0] != "v1" or not parts[1].isdigit():
            return False
        expires, nonce = int(parts[1]), parts[2]
        if not hmac.compare_digest(parts[3].encode(), _mac(secret, ".".join(parts[:3])).encode()):
            return False
        now = utc_now().timestamp() if now is None else now
        if expires < now or expires > now + self.config.token_ttl_s + 60 or nonce in self._used:
            return False  # expired, from a clock far ahead, or used
        self._forget_expired(now)
        self._used[nonce] = expires
        return True

    def _forget_expired(self, now: float) -> None:
        while self._used and (len(self._used) >= MAX_USED or next(iter(self._used.values())) < now):
            self._used.popitem(last=False)
