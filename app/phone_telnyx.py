"""Telnyx media streaming: `GET /telnyx/media` (WebSocket), the same call as Twilio's (app/phone.py)
in Telnyx's snake_case frames with PCMU audio (docs/phone.md).

Telnyx signs its webhooks but not the media socket, so the socket carries a secret of the
operator's: `telnyx.stream_token`, in the stream URL's query (`wss://HOST/telnyx/media?token=...`)
or in the `x-telnyx-streaming-auth-token` header Telnyx sends when the stream has a streaming auth
token. It is compared in constant time; a missing or wrong one gets 403 before the socket opens.
"""

from __future__ import annotations

import hmac
import logging

from fastapi import APIRouter, WebSocket

from app.phone import deny, serve_call
from app.phone_wire import TELNYX
from app.runtime import Runtime
from app.settings import Settings, TelnyxConfig

log = logging.getLogger(__name__)
router = APIRouter()

MEDIA_PATH = "/telnyx/media"
TOKEN_QUERY = "token"
TOKEN_HEADER = "x-telnyx-streaming-auth-token"


def token_ok(config: TelnyxConfig, query_token: str | None, header_token: str | None) -> bool:
    expected = config.stream_token.get_secret_value().encode()
    if not expected:
        return False
    # both compared, in constant time, whichever is present
    given = [t.encode() for t in (query_token, header_token) if t]
    return any([hmac.compare_digest(t, expected) for t in given])


def log_setup(settings: Settings) -> None:
    """At start-up: say whether Telnyx calls can come in, and how to make them."""
    config = settings.telnyx
    if not config.check_token:
        log.warning("telnyx.check_token is off: %s takes connections from anyone; for local testing only", MEDIA_PATH)
    elif not config.stream_token.get_secret_value():
        log.info("Telnyx calls are refused (403) until telnyx.stream_token is set (VOICE_AGENT_TELNYX__STREAM_TOKEN) "
                 "and the stream URL carries it: wss://HOST%s?%s=TOKEN (see docs/phone.md)", MEDIA_PATH, TOKEN_QUERY)


@router.websocket(MEDIA_PATH)
async def media_socket(websocket: WebSocket) -> None:
    runtime: Runtime = websocket.app.state.runtime
    config = runtime.settings.telnyx
    if config.check_token and not token_ok(config, websocket.query_params.get(TOKEN_QUERY),
                                           websocket.headers.get(TOKEN_HEADER)):
        runtime.metrics.error("bad_stream_token")
        log.warning("%s: refused a connection without the stream token", MEDIA_PATH)
        await deny(websocket)
        return
    await serve_call(websocket, TELNYX)
