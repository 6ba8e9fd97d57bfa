"""Twilio: the voice webhook that answers a call with TwiML, and the Media Streams socket
(docs/phone.md). Both check X-Twilio-Signature with the official `twilio` package.

    POST /twilio/voice   (the number's "A call comes in" webhook) -> <Connect><Stream url="wss://.../twilio/media">
    GET  /twilio/media   (WebSocket) -> app/transports/phone/wire.py
    POST /twilio/status  (a call placed out: its status callback) -> app/transports/phone/dial.py

Signatures cover the URL Twilio called, which a proxy or a tunnel hides from the request, so it
comes from `twilio.public_url`: the webhook's is public_url + path (+ query), over the sorted POST
parameters; the socket's is public_url in its ws(s) form + path, over no parameters.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import Response
from twilio.request_validator import SIGNATURE_SETTINGS_HEADER, RequestValidator, get_signature_algorithm
from twilio.twiml.voice_response import Connect, Dial, VoiceResponse

from app.redact import mask_number
from app.runtime import Runtime
from app.settings import Settings, TwilioConfig
from app.transports.phone.messages import TWILIO
from app.transports.phone.wire import NONCE_PARAMETER, deny, serve_call

log = logging.getLogger(__name__)
router = APIRouter()

VOICE_PATH = "/twilio/voice"
MEDIA_PATH = "/twilio/media"
STATUS_PATH = "/twilio/status"
SIGNATURE_HEADER = "X-Twilio-Signature"
CALL_PARAMETERS = ("CallSid", "From", "To")  # webhook fields handed to the stream as <Parameter>s


def stream_url(public_url: str) -> str:
    """The media socket's URL: the public URL with its scheme turned into wss (ws for http)."""
    base = public_url.rstrip("/")
    if base.startswith("https://"):
        base = "wss://" + base.removeprefix("https://")
    elif base.startswith("http://"):
        base = "ws://" + base.removeprefix("http://")
    return base + MEDIA_PATH


def twiml(url: str, parameters: Mapping[str, str]) -> str:
    """<Response><Connect><Stream url=...><Parameter .../>...</Stream></Connect></Response>: the call's
    audio goes both ways over the socket; call data rides as Parameters (Twilio refuses a query
    string in the Stream URL). The twilio package escapes the XML."""
    response = VoiceResponse()
    connect = Connect()
    stream = connect.stream(url=url)
    for name, value in parameters.items():
        stream.parameter(name=name, value=value)
    response.append(connect)
    return str(response)


def dial_twiml(destination: str) -> str:
    """<Response><Dial>...</Dial></Response>: hand the call to a number, or to a SIP URI (<Sip>)."""
    response = VoiceResponse()
    dial = Dial()
    if destination.startswith(("sip:", "sips:")):
        dial.sip(destination)
    else:
        dial.number(destination)
    response.append(dial)
    return str(response)


def signature_ok(config: TwilioConfig, url: str, params: Mapping[str, Any], headers: Mapping[str, str]) -> bool:
    """Whether X-Twilio-Signature is the HMAC of `url` and `params`. The hash is SHA-1 keyed by the
    auth token, or what X-Twilio-Webhooks-Signature-Settings names (HMAC_SHA256 for a webhook rule,
    keyed by the SharedKey it names: twilio.shared_keys)."""
    signature = headers.get(SIGNATURE_HEADER.lower()) or headers.get(SIGNATURE_HEADER)
    if not signature:
        return False
    settings_header = headers.get(SIGNATURE_SETTINGS_HEADER.lower()) or headers.get(SIGNATURE_SETTINGS_HEADER)
    key_id = _key_id(settings_header)
    secret = config.shared_keys.get(key_id, config.auth_token)
    token = secret.get_secret_value()
    if not token:
        return False
    valid: bool = RequestValidator(token).validate(url, params, signature, get_signature_algorithm(settings_header))
    return valid


def _key_id(settings_header: str | None) -> str:
    for part in (settings_header or "").split(","):
        name, _, value = part.partition("=")
        if name.strip() == "key":
            return value.strip()
    return ""


def configured(config: TwilioConfig) -> bool:
    return bool(config.public_url and config.auth_token.get_secret_value())


def log_setup(settings: Settings) -> None:
    """At start-up: say whether Twilio calls can come in, and how to make them."""
    config = settings.twilio
    if not config.check_signatures:
        log.warning("twilio.check_signatures is off: %s and %s take unsigned requests from anyone; for local "
                    "testing only", VOICE_PATH, MEDIA_PATH)
    elif not configured(config):
        log.info("Twilio calls are refused (403) until twilio.auth_token and twilio.public_url are set "
                 "(VOICE_AGENT_TWILIO__AUTH_TOKEN, VOICE_AGENT_TWILIO__PUBLIC_URL; see docs/phone.md)")
    else:
        log.info("Twilio: the number's voice webhook is %s%s; calls stream to %s", config.public_url.rstrip("/"),
                 VOICE_PATH, stream_url(config.public_url))


async def signed_form(request: Request, path: str) -> dict[str, str] | Response:
    """A webhook's form fields, once its size and X-Twilio-Signature are checked (the signature over
    public_url + path + query and every posted value); else the refusal to answer (413 or 403)."""
    runtime: Runtime = request.app.state.runtime
    config = runtime.settings.twilio
    if len(await request.body()) > runtime.settings.phone.max_frame_bytes:
        return Response(status_code=413)
    form = await request.form()
    if config.check_signatures:
        url = config.public_url.rstrip("/") + path + (f"?{request.url.query}" if request.url.query else "")
        if not configured(config) or not signature_ok(config, url, form, request.headers):
            runtime.metrics.error("bad_signature")
            log.warning("%s: refused a request without a valid %s", path, SIGNATURE_HEADER)
            return Response(status_code=403)
    return {name: value for name, value in form.items() if isinstance(value, str)}


@router.post(VOICE_PATH, include_in_schema=False)
async def voice_webhook(request: Request) -> Response:
    """Answers a call with TwiML that streams it here. The stream's <Parameter>s carry the call's
    fields and a one-use nonce (twilio.stream_nonce_ttl_s) that its `start` must hand back: the
    socket's own signature covers only the fixed stream URL, so without the nonce one captured
    stream could be replayed forever."""
    runtime: Runtime = request.app.state.runtime
    config = runtime.settings.twilio
    fields = await signed_form(request, VOICE_PATH)
    if isinstance(fields, Response):
        return fields
    public = config.public_url.rstrip("/")
    # unchecked (local testing) and no public URL: the stream is on the host the request came to
    url = stream_url(public or str(request.base_url))
    parameters = {name: fields[name] for name in CALL_PARAMETERS if name in fields}
    parameters[NONCE_PARAMETER] = runtime.stream_nonces.issue(owner=fields.get("CallSid", ""))
    log.info("twilio %s: incoming call from %s; streaming to %s", fields.get("CallSid", "?"),
             mask_number(fields.get("From")), url)
    return Response(twiml(url, parameters), media_type="text/xml")


@router.websocket(MEDIA_PATH)
async def media_socket(websocket: WebSocket) -> None:
    runtime: Runtime = websocket.app.state.runtime
    config = runtime.settings.twilio
    if config.check_signatures and not (configured(config) and signature_ok(
            config, stream_url(config.public_url), {}, websocket.headers)):
        runtime.metrics.error("bad_signature")
        log.warning("%s: refused a connection without a valid %s", MEDIA_PATH, SIGNATURE_HEADER)
        await deny(websocket)
        return
    await serve_call(websocket, TWILIO)


@router.post(STATUS_PATH, include_in_schema=False)
async def status_callback(request: Request) -> Response:
    """A call placed out (app/transports/phone/dial.py) rings, or ends before its stream started:
    Twilio's signed status callback, `?placed=<the call's id>`."""
    fields = await signed_form(request, STATUS_PATH)
    if isinstance(fields, Response):
        return fields
    placed = request.query_params.get("placed", "")
    status = fields.get("CallStatus", "")
    detail = f"SIP {fields['SipResponseCode']}" if fields.get("SipResponseCode") else ""
    log.info("twilio %s: call %s is %s", fields.get("CallSid", "?"), placed[:40] or "?", status or "?")
    if not request.app.state.phone_dialer.status(placed, status, detail):
        log.info("%s: call %r was not placed from this replica (or has ended)", STATUS_PATH, placed[:40])
    return Response(status_code=204)
