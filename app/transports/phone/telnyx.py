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

`POST /telnyx/events` takes the Call Control webhooks of the calls placed out here (the Dial
command names it, app/transports/phone/dial.py): a callee who is busy or does not answer, or a
stream Telnyx could not open, ends the call at once instead of after its ring timeout. Each
webhook is signed with the account's Ed25519 key: `telnyx-signature-ed25519` is the base64
signature of `<telnyx-timestamp>|<the raw body>`, checked with `telnyx.public_key`, and a
timestamp further than `telnyx.webhook_tolerance_s` from this server's clock is refused (a replay).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse, Response
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
EVENTS_PATH = "/telnyx/events"
SIGNATURE_HEADER = "telnyx-signature-ed25519"
TIMESTAMP_HEADER = "telnyx-timestamp"


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
    if not config.check_signatures:
        log.warning("telnyx.check_signatures is off: %s takes unsigned webhooks from anyone; for local testing only",
                    EVENTS_PATH)
    elif config.api_key.get_secret_value() and not config.public_key:
        log.info("Telnyx calls out ask for no webhooks until telnyx.public_key is set "
                 "(VOICE_AGENT_TELNYX__PUBLIC_KEY): a busy or unanswered callee is seen only at the ring timeout "
                 "(see docs/phone.md)")
    if config.allow_static_token and config.check_token and config.stream_token.get_secret_value():
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


def signature_ok(public_key: str, headers: Mapping[str, str], body: bytes, now: float, tolerance_s: float) -> bool:
    """Whether `body` came from Telnyx: its Ed25519 signature over "<timestamp>|<body>" checks out
    with the account's public key, and its timestamp lies within `tolerance_s` of `now`."""
    stamp = headers.get(TIMESTAMP_HEADER, "")
    if not public_key or not (stamp.isascii() and stamp.isdigit() and len(stamp) <= 12):  # (Unix seconds)
        return False
    if abs(now - int(stamp)) > tolerance_s:
        return False
    try:
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key, validate=True))
        key.verify(base64.b64decode(headers.get(SIGNATURE_HEADER, ""), validate=True), stamp.encode() + b"|" + body)
    except (ValueError, InvalidSignature):
        return False
    return True


def placed_id(client_state: Any) -> str:
    """The id of the call placed out that a webhook is about: the Dial command's client_state
    (base64 of the id), or "" if it carries none of ours."""
    try:
        return base64.b64decode(str(client_state or ""), validate=True).decode("ascii")
    except ValueError:
        return ""


@router.post(EVENTS_PATH, include_in_schema=False)
async def events(request: Request) -> Response:
    """A Call Control webhook of a call placed out (`call.hangup` while it rings, `streaming.failed`):
    the dialer ends the call with Telnyx's reason. Other events, and those of calls this replica
    did not place, are acknowledged (200: Telnyx would retry anything else) and left alone."""
    runtime: Runtime = request.app.state.runtime
    config = runtime.settings.telnyx
    body = await request.body()
    if len(body) > runtime.settings.phone.max_frame_bytes:
        return Response(status_code=413)
    if config.check_signatures and not signature_ok(config.public_key, request.headers, body, runtime.clock.wall(),
                                                    config.webhook_tolerance_s):
        runtime.metrics.error("bad_signature")
        log.warning("%s: refused a webhook without a valid %s (forged, stale, or telnyx.public_key %s)", EVENTS_PATH,
                    SIGNATURE_HEADER, "is not the account's" if config.public_key else "is not set")
        return Response(status_code=403)
    try:
        data = json.loads(body)["data"]
        event_type, payload = str(data["event_type"]), data.get("payload") or {}
        if not isinstance(payload, dict):
            raise TypeError("payload")
    except (ValueError, KeyError, TypeError) as exc:
        return JSONResponse({"error": {"code": "bad_event", "message": f"not a Telnyx webhook ({type(exc).__name__}: "
                                       f"{str(exc)[:80]}): expected {{\"data\": {{\"event_type\", \"payload\"}}}}"}},
                            status_code=400)
    ident, call_id = placed_id(payload.get("client_state")), str(payload.get("call_control_id") or "")
    log.info("telnyx %s: %s (call %s)", call_id or "?", event_type, ident[:40] or "?")
    if not request.app.state.phone_dialer.telnyx_event(ident, call_id, event_type, payload):
        log.info("%s: call %r was not placed from this replica (or has ended)", EVENTS_PATH, ident[:40] or call_id[:40])
    return Response(status_code=200)
