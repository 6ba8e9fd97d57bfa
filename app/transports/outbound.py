"""Calls the service places (docs/sip.md#calls-out): `POST /api/calls/outbound` with the number or
SIP URI, the transport (SIP through the trunk; Twilio's and Telnyx's REST APIs), the call's
instructions and first message, and why it is placed. The call runs on the call runner like one
that came in; its record keeps who placed it and why (the call's `settings.placed`).

    POST /api/calls/outbound      -> 201 {"id": "out_...", "status": "dialing", ...}
    GET  /api/calls/outbound/{id} -> the placed call as it stands: dialing, ringing, answered,
                                     ended (with the reason) or failed (with the status)

The route needs a key (server.api_keys) even where the rest of the API is open: placing calls costs
money and reaches strangers. A key's calls count against server.max_calls_per_key, its requests
against server.max_api_requests_per_minute. What a replica placed, it reports (the record of the
call itself is in the shared call store once answered)."""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.admission import not_ready
from app.redact import mask_number
from app.runtime import Runtime
from app.security.guard import CLIENT_KEY, OUTBOUND_CALLS_PATH, TAKE_CALL_SLOT
from app.store import utc_now
from app.transports.answering_machine import Verdict
from app.transports.phone.dial import PhoneDialer
from app.transports.phone.errors import DialError
from app.transports.screen import Screen
from app.transports.sip.calls import SipCalls

log = logging.getLogger(__name__)
router = APIRouter(tags=["outbound calls"])
KEPT = 1000  # placed calls remembered per replica (the oldest finished ones are forgotten first)


class OutboundRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    to: str = Field(min_length=1, max_length=200, description="a number (through the trunk) or a SIP URI")
    transport: Literal["sip", "twilio", "telnyx"] = "sip"
    instructions: str | None = Field(None, max_length=8000, description="the call's system prompt")
    first_message: str | None = Field(None, max_length=1000, description="said as is when the call is answered")
    reason: str | None = Field(None, max_length=500, description="why the call is placed (kept in its record)")
    ring_timeout_s: float = Field(30.0, ge=5, le=120, description="how long it rings before it is given up")
    answering_machine: Literal["off", "hang_up", "leave_message"] = Field(
        "off", description="tell a person from a machine before the first word: on a machine, hang up or leave "
        "`voicemail_message` after its beep")
    voicemail_message: str | None = Field(None, max_length=1000, description="said to a machine after its beep")


@dataclass
class PlacedCall:
    id: str
    to: str  # masked in what the API returns (a number is a caller's data)
    transport: str
    placed_by: str
    reason: str | None
    status: str = "dialing"  # dialing, ringing, answered, ended, failed
    detail: str = ""  # the SIP status, the end reason
    created_at: str = field(default_factory=lambda: utc_now().isoformat())
    call_id: str | None = None  # the call's record (GET /api/calls/{call_id}) once answered
    answered_by: str | None = None  # "human" or "machine", where answering_machine is on
    machine_detection: dict[str, Any] | None = None  # how it was decided: {"at_s", "why"}

    def shown(self) -> dict[str, Any]:
        return {**asdict(self), "to": mask_number(self.to)}


class PlacedCalls:
    """The calls this replica placed, newest last, at most KEPT."""

    def __init__(self) -> None:
        self.calls: OrderedDict[str, PlacedCall] = OrderedDict()

    def add(self, call: PlacedCall) -> None:
        self.calls[call.id] = call
        while len(self.calls) > KEPT:
            oldest = next((k for k, c in self.calls.items() if c.status in ("ended", "failed")), None)
            if oldest is None:
                break
            del self.calls[oldest]


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def placed_calls(request: Request) -> PlacedCalls:
    placed: PlacedCalls = request.app.state.placed_calls  # made with the app (app/main.py)
    return placed


@router.post(OUTBOUND_CALLS_PATH, status_code=201, response_model=None)
async def place_call(request: Request) -> JSONResponse:
    runtime: Runtime = request.app.state.runtime
    if not request.app.state.access.keys.required:
        return _error(403, "keys_required", "placing calls needs server.api_keys set (and a key sent): without "
                      "keys anyone who reaches the server could phone anyone")
    try:
        order = OutboundRequest.model_validate_json(await request.body())
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        return _error(400, "invalid_request", f"{where}: {first['msg']}")
    if order.answering_machine == "leave_message" and not order.voicemail_message:
        return _error(400, "invalid_request", "voicemail_message: required with answering_machine leave_message")
    sip: SipCalls | None = getattr(request.app.state, "sip", None)
    dialer: PhoneDialer = request.app.state.phone_dialer
    if order.transport == "sip":
        if sip is None:
            return _error(409, "sip_disabled", "SIP is off on this server (sip.enabled)")
        try:
            sip.target(order.to)
        except ValueError as exc:
            return _error(400, "bad_destination", str(exc))
    else:
        missing = dialer.unready(order.transport)
        if missing is not None:
            return _error(409, f"{order.transport}_not_configured", missing)
    take = request.scope.get(TAKE_CALL_SLOT)
    slot = await take() if take is not None else None
    if take is not None and slot is None:
        limits = runtime.settings.server
        return _error(429, "too_many_calls", f"too many calls in progress from your key (server.max_calls_per_key "
                      f"{limits.max_calls_per_key}); wait for one to end")
    owner = str(request.scope.get(CLIENT_KEY, ""))
    record = PlacedCall(f"out_{uuid.uuid4().hex[:16]}", order.to, order.transport, owner, order.reason)
    placed = {"id": record.id, "by": owner, "reason": order.reason, "to": mask_number(order.to),
              "transport": order.transport}

    def on_state(state: str, detail: str) -> None:
        record.status, record.detail = state, detail
        log.info("outbound %s to %s: %s%s", record.id, mask_number(order.to), state, f" ({detail})" if detail else "")
        if state in ("ended", "failed") and slot is not None:
            slot.release()

    def on_verdict(verdict: Verdict) -> None:
        record.answered_by = verdict.kind
        record.machine_detection = {"at_s": verdict.at_s, "why": verdict.why}

    try:
        if sip is not None and order.transport == "sip":
            session_id = await sip.place(order.to, first_message=order.first_message, instructions=order.instructions,
                                         placed=placed, on_state=on_state, ring_timeout_s=order.ring_timeout_s,
                                         machine=order.answering_machine, voicemail_message=order.voicemail_message,
                                         on_verdict=on_verdict)
        else:
            screen = None
            if order.answering_machine != "off":
                if runtime.backends is None:
                    refused = not_ready(runtime)
                    if slot is not None:
                        slot.release()
                    return _error(503, refused.code, refused.message)
                screen = Screen(runtime.backends, runtime.settings.machine_detection, order.answering_machine,
                                order.voicemail_message, on_verdict)
            line = await dialer.place(order.transport, order.to, first_message=order.first_message,
                                      instructions=order.instructions, placed=placed, on_state=on_state,
                                      ring_timeout_s=order.ring_timeout_s, screen=screen)
            session_id = line.session_id
    except (ValueError, OSError) as exc:
        if slot is not None:
            slot.release()
        return _error(503, "call_refused", f"the call could not be placed: {exc}")
    except DialError as exc:
        if slot is not None:
            slot.release()
        return _error(exc.status, exc.code, f"the call could not be placed: {exc}")
    except BaseException:
        if slot is not None:
            slot.release()
        raise
    record.call_id = session_id
    placed_calls(request).add(record)
    log.info("outbound %s: %s calls %s over %s (%s)", record.id, owner or "?", mask_number(order.to), order.transport,
             order.reason or "no reason given")
    return JSONResponse(record.shown(), status_code=201)


@router.get(OUTBOUND_CALLS_PATH + "/{call_id}", response_model=None)
async def placed_call(call_id: str, request: Request) -> JSONResponse:
    record = placed_calls(request).calls.get(call_id)
    if record is None:
        return _error(404, "not_found", f"no call {call_id[:40]!r} was placed from this replica")
    return JSONResponse(record.shown())
