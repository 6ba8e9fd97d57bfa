"""The OpenAI Realtime API over WebRTC: `POST /v1/realtime/calls`, and the wire and the output of the
calls it answers (docs/webrtc.md).

The body is the caller's SDP offer (`Content-Type: application/sdp`), or a form with `sdp` and an
optional `session` (JSON), as OpenAI's unified interface takes; the key is the server's (Bearer) or
an ephemeral `ek_` key, whose session settings the call starts with (the guard redeems it,
app/security/guard.py). The answer is `201` with the server's SDP and `Location:
/v1/realtime/calls/{call_id}`; a call that may not start (no key, a bad offer, every slot taken)
gets OpenAI's JSON error and no SDP. The peer connection's life is app/transports/webrtc/peer.py.

The events are the WebSocket API's (app/transports/realtime/), on the `oai-events` data channel,
except the audio: the caller's comes on their track (an `input_audio_buffer.append` is refused),
and the reply's goes out on the server's track instead of `response.output_audio.delta` events, with
OpenAI's `output_audio_buffer.started`, `.stopped` and `.cleared` around it. What the caller heard is
what went out on the track, so a reply cut short keeps exactly those words without a
`conversation.item.truncate` from the client."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from app.metrics import Metrics
from app.security.guard import MINTED_SESSION
from app.transports.call import Call, SocketWriter
from app.transports.realtime.messages import Dialect, RealtimeError, error_event
from app.transports.realtime.outbound import RealtimeOutbound
from app.transports.realtime.settings import RealtimeSettings
from app.transports.realtime.wire import RealtimeWire
from app.transports.webrtc.media import ReplyTrack
from app.transports.webrtc.peer import TRACK_INPUT_RATE, OfferError, answer, check_offer
from core.errors import ConfigError
from pipeline.events import ResponseDone

log = logging.getLogger(__name__)
router = APIRouter()
PATH = "/v1/realtime/calls"
CHANNEL = "oai-events"


class RealtimeTrackOutbound(RealtimeOutbound):
    """Realtime events on the data channel; the reply's audio on `track`."""

    def __init__(self, writer: SocketWriter, dialect: Dialect, metrics: Metrics, track: ReplyTrack) -> None:
        super().__init__(writer, dialect, metrics, "pcm", track.rate)
        self.track = track
        self.playing: str | None = None  # the response whose audio is in the track's buffer
        self.watch: asyncio.Task[None] | None = None

    async def _audio(self, pcm16: bytes, turn_id: int) -> None:
        response = await self._message(turn_id)
        self.turn_sent[turn_id] = self.turn_sent.get(turn_id, 0) + len(pcm16) // 2
        if self.playing != response.id:
            self.playing = response.id
            await self.send("output_audio_buffer.started", response_id=response.id)
        self.track.push(pcm16, turn_id)

    async def _done(self, done: ResponseDone) -> None:
        response_id = self.response.id if self.response is not None else None
        if done.status == "interrupted" and self.playing is not None:
            dropped = self.track.clear()
            log.info("turn %d interrupted: %d ms of its audio dropped from the track", done.turn_id,
                     1000 * dropped // self.track.rate)
            await self.send("output_audio_buffer.cleared", response_id=self.playing)
            self.playing = None
        await super()._done(done)
        if self.playing is not None and self.playing == response_id:
            self.watch = asyncio.create_task(self._stopped(self.playing))

    async def _stopped(self, response_id: str) -> None:
        """output_audio_buffer.stopped once the response's audio has all gone out."""
        await self.track.drained.wait()
        if self.playing == response_id:
            self.playing = None
            async with self.lock:
                await self.send("output_audio_buffer.stopped", response_id=response_id)


class RealtimeTrackWire(RealtimeWire):
    """The Realtime wire of a WebRTC call: the caller's audio is their track's."""

    def __init__(self, call: Call, model: str, track: ReplyTrack) -> None:
        super().__init__(call, Dialect(beta=False), model)
        self.track = track
        self.greeted = False

    @property
    def input_rate(self) -> int:
        return TRACK_INPUT_RATE

    def _new_outbound(self) -> RealtimeOutbound:
        return RealtimeTrackOutbound(self.call.writer, self.dialect, self.call.runtime.metrics, self.track)

    async def greet(self) -> None:
        await super().greet()
        self.greeted = True

    async def audio_append(self, event: dict[str, Any]) -> None:
        raise RealtimeError("unsupported", "on a WebRTC call the caller's audio comes on their track; "
                            "input_audio_buffer.append is for WebSocket sessions", "type")

    async def track_audio(self, samples: np.ndarray) -> None:
        """A piece of the caller's track, once the call has begun (before session.created it is dropped:
        there is no session to hear it yet)."""
        if not self.greeted or self.call.writer.closed:
            return
        try:
            await self.take_audio(samples)
        except RealtimeError as exc:  # turn_detection null and the buffer full: told, as for an append
            await self.report(exc.code, str(exc))

    def on_played(self, turn_id: int, played_ms: float) -> None:
        """The track sent this much of turn `turn_id`'s reply: what the caller heard of it."""
        if self.call.session is not None:
            self.call.session.on_played(turn_id, played_ms)


def _error(status: int, code: str, message: str, param: str | None = None) -> JSONResponse:
    body = error_event(Dialect(beta=False), code, message, param=param)
    return JSONResponse({"error": body["error"]}, status_code=status)


async def _offer(request: Request) -> tuple[str, dict[str, Any] | None]:
    """The SDP offer and the `session` object sent with it, from either body OpenAI takes."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "multipart/form-data":
        if kind not in ("application/sdp", "text/plain", ""):
            raise RealtimeError("invalid_value", f"the body is {kind}: send the SDP offer as application/sdp, or a "
                                "multipart form with `sdp` and `session`", "content-type")
        return (await request.body()).decode(errors="replace"), None
    form = await request.form()
    sdp, session = form.get("sdp"), form.get("session")
    if not isinstance(sdp, str):
        raise RealtimeError("invalid_value", "the form needs an `sdp` field with the offer", "sdp")
    if session is None:
        return sdp, None
    try:
        parsed = json.loads(session) if isinstance(session, str) else None
    except json.JSONDecodeError as exc:
        raise RealtimeError("invalid_json", f"`session` is not JSON: {exc.msg}", "session") from exc
    if not isinstance(parsed, dict):
        raise RealtimeError("invalid_value", "`session` must be a JSON object", "session")
    return sdp, parsed


@router.post(PATH, response_model=None, status_code=201)
async def create_call(request: Request) -> Response:
    runtime = request.app.state.runtime
    model = request.query_params.get("model") or runtime.settings.llm.model
    try:
        sdp, session = await _offer(request)
        check_offer(sdp, runtime.settings.webrtc.max_offer_bytes, CHANNEL)
        settings = RealtimeSettings(model=model)
        for given in (request.scope.get(MINTED_SESSION), session):  # the key's session, then the request's own
            if isinstance(given, dict):
                settings = settings.updated(given, beta=False)
    except OfferError as exc:
        return _error(400, "invalid_offer", str(exc), exc.param)
    except RealtimeError as exc:
        return _error(400, exc.code, str(exc), exc.param)

    def make_wire(call: Call, track: ReplyTrack) -> RealtimeTrackWire:
        wire = RealtimeTrackWire(call, model, track)
        wire.adopt(dataclasses.replace(settings, id=call.session_id))  # its tools checked below, before an answer
        return wire

    try:  # the tools, as the call's toolbox will take them
        runtime.toolbox().declare(list(settings.tools), settings.tool_choice)
    except ConfigError as exc:
        return _error(400, "invalid_tools", str(exc), "session.tools")
    return await answer(request, sdp, "webrtc", PATH, make_wire, _error)
