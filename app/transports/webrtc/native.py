"""The native protocol over WebRTC: `POST /webrtc/calls`, the browser page's way in (docs/webrtc.md).

The body is the caller's SDP offer; the key is a Bearer key or the page's one-use `?token=` (from
POST /api/session-token, as for /ws). The offer carries the microphone's track and an `events` data
channel, on which the call goes as on /ws (docs/websocket.md): `session.start` (its audio rates are
the tracks', whatever it says), the server's events, `session.update`, `function_call.output`,
`session.end`. The audio is on the tracks instead of binary frames; what the caller heard is what
went out on the server's track, so `output_audio.played` is not needed (and counts for nothing more)."""

from __future__ import annotations

import logging

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from app.metrics import Metrics
from app.transports.call import Call, SocketWriter
from app.transports.native.messages import AudioFormat, OutputAudioFormat, SessionStart, error_json
from app.transports.native.wire import NativeOutbound, NativeWire
from app.transports.webrtc.media import ReplyTrack
from app.transports.webrtc.peer import OUTPUT_RATE, TRACK_INPUT_RATE, OfferError, answer, check_offer
from pipeline.events import OutEvent, ResponseDone

log = logging.getLogger(__name__)
router = APIRouter()
PATH = "/webrtc/calls"
CHANNEL = "events"


class NativeTrackOutbound(NativeOutbound):
    """Events on the data channel; the reply's audio on `track`, dropped at once when it is interrupted."""

    def __init__(self, writer: SocketWriter, metrics: Metrics, track: ReplyTrack) -> None:
        super().__init__(writer, metrics)
        self.track = track

    async def send_event(self, event: OutEvent) -> None:
        if isinstance(event, ResponseDone) and event.status == "interrupted":
            dropped = self.track.clear()
            log.info("turn %d interrupted: %d ms of its audio dropped from the track", event.turn_id,
                     1000 * dropped // self.track.rate)
        await super().send_event(event)

    async def send_audio(self, pcm16: bytes, turn_id: int) -> None:
        self.track.push(pcm16, turn_id)


class NativeTrackWire(NativeWire):
    def __init__(self, call: Call, track: ReplyTrack) -> None:
        super().__init__(call)
        self.outbound = NativeTrackOutbound(call.writer, call.runtime.metrics, track)

    async def start_session(self, start: SessionStart) -> None:
        tracks = {"audio": AudioFormat(sample_rate=TRACK_INPUT_RATE), "output_audio": OutputAudioFormat(
            sample_rate=OUTPUT_RATE)}
        await super().start_session(start.model_copy(update=tracks))

    async def handle_audio(self, data: bytes) -> None:
        await self.call.bad_message("binary_frame", "on a WebRTC call the audio is on the tracks; "
                                    "binary frames are for /ws")

    async def track_audio(self, samples: np.ndarray) -> None:
        """A piece of the caller's track: to the session once it has started (before, nobody listens)."""
        if self.call.session is not None and not self.call.writer.closed:
            await self.call.feed(samples)

    def on_played(self, turn_id: int, played_ms: float) -> None:
        if self.call.session is not None:
            self.call.session.on_played(turn_id, played_ms)


def _error(status: int, code: str, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_json(code, message), status_code=status)


@router.post(PATH, response_model=None, status_code=201)
async def create_call(request: Request) -> Response:
    sdp = (await request.body()).decode(errors="replace")
    try:
        check_offer(sdp, request.app.state.runtime.settings.webrtc.max_offer_bytes, CHANNEL)
    except OfferError as exc:
        return _error(400, "invalid_offer", str(exc))
    return await answer(request, sdp, "webrtc", PATH, NativeTrackWire, _error)
