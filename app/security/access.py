"""Who may use the service (docs/security.md): API keys compared in constant time, one-use session
tokens for browsers' WebSockets, login cookies for the QA dashboard, allowed browser origins, and
the start-up check that keeps a server without keys on a loopback address.

The routes here: `GET /api/auth` (open: are keys needed, is this caller in; a wrong key counts, as
anywhere), `POST /api/login` and `POST /api/logout` (the cookie), `POST /api/session-token` (a key
or the cookie; checked by the guard in app/security/guard.py like the rest of /api). A wrong key,
token or cookie is logged with the client's address, never with what was sent."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.types import Scope

from app.security.limits import RateLimiter, address_key
from app.security.shared import RedisUsedTokens, SharedLimit
from app.security.shared_store import SharedStore, SharedStoreDown
from app.security.tokens import Tokens, token_secret
from app.settings import ServerConfig
from core.clock import Clock
from core.errors import ConfigError

log = logging.getLogger(__name__)
router = APIRouter(prefix="/api", tags=["access"])

SESSION_TOKEN_TTL_S = 60
CLIENT_SECRET_PREFIX = "ek_"
CLIENT_SECRET_MAX_TTL_S = 7200  # OpenAI's limit for an ephemeral key
REALTIME_PATH = "/v1/realtime"
KEY_PROTOCOL = "openai-insecure-api-key."  # how a browser's WebSocket carries a key (it cannot set headers)
LOGIN_COOKIE = "voice_agent_login"
CLIENT_KEY = "voice_agent.client"  # the scope key under which the guard leaves whom it counted the request as


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


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "replace")).digest()


class Keys:
    """The API keys, kept as SHA-256 digests: a candidate's digest is compared with every key's,
    in constant time and at one length, so timing tells neither a key nor its length."""

    def __init__(self, keys: list[str]) -> None:
        self._digests = [_digest(key) for key in keys]

    @property
    def required(self) -> bool:
        return bool(self._digests)

    def identify(self, candidate: str) -> str | None:
        """The client a valid key stands for ("key:" and a short hash of it, never the key), or None."""
        given = _digest(candidate)
        found: bytes | None = None
        for digest in self._digests:  # every key is compared: a match does not end the loop early
            if hmac.compare_digest(digest, given):
                found = digest
        return None if found is None else "key:" + found.hex()[:12]

    def check(self, candidate: str) -> bool:
        return self.identify(candidate) is not None


LOOPBACK_NAMES = ("localhost", ".localhost", "127.0.0.1", "::1")


def host_name(value: str) -> str:
    """The name in a Host header or a URL's netloc, without port, brackets or trailing dot, lower case."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


class AllowedHosts:
    """The names this server answers to (server.allowed_hosts, the loopback names, the address it
    binds and the public URLs it is given): a request for any other Host is refused, so that a web
    page cannot reach a server on the user's machine by pointing its own name at 127.0.0.1 (DNS
    rebinding). "*" allows any; ".example.com" allows example.com and its subdomains."""

    def __init__(self, names: list[str]) -> None:
        cleaned = {host_name(n) if n not in ("*",) and not n.startswith(".") else n.lower() for n in names if n}
        self.any = "*" in cleaned
        self.exact = frozenset(n for n in cleaned if not n.startswith("."))
        self.suffixes = tuple(n for n in cleaned if n.startswith("."))

    @classmethod
    def for_settings(cls, server: ServerConfig, public_urls: list[str]) -> AllowedHosts:
        names = [*LOOPBACK_NAMES, *server.allowed_hosts]
        if server.host not in ("", "0.0.0.0", "::"):
            names.append(server.host)
        names += [urlsplit(url).hostname or "" for url in public_urls if url]
        return cls(names)

    def allows(self, host: str | None) -> bool:
        if self.any:
            return True
        if not host:
            return False
        name = host_name(host)
        return name in self.exact or any(name.endswith(s) or name == s[1:] for s in self.suffixes)


def origin_allowed(origin: str | None, host: str | None, allowed: list[str], hosts: AllowedHosts) -> bool:
    """No Origin (not a browser), one listed in server.allowed_origins, or the page's own origin
    (Origin's host = Host) when that host is one this server answers to."""
    if origin is None:
        return True
    origin = origin.rstrip("/").lower()
    if origin in (value.rstrip("/").lower() for value in allowed) or "*" in allowed:
        return True
    netloc = urlsplit(origin).netloc
    return bool(host) and bool(netloc) and netloc == (host or "").lower() and hosts.allows(netloc)


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:  # a dual-stack socket's IPv4 client
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


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
    """The access state of one app: its keys, session tokens, logins, allowed hosts and origins, and
    the limit on wrong keys per address."""

    def __init__(self, server: ServerConfig, clock: Clock, public_urls: list[str] | None = None,
                 shared: SharedStore | None = None) -> None:
        self.keys = Keys(load_keys(server))
        self.shared = shared  # server.redis_url: the state replicas share (app/security/shared.py)
        secret = token_secret(server)

        def tokens(ttl_s: float, kind: str) -> Tokens:
            return Tokens(ttl_s, clock, secret, kind, RedisUsedTokens(shared, kind) if shared is not None else None)

        self.session_tokens = tokens(SESSION_TOKEN_TTL_S, "session token")
        # the Realtime API's ephemeral keys (POST /v1/realtime/client_secrets): one use, one /v1/realtime
        # socket, carrying the session settings they were minted with
        self.client_secrets = tokens(CLIENT_SECRET_MAX_TTL_S, "client secret")
        self.logins = tokens(server.login_ttl_s, "login")
        self.allowed_origins = list(server.allowed_origins)
        self.allowed_hosts = AllowedHosts.for_settings(server, public_urls or [])
        # wrong keys, tokens and cookies, per address: guessing is slow on every authenticated route
        self.failures = SharedLimit("auth failures", server.max_auth_failures_per_minute, clock, shared)

    def mint_client_secret(self, owner: str, ttl_s: float, session: dict[str, Any]) -> str:
        return self.client_secrets.issue(owner, ttl_s, CLIENT_SECRET_PREFIX, data=session)

    def bearer_owner(self, authorization: str | None) -> str | None:
        """The client a valid `Authorization: Bearer <key>` stands for, or None."""
        if not authorization:
            return None
        scheme, _, key = authorization.partition(" ")
        return self.keys.identify(key.strip()) if scheme.lower() == "bearer" else None

    def bearer_ok(self, authorization: str | None) -> bool:
        return self.bearer_owner(authorization) is not None

    async def cookie_owner(self, cookie: str | None) -> str | None:
        return await self.logins.owner(cookie) if cookie else None

    async def cookie_ok(self, cookie: str | None) -> bool:
        return await self.cookie_owner(cookie) is not None

    async def failed(self, address: str, route: str) -> None:
        """A wrong key, token or cookie from `address` on `route` (refused whether or not it can be
        counted), logged with the address, never with what was sent. Past
        server.max_auth_failures_per_minute every route that looks at a key answers 429 (close 1013)."""
        blocked = 0.0
        with contextlib.suppress(SharedStoreDown):  # the store is down: the next blocked_for refuses
            await self.failures.take(address)
            blocked = await self.failures.wait(address)
        limited = (f"; this address is refused for {RateLimiter.retry_after(blocked)} s "
                   "(server.max_auth_failures_per_minute)" if blocked else "")
        log.warning("a wrong key, token or login cookie from %s on %r%s", address, route[:100], limited)

    async def blocked_for(self, address: str) -> float:
        """Seconds until `address` may try a key again (0: now); SharedStoreDown when that cannot be
        known (server.shared_state_failure=closed and Redis unreachable)."""
        return await self.failures.wait(address)


def _access(request: Request) -> Access:
    access: Access = request.app.state.access
    return access


def client_of(scope: Scope) -> str:
    """Who the guard counted this request as: an API key ("key:..."), else the client's address."""
    client = scope.get(CLIENT_KEY)
    if isinstance(client, str):
        return client
    peer = scope.get("client")
    return address_key(peer[0]) if peer else "unknown"


def address_of(scope: Scope) -> str:
    peer = scope.get("client")
    return address_key(peer[0]) if peer else "unknown"


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
    """Open to all: whether keys are needed, and whether this caller (Bearer or cookie) is in. A
    wrong key or cookie here counts as one on any route (past the limit the guard answers 429), so
    this is no quicker a way to guess keys than any other."""
    access = _access(request)
    if not access.keys.required:
        return AuthState(keys_required=False, authorized=True)
    authorization, cookie = request.headers.get("authorization"), request.cookies.get(LOGIN_COOKIE)
    authorized = access.bearer_ok(authorization) or await access.cookie_ok(cookie)
    if not authorized and (authorization or cookie):
        await access.failed(address_of(request.scope), "/api/auth")
    return AuthState(keys_required=True, authorized=authorized)


@router.post("/login", response_model=None)
async def login(body: Login, request: Request) -> Response:
    """A key in the body buys a cookie (HttpOnly, SameSite=Strict; Secure when the request came over
    TLS, directly or through a trusted proxy's X-Forwarded-Proto) good for /qa and /api."""
    access = _access(request)
    owner = access.keys.identify(body.key) if access.keys.required else address_of(request.scope)
    if owner is None:
        await access.failed(address_of(request.scope), "/api/login")
        return JSONResponse({"error": {"code": "unauthorized", "message": "that is not a valid key"}},
                            status_code=401)
    response = JSONResponse({"expires_in": int(access.logins.ttl_s)})
    response.set_cookie(LOGIN_COOKIE, access.logins.issue(owner), max_age=int(access.logins.ttl_s), path="/",
                        httponly=True, samesite="strict", secure=request.url.scheme == "https")
    return response


@router.post("/logout", status_code=204, response_model=None)
async def logout(request: Request) -> Response:
    await _access(request).logins.drop(request.cookies.get(LOGIN_COOKIE, ""))
    response = Response(status_code=204)
    response.delete_cookie(LOGIN_COOKIE, path="/")
    return response


@router.post("/session-token")
async def session_token(request: Request) -> SessionToken:
    """A token for one /ws connection (`/ws?token=...`) within 60 s; the guard checked the key. The
    call it opens counts against the same client as this request (its key)."""
    token = _access(request).session_tokens.issue(client_of(request.scope))
    return SessionToken(token=token, expires_in=SESSION_TOKEN_TTL_S)
