"""The guard in front of every route, as plain ASGI middleware (docs/security.md).

HTTP: `/v1` requests (and login attempts) are rate-limited per client (429 + Retry-After); `/v1`,
`/api`, `/qa` and `/metrics` need `Authorization: Bearer <key>` when keys are set (`/api` and `/qa`
also take the login cookie); the body is read here, whole, before any route sees it: larger than
server.max_body_bytes is 413, slower than server.body_timeout_s is 408.

WebSocket `/ws`: a browser Origin that is not allowed is refused before the upgrade (403); too many
new connections or calls in progress from one client is accepted and closed with 1013 and a reason;
a missing key (Bearer header, or a one-use `?token=`) is accepted and closed with 1008 and a reason,
so that a browser can read why. A connection that sends nothing for server.idle_timeout_s is closed
(1001). The phone routes keep their own signature checks and are not guarded here, but for the body
limits."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.access import LOGIN_COOKIE, Access, origin_allowed
from app.limits import CallCounter, RateLimiter, client_address
from app.settings import ServerConfig
from core.clock import Clock

log = logging.getLogger(__name__)

CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CLOSE_TRY_LATER = 1013
OPEN_PATHS = frozenset({"/api/auth", "/api/login", "/api/logout"})
LOGIN_PAGE = Path(__file__).parent / "static" / "login.html"
KEY_HINT = "send Authorization: Bearer <key> (a key from server.api_keys)"
WS_KEY_HINT = "needs a key: Authorization: Bearer <key>, or ?token= from POST /api/session-token"


def _needs_key(path: str) -> bool:
    return (path in ("/metrics", "/qa", "/ws") or path.startswith(("/v1/", "/api/", "/qa/"))) \
        and path not in OPEN_PATHS


def _takes_cookie(path: str) -> bool:
    return path == "/qa" or path.startswith(("/qa/", "/api/"))


def _headers(scope: Scope) -> dict[str, str]:
    return {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope.get("headers", [])}


def _cookie(headers: dict[str, str], name: str) -> str | None:
    for part in headers.get("cookie", "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


async def _respond(send: Send, status: int, body: bytes, content_type: str = "application/json",
                   extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})


def _error(code: str, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}).encode()


class Guard:
    def __init__(self, app: ASGIApp, access: Access, server: ServerConfig, clock: Clock) -> None:
        self.app = app
        self.access = access
        self.server = server
        self.api_requests = RateLimiter(server.max_api_requests_per_minute, clock)
        self.connections = RateLimiter(server.max_connections_per_minute, clock)
        self.calls = CallCounter(server.max_calls_per_client)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "websocket" and scope["path"] == "/ws":
            await self._websocket(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    def _client(self, scope: Scope, headers: dict[str, str]) -> str:
        peer = scope["client"][0] if scope.get("client") else "unknown"
        return client_address(peer, headers.get("x-forwarded-for"), self.access.trusted_proxies)

    def _authorized(self, path: str, headers: dict[str, str]) -> bool:
        if not self.access.keys.required or not _needs_key(path):
            return True
        if self.access.bearer_ok(headers.get("authorization")):
            return True
        return _takes_cookie(path) and self.access.cookie_ok(_cookie(headers, LOGIN_COOKIE))

    # -- HTTP ----------------------------------------------------------------------------------------

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        headers = _headers(scope)
        if path.startswith("/v1/") or path == "/api/login":
            wait = self.api_requests.take(self._client(scope, headers))
            if wait:
                retry = RateLimiter.retry_after(wait)
                message = (f"too many requests from your address: {self.server.max_api_requests_per_minute} a "
                           f"minute (server.max_api_requests_per_minute); retry in {retry} s")
                return await _respond(send, 429, _error("rate_limited", message), extra=[(b"retry-after",
                                                                                          retry.encode())])
        if not self._authorized(path, headers):
            if (path == "/qa" or path.startswith("/qa/")) and "text/html" in headers.get("accept", ""):
                return await _respond(send, 401, LOGIN_PAGE.read_bytes(), "text/html; charset=utf-8")
            hint = KEY_HINT + (", or log in with POST /api/login {\"key\": ...}" if _takes_cookie(path) else "")
            return await _respond(send, 401, _error("unauthorized", f"{path} {hint}"),
                                  extra=[(b"www-authenticate", b'Bearer realm="voice-agent"')])
        body = await self._read_body(headers, receive, send)
        if body is not None:
            await self.app(scope, _replay(body, receive), send)

    async def _read_body(self, headers: dict[str, str], receive: Receive, send: Send) -> Message | None:
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

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope)
        client = self._client(scope, headers)
        if not origin_allowed(headers.get("origin"), headers.get("host"), self.access.allowed_origins):
            log.info("refused /ws from origin %r (not in server.allowed_origins)", headers.get("origin"))
            return await _refuse_upgrade(scope, receive, send, "this origin may not open /ws "
                                         "(server.allowed_origins)")
        wait = self.connections.take(client)
        if wait:
            reason = (f"too many new connections: {self.server.max_connections_per_minute} a minute "
                      f"(server.max_connections_per_minute); retry in {RateLimiter.retry_after(wait)} s")
            return await _accept_and_close(receive, send, CLOSE_TRY_LATER, reason)
        if self.access.keys.required and not self._ws_key_ok(scope, headers):
            return await _accept_and_close(receive, send, CLOSE_POLICY, WS_KEY_HINT)
        if not self.calls.enter(client):
            reason = (f"too many calls in progress from your address: {self.server.max_calls_per_client} "
                      "(server.max_calls_per_client)")
            return await _accept_and_close(receive, send, CLOSE_TRY_LATER, reason)
        try:
            idle = IdleSocket(receive, send, self.server.idle_timeout_s)
            await self.app(scope, idle.receive, idle.send)
        finally:
            self.calls.leave(client)

    def _ws_key_ok(self, scope: Scope, headers: dict[str, str]) -> bool:
        if self.access.bearer_ok(headers.get("authorization")):
            return True
        tokens = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token", [])
        return len(tokens) == 1 and self.access.session_tokens.take(tokens[0])


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
    and what it sends after that is dropped."""

    def __init__(self, receive: Receive, send: Send, timeout_s: float) -> None:
        self._receive = receive
        self._send = send
        self.timeout_s = timeout_s
        self.closed = False

    async def receive(self) -> Message:
        if self.closed:
            return {"type": "websocket.disconnect", "code": CLOSE_GOING_AWAY}
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._receive()
        except TimeoutError:
            if self.closed:
                return {"type": "websocket.disconnect", "code": CLOSE_GOING_AWAY}
            self.closed = True
            reason = f"idle: nothing received for {self.timeout_s:g} s (server.idle_timeout_s)"
            log.info("closed a /ws connection: %s", reason)
            await self._send({"type": "websocket.close", "code": CLOSE_GOING_AWAY, "reason": reason})
            return {"type": "websocket.disconnect", "code": CLOSE_GOING_AWAY, "reason": reason}

    async def send(self, message: Any) -> None:
        if not self.closed:
            await self._send(message)
