"""SIP calls on the call runner (docs/sip.md): each INVITE let in by the signalling
(app/transports/sip/endpoint.py) is admitted like every call (server.max_sessions, the drain),
given an RTP session (app/transports/sip/rtp.py) and answered 200 OK with the server's SDP; the
call then runs as every transport's does (app/transports/call.py), with transport label `sip`.

Refusals: 488 for an offer without G.711, 503 when the server is full or draining (with the
reason), 500 when no RTP port is free. A call ends on the far end's BYE (or CANCEL before the
answer), on the agent's hang-up or the runner's end (a BYE is sent), or when the caller's RTP
stops for sip.rtp_timeout_s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from starlette.datastructures import Address

from app.redact import mask_number
from app.runtime import Runtime
from app.transports.call import Call
from app.transports.sip import sdp
from app.transports.sip.endpoint import Invite, Signalling
from app.transports.sip.line import DialogSocket, LineOutbound, LineWire
from app.transports.sip.rtp import CODEC_NAMES, SAMPLE_RATE, RtpSession, open_rtp
from app.transports.webrtc.media import ReplyTrack

log = logging.getLogger(__name__)
TRANSPORT = "sip"


class SipCall:
    """One SIP call: its dialog, media, socket and runner."""

    def __init__(self, calls: SipCalls, dialog: Any, label: str) -> None:
        self.calls = calls
        self.dialog = dialog
        self.label = label
        self.media: RtpSession | None = None
        self.socket = DialogSocket(None, self._hang_up)
        self.call: Call | None = None
        self.hung_up = False

    async def _hang_up(self, reason: str) -> None:
        """The server ends the call: BYE (sippy's dialog sends it)."""
        if not self.hung_up:
            self.hung_up = True
            log.info("%s: hanging up%s", self.label, f" ({reason})" if reason else "")
            self.calls.signalling.run(Signalling.hang_up, self.dialog)

    def far_end_hung_up(self, why: str) -> None:
        self.hung_up = True
        self.socket.gone()

    async def watch_media(self) -> None:
        """End the call when the caller's RTP stops (a peer gone without a BYE)."""
        timeout = self.calls.runtime.settings.sip.rtp_timeout_s
        clock = self.calls.runtime.clock
        while self.media is not None and not self.hung_up:
            silent = clock.now() - self.media.last_packet_at
            if silent >= timeout:
                log.warning("%s: no RTP from the caller for %.0f s (sip.rtp_timeout_s); ending the call",
                            self.label, silent)
                await self.socket.close(1000, "no media")
                return
            await clock.sleep(min(1.0, timeout - silent))


class SipCalls:
    """The server's SIP side: the signalling, and the calls on it (see the module doc)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.config = runtime.settings.sip
        self.signalling = Signalling(self.config, asyncio.get_running_loop(), self._invite, self._hangup)
        self.calls: dict[int, SipCall] = {}  # id(dialog) -> call
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await self.signalling.start()

    async def stop(self) -> None:
        for call in list(self.calls.values()):
            await call.socket.close(1001, "the server is shutting down")
        await self.signalling.stop()

    def _invite(self, invite: Invite) -> None:
        task = asyncio.create_task(self._take(invite))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _hangup(self, dialog: Any, origin: str) -> None:
        call = self.calls.get(id(dialog))
        if call is not None and not call.hung_up:
            log.info("%s: the far end hung up (%s)", call.label, origin)
            call.far_end_hung_up(origin)

    async def _take(self, invite: Invite) -> None:
        """Answer the call and run it; a failure before the answer is a 500, never the server's end."""
        try:
            await self._answer(invite)
        except Exception:
            log.exception("SIP: the call from %s failed", invite.source[0])
            if id(invite.dialog) not in self.calls:
                self.signalling.run(Signalling.refuse, invite.dialog, 500, "Server Internal Error")

    async def _answer(self, invite: Invite) -> None:
        runtime, run = self.runtime, self.signalling.run
        try:
            offer = sdp.parse(invite.sdp)
            codec = offer.codec()
        except sdp.SdpError as exc:
            log.warning("SIP: refused a call from %s: %s", invite.source[0], exc)
            runtime.metrics.error("sip_bad_offer")
            run(Signalling.refuse, invite.dialog, 488, "Not Acceptable Here")
            return
        label = f"sip {mask_number(invite.caller)}@{invite.source[0]}"
        line = SipCall(self, invite.dialog, label)
        line.socket.client = Address(*invite.source)
        track = ReplyTrack(runtime.clock, SAMPLE_RATE)
        call = Call(line.socket, runtime, TRANSPORT,  # type: ignore[arg-type]
                    lambda c: LineWire(c, label))
        line.call = call
        refused = await call.admit()
        if refused is not None:
            log.warning("%s: call refused: %s", label, refused.message)
            run(Signalling.refuse, invite.dialog, 503, "Service Unavailable")
            return
        wire = call.wire
        assert isinstance(wire, LineWire)
        try:
            line.media = await open_rtp(self.config.host, (self.config.rtp_port_min, self.config.rtp_port_max),
                                        lambda: RtpSession(track, codec, offer.dtmf_type(), self.config.reorder_ms,
                                                           wire.audio, wire.key))
        except OSError as exc:
            log.error("%s: %s", label, exc)
            call.release()
            run(Signalling.refuse, invite.dialog, 500, "No Media Port")
            return
        self.calls[id(invite.dialog)] = line
        track.on_played = lambda turn_id, ms: call.session.on_played(turn_id, ms) if call.session else None
        answer = sdp.write(self.signalling.address, line.media.port, (codec,), offer.dtmf_type())
        run(Signalling.answer, invite.dialog, answer)
        line.media.start((offer.address, offer.port))
        call.start_session(LineOutbound(track, runtime.metrics, label), input_rate=SAMPLE_RATE,
                           output_rate=SAMPLE_RATE, toolbox=runtime.toolbox(), caller=invite.caller)
        log.info("%s: answered (%s, RTP %d <-> %s:%d)", label, CODEC_NAMES[codec], line.media.port, offer.address,
                 offer.port)
        watch = asyncio.create_task(line.watch_media())
        try:
            await call.serve(take_slot=False)
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            await line.socket.close(1000)
            await line.media.close()
            self.calls.pop(id(invite.dialog), None)
