"""A WebRTC call's peer connection, from the caller's offer to the call's end, for either wire (the
Realtime API's, app/transports/webrtc/realtime.py; the native protocol's, app/transports/webrtc/native.py).

`answer` checks the offer, admits the call (server.max_sessions, and the client's own count, taken
through the guard), answers it with the server's SDP (ICE candidates gathered, host ones by default,
STUN/TURN from webrtc.ice_servers), and runs the call on the call runner once the caller's data
channel opens: its socket is the channel (app/transports/webrtc/channel.py), its audio the tracks
(app/transports/webrtc/media.py). A call whose channel does not open within webrtc.connect_timeout_s
is ended and its slot freed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from app.admission import call_refusal
from app.runtime import Runtime
from app.security.guard import CLIENT_SLOT, TAKE_CALL_SLOT
from app.security.limits import Slot
from app.settings import WebRTCConfig
from app.transports.call import Call, Wire
from app.transports.webrtc.caller import CallerAudio, PacketTap, tap_packets
from app.transports.webrtc.channel import ChannelSocket
from app.transports.webrtc.media import ReplyTrack

log = logging.getLogger(__name__)
TRACK_INPUT_RATE = 16000  # the caller's track, resampled from its codec's rate to the VAD's
OUTPUT_RATE = 24000  # the reply's audio as the session makes it; the codec's encoder takes it from there


@runtime_checkable
class TrackWire(Protocol):
    """What a wire whose audio is on the tracks has besides the call runner's `Wire`."""

    async def track_audio(self, samples: np.ndarray) -> None:
        """A piece of the caller's track, float32 at TRACK_INPUT_RATE."""
        ...

    def on_played(self, turn_id: int, played_ms: float) -> None:
        """The reply track sent this much of the turn's audio."""
        ...


class OfferError(ValueError):
    """An offer the server will not answer: what is wrong, and the field."""

    def __init__(self, message: str, param: str = "sdp") -> None:
        super().__init__(message)
        self.param = param


def check_offer(sdp: str, limit: int, channel: str) -> None:
    if len(sdp.encode()) > limit:
        raise OfferError(f"the offer is over {limit} bytes (webrtc.max_offer_bytes)")
    lines = sdp.replace("\r\n", "\n").split("\n")
    if not sdp.startswith("v=0"):
        raise OfferError("the body is not an SDP offer (it must begin with v=0)")
    if not any(line.startswith("m=audio") for line in lines):
        raise OfferError("the offer has no audio (m=audio): add the microphone's track")
    if not any(line.startswith("m=application") for line in lines):
        raise OfferError(f"the offer has no data channel (m=application): create the `{channel}` channel "
                         "before making the offer")


def peer_connection(config: WebRTCConfig) -> RTCPeerConnection:
    servers = [RTCIceServer(urls=s.urls, username=s.username, credential=s.credential) for s in config.ice_servers]
    return RTCPeerConnection(RTCConfiguration(iceServers=servers))


ErrorReply = Callable[[int, str, str, "str | None"], JSONResponse]


async def answer(request: Request, sdp: str, transport: str, path: str,
                 make_wire: Callable[[Call, ReplyTrack], Wire], error: ErrorReply) -> Response:
    """The answer to a checked offer (201, application/sdp), or `error(status, code, message, param)`."""
    runtime: Runtime = request.app.state.runtime
    refused = call_refusal(runtime)
    if refused is not None:
        return error(refused.http_status, refused.code, refused.message, None)
    slot: Slot | None = None
    take = request.scope.get(TAKE_CALL_SLOT)
    if take is not None:
        slot = await take()
        if slot is None:
            limits = runtime.settings.server
            return error(429, "too_many_calls", f"too many calls in progress from your key or address "
                         f"(server.max_calls_per_key {limits.max_calls_per_key}, server.max_calls_per_client "
                         f"{limits.max_calls_per_client}); hang one up first", None)
    refused = call_refusal(runtime)  # again: the wait for the client's place may have let another call in
    if refused is not None:
        if slot is not None:
            slot.release()
        return error(refused.http_status, refused.code, refused.message, None)
    pc = peer_connection(runtime.settings.webrtc)
    socket = ChannelSocket({"type": "webrtc", **({CLIENT_SLOT: slot} if slot is not None else {})}, request.client,
                           pc.close)
    track = ReplyTrack(runtime.clock, OUTPUT_RATE)
    call = Call(socket, runtime, transport, lambda c: make_wire(c, track))  # type: ignore[arg-type]
    call.open()  # the call's place in the server (server.max_sessions), from its answer on
    try:
        return await _connect(call, socket, pc, track, sdp, path, error)
    except BaseException:
        call.release()
        with contextlib.suppress(Exception):
            await pc.close()
        raise


async def _connect(call: Call, socket: ChannelSocket, pc: RTCPeerConnection, track: ReplyTrack, sdp: str,
                   path: str, error: ErrorReply) -> Response:
    wire = call.wire
    assert isinstance(wire, TrackWire)
    config = call.runtime.settings.webrtc
    track.on_played = wire.on_played
    readers: list[asyncio.Task[None]] = []
    tap = PacketTap()

    @pc.on("datachannel")
    def on_datachannel(channel: Any) -> None:
        if socket.channel is None:
            socket.attach(channel)
        else:
            log.info("%s: a second data channel %r ignored", call.label, channel.label)

    @pc.on("track")
    def on_track(remote: MediaStreamTrack) -> None:
        if remote.kind == "audio" and not readers:
            reader = CallerAudio(remote, tap, wire.track_audio, TRACK_INPUT_RATE, config.reorder_ms / 1000,
                                 config.conceal_loss)
            readers.append(asyncio.create_task(reader.run()))

    @pc.on("connectionstatechange")
    async def on_state() -> None:
        log.info("%s: peer connection %s", call.label, pc.connectionState)
        if pc.connectionState in ("failed", "closed"):
            socket.gone()

    try:
        await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        pc.addTrack(track)  # on the offer's audio transceiver: the reply goes back on it
        if not tap_packets(pc, tap):
            raise RuntimeError("this aiortc has no audio jitter buffer to take the caller's packets from; the "
                               "server needs aiortc 1.14 to 1.x (pyproject.toml)")
        async with asyncio.timeout(config.ice_gathering_timeout_s):
            await pc.setLocalDescription(await pc.createAnswer())
    except (ValueError, TimeoutError, AttributeError, KeyError) as exc:
        for reader in readers:  # started by the offer's track: its receiver never will be
            reader.cancel()
        call.release()
        await pc.close()
        log.info("a WebRTC offer could not be answered: %r", exc)
        return error(400, "invalid_offer", f"the offer could not be answered: {exc}", "sdp")
    task = asyncio.create_task(_run(call, socket, pc, track, readers, config.connect_timeout_s))
    call.runtime.keep_call_task(task)
    log.info("%s: WebRTC call answered", call.label)
    return Response(pc.localDescription.sdp, status_code=201, media_type="application/sdp",
                    headers={"Location": f"{path}/{call.session_id}"})


async def _run(call: Call, socket: ChannelSocket, pc: RTCPeerConnection, track: ReplyTrack,
               readers: list[asyncio.Task[None]], connect_timeout_s: float) -> None:
    """The call, once its data channel opens; ended (its slot freed) if it never does."""
    try:
        try:
            async with asyncio.timeout(connect_timeout_s):
                await socket.opened.wait()
        except TimeoutError:
            log.info("%s: the caller's data channel did not open within %g s (webrtc.connect_timeout_s); "
                     "call ended", call.label, connect_timeout_s)
            call.release()
            return
        await call.serve(take_slot=False)
    finally:
        track.stop()
        for reader in readers:
            reader.cancel()
        with contextlib.suppress(Exception):
            await pc.close()
