"""Telnyx media streaming: `GET /telnyx/media` (WebSocket), the same call as Twilio's (app/transports/phone/wire.py)
in Telnyx's snake_case frames with PCMU audio (docs/phone.md).

Telnyx signs its webhooks but not the media socket, so each stream carries a token: in the stream
URL's query (`wss://HOST/telnyx/media?token=...`) or as the stream's streaming auth token (the
`x-telnyx-streaming-auth-token` header). A token is good for one connection, within
`telnyx.token_ttl_s` of being minted, and it is minted with the operator's secret
(`telnyx.stream_token`), so a stream URL seen once (in a log, a proxy, a capture) opens nothing:

    v1.<expires, Unix seconds>.<nonce>.<base64url HMAC-SHA256(secret, "v1.<expires>.<nonce>")>

The operator's call-control app asks for one per call (`POST /api/phone/telnyx-stream`, with an API
key when keys are set, answers the stream URL) or mints it itself (`app.security.phone_tokens.mint_token`, or
the format above in any language). A missing, forged, expired or used token gets 403 before the socket opens.
The query string never reaches the logs (app/redact.py).
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from app.runtime import Runtime
from app.settings import Settings
from app.transports.phone.messages import TELNYX
from app.transports.phone.wire import PLACED, deny, serve_call

log = logging.getLogger(__name__)
router = APIRouter()

MEDIA_PATH = "/telnyx/media"
TOKEN_QUERY = "token"
TOKEN_HEADER = "x-telnyx-streaming-auth-token"
def stream_url(public_url: str, token: str) -> str:
    base = public_url.rstrip("/")
    for http, ws in (("https://", "wss://"), ("http://", "ws://")):
        if base.startswith(http):
            base = ws + base.removeprefix(http)
    return f"{base}{MEDIA_PATH}?{TOKEN_QUERY}={token}"


def log_setup(settings: Settings) -> None:
    """At start-up: say whether Telnyx calls can come in, and how to make them."""
    config = settings.telnyx
    if not config.check_token:
        log.warning("telnyx.check_token is off: %s takes connections from anyone; for local testing only", MEDIA_PATH)
    elif not config.stream_token.get_secret_value():
        log.info("Telnyx calls are refused (403) until telnyx.stream_token is set (VOICE_AGENT_TELNYX__STREAM_TOKEN); "
                 "each stream then needs a token from POST /api/phone/telnyx-stream (see docs/phone.md)")
    elif config.allow_static_token:
        log.warning("telnyx.allow_static_token is on: the secret itself opens %s, again and again, for whoever saw "
                    "one stream URL; mint one-use tokens instead (docs/phone.md)", MEDIA_PATH)


class TelnyxStream(BaseModel):
    url: str
    token: str
    expires_in: int


@router.post("/api/phone/telnyx-stream", response_model=TelnyxStream)
async def new_stream(request: Request) -> TelnyxStream | JSONResponse:
    """A stream URL with a fresh one-use token, for the operator's call-control app to hand Telnyx
    (`streaming_start`'s stream_url, or the token as its stream_auth_token)."""
    runtime: Runtime = request.app.state.runtime
    config = runtime.settings.telnyx
    tokens = runtime.telnyx_tokens
    if not config.stream_token.get_secret_value():
        return JSONResponse({"error": {"code": "not_configured", "message": "set telnyx.stream_token "
                                       "(VOICE_AGENT_TELNYX__STREAM_TOKEN) first"}}, status_code=409)
    token = tokens.mint()
    return TelnyxStream(url=stream_url(config.public_url or str(request.base_url), token), token=token,
                        expires_in=int(config.token_ttl_s))


@router.websocket(MEDIA_PATH)
async def media_socket(websocket: WebSocket) -> None:
    runtime: Runtime = websocket.app.state.runtime
    config = runtime.settings.telnyx
    tokens = runtime.telnyx_tokens
    token = websocket.query_params.get(TOKEN_QUERY) or websocket.headers.get(TOKEN_HEADER)
    # a call the service placed: the stream URL it gave Telnyx carries that call's own credential
    placed = websocket.app.state.phone_dialer.waiting(websocket.query_params.get(PLACED))
    if config.check_token and placed is None and not tokens.take(token):
        runtime.metrics.error("bad_stream_token")
        log.warning("%s: refused a connection without a valid stream token (missing, forged, expired or used)",
                    MEDIA_PATH)
        await deny(websocket)
        return
    await serve_call(websocket, TELNYX)
