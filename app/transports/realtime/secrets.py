"""`POST /v1/realtime/client_secrets`: a short-lived, one-use key for a browser, as OpenAI's ephemeral
keys are. The server's own key stays on the server; the browser opens /v1/realtime with
`Authorization: Bearer ek_...` or the `openai-insecure-api-key.ek_...` subprotocol, and its session
starts with the settings the key was minted with. The guard (app/security/guard.py) checked the
request's own key, as for every /v1 route."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.runtime import Runtime
from app.security.access import CLIENT_SECRET_MAX_TTL_S, Access, client_of
from app.transports.realtime.messages import Dialect, RealtimeError, error_event
from app.transports.realtime.settings import RealtimeSettings

router = APIRouter()
DEFAULT_TTL_S = 600  # OpenAI's default for an ephemeral key


def _refuse(message: str, param: str | None, code: str = "invalid_value") -> JSONResponse:
    body = error_event(Dialect(beta=False), code, message, param=param)
    return JSONResponse({"error": body["error"]}, status_code=400)


@router.post("/v1/realtime/client_secrets", response_model=None)
async def client_secrets(request: Request) -> JSONResponse:
    runtime: Runtime = request.app.state.runtime
    access: Access = request.app.state.access
    try:
        body: Any = await request.json() if await request.body() else {}
    except ValueError:
        return _refuse("the body is not JSON", None, "invalid_json")
    if not isinstance(body, dict):
        return _refuse("the body must be a JSON object", None)
    expires = body.get("expires_after") or {}
    seconds = expires.get("seconds", DEFAULT_TTL_S) if isinstance(expires, dict) else None
    if not isinstance(seconds, int) or isinstance(seconds, bool) or not 10 <= seconds <= CLIENT_SECRET_MAX_TTL_S:
        return _refuse(f"expires_after.seconds must be a whole number from 10 to {CLIENT_SECRET_MAX_TTL_S}",
                       "expires_after.seconds")
    if isinstance(expires, dict) and expires.get("anchor", "created_at") != "created_at":
        return _refuse("expires_after.anchor must be 'created_at'", "expires_after.anchor")
    session = body.get("session") or {"type": "realtime"}
    try:
        settings = RealtimeSettings(model=runtime.settings.llm.model).updated(session, beta=False)
    except RealtimeError as exc:
        return _refuse(str(exc), exc.param, exc.code)
    secret = access.mint_client_secret(client_of(request.scope), seconds, session)
    return JSONResponse({"value": secret, "expires_at": int(time.time()) + seconds, "session": settings.as_ga()})
