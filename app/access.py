"""Who may use the service (docs/security.md): API keys compared in constant time, one-use session
tokens for browsers' WebSockets, login cookies for the QA dashboard, allowed browser origins, and
the start-up check that keeps a server without keys on a loopback address.

The routes here: `GET /api/auth` (open: are keys needed, is this caller in), `POST /api/login` and
`POST /api/logout` (the cookie), `POST /api/session-token` (a key or the cookie; checked by the
guard in app/guard.py like the rest of /api)."""

from __future__ import annotations

import hmac
import ipaddress
import logging
import secrets
from collections import OrderedDict
from pathlib import Path
from urllib.parse import urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from app.limits import parse_networks
from app.settings import ServerConfig
from core.clock import Clock
from core.errors import ConfigError

log = logging.getLogger(__name__)
router = APIRouter(prefix="/api", tags=["access"])

SESSION_TOKEN_TTL_S = 60
MAX_TOKENS = 10_000  # outstanding session tokens (and, apart, logins); the oldest go first
LOGIN_COOKIE = "voice_agent_login"


def load_keys(server: ServerConfig) -> list[str]:
    """The keys from server.api_keys and server.api_keys_file (one a line, # comments)."""
    keys = [key.get_secret_value().strip() for key in server.api_keys]
    if server.api_keys_file:
        path = Path(server.api_keys_file)
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise ConfigError(f"server.api_keys_file: cannot read {path}: {exc.strerror}") from None
        keys += [line.split("#", 1)[0].strip() for line in lines]
    return [key for key in keys if key]


class Keys:
    def __init__(self, keys: list[str]) -> None:
        self._keys = [key.encode() for key in keys]

    @property
    def required(self) -> bool:
        return bool(self._keys)

    def check(self, candidate: str) -> bool:
        """Compared with every key, in constant time, so timing tells nothing of a key."""
        given = candidate.encode("utf-8", "replace")
        found = False
        for key in self._keys:
            found |= hmac.compare_digest(key, given)
        return found


class Tokens:
    """Random tokens with an expiry, kept in memory, at most `max_count` (the oldest dropped)."""

    def __init__(self, ttl_s: float, clock: Clock, max_count: int = MAX_TOKENS) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self.max_count = max_count
        self._expiry: OrderedDict[str, float] = OrderedDict()  # in issue order, so in expiry order

    def issue(self) -> str:
        now = self.clock.now()
        while self._expiry and (len(self._expiry) >= self.max_count or next(iter(self._expiry.values())) <= now):
            self._expiry.popitem(last=False)
        token = secrets.token_urlsafe(32)
        self._expiry[token] = now + self.ttl_s
        return token

    def valid(self, token: str) -> bool:
        expiry = self._expiry.get(token)
        return expiry is not None and self.clock.now() < expiry

    def take(self, token: str) -> bool:
        """True once for a live token; it is gone after."""
        ok = self.valid(token)
        self._expiry.pop(token, None)
        return ok

    def drop(self, token: str) -> None:
        self._expiry.pop(token, None)

    def __len__(self) -> int:
        return len(self._expiry)


def origin_allowed(origin: str | None, host: str | None, allowed: list[str]) -> bool:
    """No Origin (not a browser), the page's own origin, or one listed in server.allowed_origins."""
    if origin is None:
        return True
    origin = origin.rstrip("/").lower()
    if origin in (value.rstrip("/").lower() for value in allowed) or "*" in allowed:
        return True
    return bool(host) and urlsplit(origin).netloc == (host or "").lower()


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(server: ServerConfig) -> None:
    """Refuse to serve a non-loopback address without keys, unless allow_unauthenticated says so."""
    if is_loopback(server.host) or load_keys(server):
        return
    if server.allow_unauthenticated:
        log.warning("serving %s with no API keys: anyone who reaches the port may place calls, use /v1 and read "
                    "the call records (server.allow_unauthenticated is true)", server.host)
        return
    raise ConfigError(
        f"refusing to serve {server.host} without API keys: set server.api_keys (VOICE_AGENT_SERVER__API_KEYS="
        "'[\"a-long-random-key\"]') or server.api_keys_file, bind 127.0.0.1, or set "
        "server.allow_unauthenticated=true to serve it open anyway (docs/security.md)")


class Access:
    """The access state of one app: its keys, session tokens and logins."""

    def __init__(self, server: ServerConfig, clock: Clock) -> None:
        self.keys = Keys(load_keys(server))
        self.session_tokens = Tokens(SESSION_TOKEN_TTL_S, clock)
        self.logins = Tokens(server.login_ttl_s, clock)
        self.allowed_origins = list(server.allowed_origins)
        self.trusted_proxies = parse_networks(server.trusted_proxies, "server.trusted_proxies")

    def bearer_ok(self, authorization: str | None) -> bool:
        if not authorization:
            return False
        scheme, _, key = authorization.partition(" ")
        return scheme.lower() == "bearer" and self.keys.check(key.strip())

    def cookie_ok(self, cookie: str | None) -> bool:
        return bool(cookie) and self.logins.valid(cookie or "")


def _access(request: Request) -> Access:
    access: Access = request.app.state.access
    return access


class AuthState(BaseModel):
    keys_required: bool
    authorized: bool


class Login(BaseModel):
    key: str = Field(max_length=4096)


class SessionToken(BaseModel):
    token: str
    expires_in: int


@router.get("/auth")
async def auth_state(request: Request) -> AuthState:
    """Open to all: whether keys are needed, and whether this caller (Bearer or cookie) is in."""
    access = _access(request)
    authorized = (not access.keys.required or access.bearer_ok(request.headers.get("authorization"))
                  or access.cookie_ok(request.cookies.get(LOGIN_COOKIE)))
    return AuthState(keys_required=access.keys.required, authorized=authorized)


@router.post("/login", response_model=None)
async def login(body: Login, request: Request) -> Response:
    """A key in the body buys a cookie (HttpOnly, SameSite=Strict) good for /qa and /api."""
    access = _access(request)
    if access.keys.required and not access.keys.check(body.key):
        return JSONResponse({"error": {"code": "unauthorized", "message": "that is not a valid key"}},
                            status_code=401)
    response = JSONResponse({"expires_in": int(access.logins.ttl_s)})
    response.set_cookie(LOGIN_COOKIE, access.logins.issue(), max_age=int(access.logins.ttl_s), path="/",
                        httponly=True, samesite="strict", secure=request.url.scheme == "https")
    return response


@router.post("/logout", status_code=204, response_model=None)
async def logout(request: Request) -> Response:
    _access(request).logins.drop(request.cookies.get(LOGIN_COOKIE, ""))
    response = Response(status_code=204)
    response.delete_cookie(LOGIN_COOKIE, path="/")
    return response


@router.post("/session-token")
async def session_token(request: Request) -> SessionToken:
    """A token for one /ws connection (`/ws?token=...`) within 60 s; the guard checked the key."""
    return SessionToken(token=_access(request).session_tokens.issue(), expires_in=SESSION_TOKEN_TTL_S)
