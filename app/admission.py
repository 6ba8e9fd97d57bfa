"""Admission: whether a new call, or a new /v1 generation, may start on this replica now. One place
for every transport (the native socket, the phone media streams, /v1/realtime), for /v1 and for the
health probes, so that they refuse alike and say the same thing.

Per-client limits (calls in progress from one key or address, connections per minute, failed keys)
are the guard's, in front of every route (app/security/guard.py); these are the replica's own.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.runtime import Runtime

CLOSE_TRY_LATER = 1013  # the WebSocket close code of a refused call


@dataclass(frozen=True)
class Refusal:
    """Why a call or a request may not start: an error code, what to tell the caller, and how to say
    it on a WebSocket (its close code) and over HTTP (its status)."""

    code: str
    message: str
    close_code: int = CLOSE_TRY_LATER
    http_status: int = 503


def not_ready(runtime: Runtime) -> Refusal:
    """Models still loading, or failed to load: said plainly, with the failure's code alone (its
    text, with model paths and URLs, is for the log and for keyed or loopback probes: app/health.py)."""
    if runtime.load_error is not None:
        return Refusal("not_ready", f"the models failed to load ({runtime.load_error_code}); the server log says why")
    return Refusal("not_ready", f"models are not loaded yet ({runtime.status}); try again shortly")


def call_refusal(runtime: Runtime, *, needs_slot: bool = True) -> Refusal | None:
    """The admission checks of a call: a draining server, models not loaded, every call slot taken
    (server.max_sessions). `needs_slot`: the call takes a slot now (a phone call takes it at its
    provider's `start`, so a socket that never starts holds none)."""
    if runtime.draining.is_set():
        return Refusal("shutting_down", "the server is shutting down; call again")
    if not runtime.ready.is_set():
        return not_ready(runtime)
    limit = runtime.settings.server.max_sessions
    if needs_slot and len(runtime.sessions) >= limit:
        return Refusal("server_busy", f"all {limit} call slots are taken; try again later")
    return None


async def admit_call(runtime: Runtime, wait_s: float) -> Refusal | None:
    """`call_refusal` for a call that takes its slot now, except that a call finding every slot taken
    waits up to `wait_s` (server.admission_wait_s) for one to be given back: a caller who hung up a
    moment ago may still hold one (the server hears the hang-up after the caller has redialled).
    None: admitted, and the caller must take the slot (`Runtime.open_session`) before its next await."""
    deadline = runtime.clock.now() + wait_s
    while True:
        refused = call_refusal(runtime)
        if refused is None or refused.code != "server_busy":
            return refused
        left = deadline - runtime.clock.now()
        if left <= 0 or not await runtime.slot_released(left):
            break
    limit = runtime.settings.server.max_sessions
    waited = f" (waited {wait_s:g} s for one, server.admission_wait_s)" if wait_s > 0 else ""
    return Refusal("server_busy", f"all {limit} call slots are taken{waited}; try again later")


def request_refusal(runtime: Runtime) -> Refusal | None:
    """The admission checks of a /v1 generation: models not loaded, a draining server, every
    generation slot taken (server.max_api_requests; 429, to be retried)."""
    if not runtime.ready.is_set() or runtime.backends is None:
        return not_ready(runtime)
    if runtime.draining.is_set():
        return Refusal("shutting_down", "the server is shutting down; try another replica or again shortly")
    limit = runtime.settings.server.max_api_requests
    if runtime.api_requests >= limit:
        return Refusal("too_many_requests",
                       f"{limit} generations are in progress (server.max_api_requests); try again shortly",
                       http_status=429)
    return None
