"""Health for a load balancer and an orchestrator (docs/deployment.md):

- `/livez`: the process is alive. 503 only when the models failed to load, which a restart may
  mend; loading and draining are alive (a replica that drains must not be killed for it).
- `/readyz`: send this replica a new call. 503 while the models load, while it drains, and while
  every call slot (server.max_sessions) is taken: the same admission checks every call passes
  (app/transports/call.py), so a balancer that follows it sends no call that would be refused.
  With server.redis_url set, it asks Redis (a PING) and says `shared_state` (up or not, and
  server.shared_state_failure); while it cannot be reached a `closed` replica is not ready (503),
  an `open` one is (its limits are then its own).
- `/healthz`: kept for compatibility: 200 once ready and until it drains, whatever the slots.

Each answers JSON with the replica's calls in progress and its slots. When the models failed to
load, `error` says why: whole (`model_fetch_failed: ...`, which may name model paths and URLs) to a
request with a valid key (Bearer or the login cookie) or from a loopback address naming a host this
server answers to; its code alone (`model_fetch_failed`) to anyone else (the server log says why).
A wrong key here counts as one anywhere (server.max_auth_failures_per_minute), so the probes are
no key oracle.

`POST /api/drain` (a key, as all of /api) drains as SIGTERM does under `voice-agent serve`: for
ASGI servers that close every WebSocket on SIGTERM (plain uvicorn, gunicorn's uvicorn workers,
hypercorn), `voice-agent drain --wait` before the signal (a Kubernetes preStop hook) lets each
call finish its reply and hear the goodbye (docs/deployment.md)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.admission import Refusal, call_refusal
from app.runtime import Runtime
from app.security.access import LOGIN_COOKIE, Access, address_of, is_loopback
from app.security.shared_store import SharedStoreDown
from app.shutdown import GRACE_S

router = APIRouter()


def _body(runtime: Runtime, status: str, detailed: bool = False) -> dict[str, object]:
    body: dict[str, object] = {"status": status, "sessions": len(runtime.sessions),
                               "max_sessions": runtime.settings.server.max_sessions}
    if runtime.load_error:
        body["error"] = runtime.load_error if detailed else runtime.load_error_code
    return body


async def _detailed(request: Request) -> bool:
    """Whether this request may read load_error whole: a valid key or login cookie (a wrong one is
    counted, as on every route), or a loopback client that names a host this server answers to (a
    web page that points its own name at 127.0.0.1 does not: DNS rebinding)."""
    runtime: Runtime = request.app.state.runtime
    if runtime.load_error is None:
        return False  # nothing to show: the answer is the same for everyone, and tells nothing of a key
    access: Access = request.app.state.access
    client = request.client
    if client is not None and is_loopback(client.host) and access.allowed_hosts.allows(request.headers.get("host")):
        return True
    authorization, cookie = request.headers.get("authorization"), request.cookies.get(LOGIN_COOKIE)
    if not access.keys.required or not (authorization or cookie):
        return False
    address = address_of(request.scope)
    try:
        if await access.blocked_for(address):
            return False  # too many wrong keys from here: no key is looked at until the minute has passed
        if access.bearer_ok(authorization) or await access.cookie_ok(cookie):
            return True
    except SharedStoreDown:  # the limit cannot be known (server.shared_state_failure=closed): the code alone
        return False
    await access.failed(address, request.url.path)
    return False


@router.get("/livez")
async def livez(request: Request) -> JSONResponse:
    runtime: Runtime = request.app.state.runtime
    failed = runtime.load_error is not None
    return JSONResponse(_body(runtime, "failed" if failed else "alive", await _detailed(request)),
                        status_code=503 if failed else 200)


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    runtime: Runtime = request.app.state.runtime
    refused = call_refusal(runtime)
    shared = runtime.shared
    shared_up = await shared.check() if shared is not None else True  # a PING: also how a closed replica sees it back
    if refused is None and not shared_up and shared is not None and shared.closed:
        refused = Refusal("shared_state_down", "the shared store (server.redis_url) cannot be reached, and calls are "
                          "refused until it answers (server.shared_state_failure=closed)")
    body = _body(runtime, "ready" if refused is None else refused.code, await _detailed(request))
    if shared is not None:  # with `open`, ready while it is down: the body says so
        body["shared_state"] = {"up": shared_up, "on_failure": shared.failure}
    if refused is not None:
        body["reason"] = refused.message
    return JSONResponse(body, status_code=200 if refused is None else 503)


@router.get("/healthz")
async def healthz(request: Request) -> JSONResponse:
    runtime: Runtime = request.app.state.runtime
    serving = runtime.ready.is_set() and not runtime.draining.is_set()  # draining: send no new calls here
    return JSONResponse(_body(runtime, runtime.status, await _detailed(request)), status_code=200 if serving else 503)


@router.post("/api/drain")
async def drain(request: Request, wait: bool = False) -> JSONResponse:
    """Stop taking calls and let those in progress finish. `wait=true` answers once none is left
    ("drained"), or with "cut" when some were still open past server.drain_timeout_s and its grace."""
    runtime: Runtime = request.app.state.runtime
    if not wait:
        runtime.begin_drain()
        return JSONResponse(_body(runtime, "draining", await _detailed(request)), status_code=202)
    drained = await runtime.drain(GRACE_S)
    return JSONResponse(_body(runtime, "drained" if drained else "cut", await _detailed(request)))
