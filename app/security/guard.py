"""The guard in front of every route, as plain ASGI middleware (docs/security.md).

Every request: the Host it names must be one this server answers to (server.allowed_hosts and the
defaults in app/security/access.py), else 400, or 403 before a WebSocket upgrade; only /healthz is exempt
(a probe names the pod's address, and the answer tells nothing). Paths are matched as Starlette
routes them (without a root_path or a mount's prefix), and every path needs a key, when keys are
set, but the few that are open by design (OPEN_PATHS: the page, its static files, health, the login
routes, the phone webhook with its own signature).

HTTP: `Authorization: Bearer <key>` (`/api` and `/qa` also take the login cookie); a wrong key,
token or cookie is counted per address (and logged with it, never with the key), and past
server.max_auth_failures_per_minute every authenticated route, and the open ones that look at a key
(`/api/auth`, `/api/login`), answers 429 for the rest of the minute. `/v1` requests (and login attempts) are
rate-limited per client (429 + Retry-After). The body is read here, whole, before any route sees
it: larger than server.max_body_bytes is 413, slower than server.body_timeout_s is 408.

WebSockets (`/ws`, `/v1/realtime`, every one but the phone media sockets): a browser Origin that is
not allowed is refused before the upgrade (403); a missing key (Bearer header, a one-use `?token=`,
and on /v1/realtime an ephemeral `ek_` key or the `openai-insecure-api-key.` subprotocol a browser
can set) is accepted and closed with 1008 and a reason, so that a
browser can read why; too many new connections or calls in progress from one client is accepted
and closed with 1013 and a reason. A client is the API key the call was opened with, else the
address (app/security/limits.py). The call's place in its client's count is handed to the route
(`CLIENT_SLOT` in the scope), which gives it back the moment the caller hangs up.

WebRTC calls are HTTP: the key checks above, and also an ephemeral `ek_` key on `POST
/v1/realtime/calls`, whose session goes to the route (`MINTED_SESSION`), and the page's one-use
`?token=` on `POST /webrtc/calls`; the route takes the call's place in its client's count itself
(`TAKE_CALL_SLOT`), since the call outlives the request.

Phone media sockets (`/twilio/media`, `/telnyx/media`) carry the provider's own credentials, checked
by their routes; here they are rate-limited per address (phone.max_connections_per_minute).

With server.redis_url set and Redis unreachable, server.shared_state_failure=closed refuses what
needs it: HTTP 503 with Retry-After, a WebSocket accepted and closed with 1013, each saying why
(app/security/shared_store.py); `open` lets it through, limited per replica.

Every WebSocket that sends nothing for server.idle_timeout_s is closed (1001)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette._utils import get_route_path  # the path Starlette's router matches: the guard must match the same
from starlette.datastructures import Headers, QueryParams
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.security.access import (
    CLIENT_KEY,
    CLIENT_SECRET_PREFIX,
    KEY_PROTOCOL,
    LOGIN_COOKIE,
    REALTIME_PATH,
    Access,
    address_of,
    origin_allowed,
)
from app.security.limits import RateLimiter, Slot
from app.security.shared import SharedCallCounter, SharedLimit
from app.security.shared_store import RETRY_S, SharedStoreDown
from app.settings import Settings
from core.clock import Clock

log = logging.getLogger(__name__)

CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CLOSE_TRY_LATER = 1013
CLIENT_SLOT = "voice_agent.client_slot"  # scope key: the call's place in its client's count (a Slot)
MINTED_SESSION = "voice_agent.minted_session"  # scope key: an ephemeral key's session settings
TAKE_CALL_SLOT = "voice_agent.take_call_slot"  # scope key: an HTTP-signalled call's place in its client's count
REALTIME_CALLS_PATH = "/v1/realtime/calls"  # WebRTC calls (app/transports/webrtc/realtime.py)
WEBRTC_CALLS_PATH = "/webrtc/calls"  # the page's WebRTC calls (app/transports/webrtc/native.py)
OUTBOUND_CALLS_PATH = "/api/calls/outbound"  # calls the service places (app/transports/outbound.py)
RATE_LIMITS = "voice_agent.rate_limits"  # scope key: what the socket's client has left of its limits, asked later
OPEN_PATHS = frozenset({"/", "/healthz", "/livez", "/readyz", "/api/auth", "/api/login", "/api/logout", "/twilio/voice",
                        "/twilio/status", "/twilio/media", "/telnyx/media", "/telnyx/events"})
OPEN_PREFIXES = ("/static/",)
# open routes that look at a key (and count a wrong one): held back, as every authenticated route
# is, from an address past server.max_auth_failures_per_minute
KEY_CHECKING = frozenset({"/api/auth", "/api/login"})
PHONE_SOCKETS = frozenset({"/twilio/media", "/telnyx/media"})
ANY_HOST = frozenset({"/healthz", "/livez", "/readyz"})  # probes name the pod's address
LOGIN_PAGE = Path(__file__).parents[1] / "static" / "login.html"
KEY_HINT = "send Authorization: Bearer <key> (a key from server.api_keys)"
WS_KEY_HINT = "needs a key: Authorization: Bearer <key>, or ?token= from POST /api/session-token"


def _needs_key(path: str) -> bool:
    return path not in OPEN_PATHS and not path.startswith(OPEN_PREFIXES)


def _takes_cookie(path: str) -> bool:
    return path == "/qa" or path.startswith(("/qa/", "/api/"))


async def _respond(send: Send, status: int, body: bytes, content_type: str = "application/json",
                   extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})


def _error(code: str, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}).encode()


class Guard:
    def __init__(self, app: ASGIApp, access: Access, settings: Settings, clock: Clock) -> None:
        self.app = app
        self.access = access
        self.server = server = settings.server
        shared = access.shared  # server.redis_url: every replica counts each client's requests together
        self.api_requests = SharedLimit("api requests", server.max_api_requests_per_minute, clock, shared)
        self.connections = SharedLimit("connections", server.max_connections_per_minute, clock, shared)
        self.phone_connections = SharedLimit("phone connections", settings.phone.max_connections_per_minute, clock,
                                             shared)
        self.address_calls = SharedCallCounter("address calls", server.max_calls_per_client, shared)
        self.key_calls = SharedCallCounter("key calls", server.max_calls_per_key, shared)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = get_route_path(scope)
        headers = Headers(scope=scope)
        if path not in ANY_HOST and not self.access.allowed_hosts.allows(headers.get("host")):
            host = headers.get("host", "")[:100]
            log.info("refused a request for host %r (not in server.allowed_hosts)", host)
            message = (f"this server does not answer to the host {host!r}; list it in server.allowed_hosts "
                       "(a guard against DNS rebinding)")
            if scope["type"] == "http":
                return await _respond(send, 400, _error("host_not_allowed", message))
            return await _refuse_upgrade(scope, receive, send, message)
        if scope["type"] == "http":
            await self._http(scope, receive, send, path, headers)
        elif path in PHONE_SOCKETS:
            await self._phone_socket(scope, receive, send, headers)
        else:  # /ws, /v1/realtime, and any socket added later: guarded unless said otherwise
            await self._websocket(scope, receive, send, headers)

    async def _owner(self, path: str, headers: Headers, scope: Scope) -> tuple[str | None, bool]:
        """(the client the request's key, or its login cookie, stands for; whether it sent one). On
        POST /v1/realtime/calls an ephemeral `ek_` key is redeemed: its session goes to the route."""
        authorization = headers.get("authorization")
        cookie = cookie_parser(headers.get("cookie", "")).get(LOGIN_COOKIE) if _takes_cookie(path) else None
        owner = self.access.bearer_owner(authorization) or await self.access.cookie_owner(cookie)
        scheme, _, key = (authorization or "").partition(" ")
        if (owner is None and path == REALTIME_CALLS_PATH and scheme.lower() == "bearer"
                and key.strip().startswith(CLIENT_SECRET_PREFIX)):
            redeemed = await self.access.client_secrets.redeem(key.strip(), CLIENT_SECRET_PREFIX)
            if redeemed is not None:
                owner, scope[MINTED_SESSION] = redeemed
        tokens = QueryParams(scope.get("query_string", b"")).getlist("token") if path == WEBRTC_CALLS_PATH else []
        if owner is None and len(tokens) == 1:  # the page's one-use token, as for /ws
            owner = await self.access.session_tokens.take(tokens[0])
        return owner, bool(authorization or cookie or tokens)

    # -- HTTP ----------------------------------------------------------------------------------------

    async def _http(self, scope: Scope, receive: Receive, send: Send, path: str, headers: Headers) -> None:
        try:
            passed = await self._http_checks(scope, send, path, headers)
        except SharedStoreDown as down:
            log.info("refused %s: %s", path, down)
            return await _respond(send, 503, _error(down.code, str(down)),
                                  extra=[(b"retry-after", str(RETRY_S).encode())])
        if passed:
            body = await self._read_body(headers, receive, send)
            if body is not None:
                await self.app(scope, _replay(body, receive), send)

    async def _http_checks(self, scope: Scope, send: Send, path: str, headers: Headers) -> bool:
        """The key and the rate of an HTTP request: True when it may go on, else it was answered here."""
        address = address_of(scope)
        owner: str | None = None
        if path in (REALTIME_CALLS_PATH, WEBRTC_CALLS_PATH) and not self._origin_ok(headers):
            # a call made by a page of another site (server.allowed_origins), as a WebSocket is refused
            await _respond(send, 403, _error("origin_not_allowed", f"this origin may not make calls on {path} "
                                             "(server.allowed_origins)"))
            return False
        if (self.access.keys.required and (_needs_key(path) or path in KEY_CHECKING)) or path == "/api/login":
            blocked = await self.access.blocked_for(address)
            if blocked:
                await self._too_many_failures(send, blocked)
                return False
        if self.access.keys.required and _needs_key(path):
            owner, presented = await self._owner(path, headers, scope)
            if owner is None:
                if presented:
                    await self.access.failed(address, path)
                if (path == "/qa" or path.startswith("/qa/")) and "text/html" in headers.get("accept", ""):
                    await _respond(send, 401, LOGIN_PAGE.read_bytes(), "text/html; charset=utf-8")
                    return False
                hint = KEY_HINT + (", or log in with POST /api/login {\"key\": ...}" if _takes_cookie(path) else "")
                await _respond(send, 401, _error("unauthorized", f"{path} {hint}"),
                               extra=[(b"www-authenticate", b'Bearer realm="voice-agent"')])
                return False
        client = owner or address
        scope[CLIENT_KEY] = client
        if path in (REALTIME_CALLS_PATH, WEBRTC_CALLS_PATH, OUTBOUND_CALLS_PATH):  # a call signalled over HTTP: its
            # route takes its place in the client's count
            counter = self.key_calls if owner else self.address_calls
            scope[TAKE_CALL_SLOT] = lambda: counter.enter(client, self.server.admission_wait_s)
        if path.startswith("/v1/") or path in ("/api/login", WEBRTC_CALLS_PATH, OUTBOUND_CALLS_PATH):
            wait = await self.api_requests.take(client)
            if wait:
                retry = RateLimiter.retry_after(wait)
                message = (f"too many requests from your {'key' if owner else 'address'}: "
                           f"{self.server.max_api_requests_per_minute} a minute (server.max_api_requests_per_minute); "
                           f"retry in {retry} s")
                await _respond(send, 429, _error("rate_limited", message), extra=[(b"retry-after", retry.encode())])
                return False
        return True

    async def _too_many_failures(self, send: Send, wait: float) -> None:
        retry = RateLimiter.retry_after(wait)
        message = (f"too many wrong keys from your address: {self.server.max_auth_failures_per_minute} a minute "
                   f"(server.max_auth_failures_per_minute); retry in {retry} s")
        await _respond(send, 429, _error("too_many_failures", message), extra=[(b"retry-after", retry.encode())])

    async def _read_body(self, headers: Headers, receive: Receive, send: Send) -> Message | None:
        """The whole body as one message, or None when it was refused (413, 408) here."""
        limit = self.server.max_body_bytes
        too_big = _error("body_too_large", f"the request body is over {limit} bytes (server.max_body_bytes)")
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await _respond(send, 413, too_big)
            return None
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.server.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        return message  # the client went away: the route hears it
                    chunk: bytes = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        await _respond(send, 413, too_big)
                        return None
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        except TimeoutError:
            slow = f"the request body did not arrive within {self.server.body_timeout_s:g} s (server.body_timeout_s)"
            await _respond(send, 408, _error("body_timeout", slow), extra=[(b"connection", b"close")])
            return None

    # -- WebSocket -----------------------------------------------------------------------------------

    def _origin_ok(self, headers: Headers) -> bool:
        if origin_allowed(headers.get("origin"), headers.get("host"), self.access.allowed_origins,
                          self.access.allowed_hosts):
            return True
        log.info("refused a WebSocket from origin %r (not in server.allowed_origins)", headers.get("origin", "")[:100])
        return False

    async def _websocket(self, scope: Scope, receive: Receive, send: Send, headers: Headers) -> None:
        if not self._origin_ok(headers):
            return await _refuse_upgrade(scope, receive, send, "this origin may not open /ws (server.allowed_origins)")
        try:
            admitted = await self._admit_socket(scope, receive, send, headers)
        except SharedStoreDown as down:
            log.info("refused a WebSocket: %s", down)
            return await _accept_and_close(receive, send, CLOSE_TRY_LATER, down.reason)
        if admitted is None:
            return
        client, slot = admitted
        scope[CLIENT_KEY], scope[CLIENT_SLOT] = client, slot
        scope[RATE_LIMITS] = lambda: self._standing(client)  # a coroutine
        try:
            await self._idle_guarded(scope, receive, send, on_gone=slot.release)
        finally:
            slot.release()  # if the route has not already: the caller hung up

    async def _admit_socket(self, scope: Scope, receive: Receive, send: Send,
                            headers: Headers) -> tuple[str, Slot] | None:
        """The socket's client and its place in the client's count; None when it was refused here."""
        address = address_of(scope)
        owner: str | None = None
        if self.access.keys.required:
            blocked = await self.access.blocked_for(address)
            if blocked:
                reason = (f"too many wrong keys from your address (server.max_auth_failures_per_minute); retry in "
                          f"{RateLimiter.retry_after(blocked)} s")
                await _accept_and_close(receive, send, CLOSE_TRY_LATER, reason)
                return None
            tokens = QueryParams(scope.get("query_string", b"")).getlist("token")
            owner = self.access.bearer_owner(headers.get("authorization"))
            if owner is None and len(tokens) == 1:
                owner = await self.access.session_tokens.take(tokens[0])
            realtime_key = socket_key(headers) if get_route_path(scope) == REALTIME_PATH else None
            if owner is None and realtime_key and realtime_key.startswith(CLIENT_SECRET_PREFIX):
                redeemed = await self.access.client_secrets.redeem(realtime_key, CLIENT_SECRET_PREFIX)
                if redeemed is not None:  # the session the key was minted with, for the route
                    owner, scope[MINTED_SESSION] = redeemed
            elif owner is None and realtime_key:
                owner = self.access.keys.identify(realtime_key)
            if owner is None:
                if headers.get("authorization") or tokens or realtime_key:
                    await self.access.failed(address, get_route_path(scope))
                await _accept_and_close(receive, send, CLOSE_POLICY, WS_KEY_HINT)
                return None
        client = owner or address
        wait = await self.connections.take(client)
        if wait:
            reason = (f"too many new connections: {self.server.max_connections_per_minute} a minute "
                      f"(server.max_connections_per_minute); retry in {RateLimiter.retry_after(wait)} s")
            await _accept_and_close(receive, send, CLOSE_TRY_LATER, reason)
            return None
        slot = await (self.key_calls if owner else self.address_calls).enter(client, self.server.admission_wait_s)
        if slot is None:
            waited = f"; none ended within {self.server.admission_wait_s:g} s"  # a close reason: <= 123 bytes
            reason = (f"too many calls in progress with your key: {self.server.max_calls_per_key} "
                      f"(server.max_calls_per_key){waited}" if owner else
                      f"too many calls in progress from your address: {self.server.max_calls_per_client} "
                      f"(server.max_calls_per_client){waited}")
            await _accept_and_close(receive, send, CLOSE_TRY_LATER, reason)
            return None
        return client, slot

    async def _standing(self, client: str) -> list[dict[str, Any]]:
        """The client's limits as the Realtime API's rate_limits: `requests` is the new connections it
        may open a minute (server.max_connections_per_minute), with what it has left now."""
        remaining, reset = await self.connections.standing(client)
        return [{"name": "requests", "limit": self.server.max_connections_per_minute, "remaining": remaining,
                 "reset_seconds": round(reset, 3)}]

    async def _phone_socket(self, scope: Scope, receive: Receive, send: Send, headers: Headers) -> None:
        if not self._origin_ok(headers):
            return await _refuse_upgrade(scope, receive, send, "this origin may not open a media socket")
        address = address_of(scope)
        try:
            wait = await self.phone_connections.take(address)
        except SharedStoreDown as down:
            log.warning("refused a media socket from %s: %s", address, down)
            return await _accept_and_close(receive, send, CLOSE_TRY_LATER, down.reason)
        if wait:
            log.warning("refused a media socket from %s: over phone.max_connections_per_minute", address)
            reason = (f"too many new media sockets: {self.phone_connections.capacity:.0f} a minute "
                      f"(phone.max_connections_per_minute); retry in {RateLimiter.retry_after(wait)} s")
            return await _accept_and_close(receive, send, CLOSE_TRY_LATER, reason)
        scope[CLIENT_KEY] = address
        await self._idle_guarded(scope, receive, send)

    async def _idle_guarded(self, scope: Scope, receive: Receive, send: Send,
                            on_gone: Callable[[], None] | None = None) -> None:
        idle = IdleSocket(receive, send, self.server.idle_timeout_s, on_gone)
        await self.app(scope, idle.receive, idle.send)


def socket_key(headers: Headers) -> str | None:
    """The key a Realtime client opened its socket with: `Authorization: Bearer`, or, from a browser
    (which cannot set headers), the `openai-insecure-api-key.<key>` subprotocol."""
    scheme, _, value = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    for protocol in headers.get("sec-websocket-protocol", "").split(","):
        if protocol.strip().startswith(KEY_PROTOCOL):
            return protocol.strip()[len(KEY_PROTOCOL):] or None
    return None


def rate_limits(scope: Any) -> Callable[[], Awaitable[list[dict[str, Any]]]] | None:
    """What the guard left to ask for the socket's client's limits (None: the guard did not see it)."""
    standing = scope.get(RATE_LIMITS) if isinstance(scope, dict) else None
    return standing if callable(standing) else None


def client_slot(scope: Scope) -> Slot | None:
    """The call's place in its client's count, left by the guard, for the route to give back."""
    slot = scope.get(CLIENT_SLOT)
    return slot if isinstance(slot, Slot) else None


def _replay(body: Message, receive: Receive) -> Receive:
    """The body read here first, then whatever the server says next (a disconnect)."""
    pending: list[Message] = [body]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed


async def _refuse_upgrade(scope: Scope, receive: Receive, send: Send, message: str) -> None:
    """403 before the upgrade, with a JSON body where the server can send one."""
    await receive()  # websocket.connect
    if "websocket.http.response" in scope.get("extensions", {}):
        body = _error("forbidden", message)
        await send({"type": "websocket.http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": CLOSE_POLICY})  # before accept: the server says 403


async def _accept_and_close(receive: Receive, send: Send, code: int, reason: str) -> None:
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.close", "code": code, "reason": reason})


class IdleSocket:
    """Closes a WebSocket that sends nothing for `timeout_s`; the route then hears a disconnect,
    and what it sends after that is dropped. `on_gone` is called the moment the caller's disconnect
    passes through (the client's place in its count is given back there, before the route's clean-up)."""

    def __init__(self, receive: Receive, send: Send, timeout_s: float,
                 on_gone: Callable[[], None] | None = None) -> None:
        self._receive = receive
        self._send = send
        self.timeout_s = timeout_s
        self.on_gone = on_gone
        self.closed = False

    async def receive(self) -> Message:
        if self.closed:
            return {"type": "websocket.disconnect", "code": CLOSE_GOING_AWAY}
        try:
            async with asyncio.timeout(self.timeout_s):
                message = await self._receive()
            if message["type"] == "websocket.disconnect" and self.on_gone is not None:
                self.on_gone()
            return message
        except TimeoutError:
            if self.closed:
                return {"type": "websocket.disconnect", "code": CLOSE_GOING_AWAY}
            self.closed = True
            reason = f"idle: nothing received for {self.timeout_s:g} s (server.idle_timeout_s)"
            log.info("closed a WebSocket: %s", reason)
            await self._send({"type": "websocket.close", "code": CLOSE_GOING_AWAY, "reason": reason})
            return {"type": "websocket.disconnect", "code": CLOSE_GOING_AWAY, "reason": reason}

    async def send(self, message: Any) -> None:
        if not self.closed:
            await self._send(message)
