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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.datastructures import Address

from app.redact import mask_number
from app.runtime import Runtime
from app.transports.answering_machine import Verdict
from app.transports.call import Call
from app.transports.screen import Screen
from app.transports.sip import sdp
from app.transports.sip.endpoint import Invite, Progress, Signalling
from app.transports.sip.line import DialogSocket, LineOutbound, LineWire
from app.transports.sip.rtp import CODEC_NAMES, PCMA, PCMU, SAMPLE_RATE, RtpSession, open_rtp
from app.transports.sip.warm import Leg, announce, bridge, ignore, ringback
from app.transports.webrtc.media import ReplyTrack
from pipeline.tools import ToolFailed

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
        self.instructions: str | None = None  # the call's own system prompt (a call placed out)
        self.leg: Leg | None = None  # a warm transfer's person, called and told, waiting to be joined
        self.consulting: str | None = None  # the name of the warm transfer's person being called and told
        self.leg_watch: asyncio.Task[None] | None = None  # hangs up on them if they are never joined
        self.gone = asyncio.Event()  # the far end hung up

    async def _hang_up(self, reason: str) -> None:
        """The server ends the call: BYE (sippy's dialog sends it)."""
        if not self.hung_up:
            self.hung_up = True
            log.info("%s: hanging up%s", self.label, f" ({reason})" if reason else "")
            self.calls.signalling.run(Signalling.hang_up, self.dialog)

    async def consult(self, name: str, destination: str, summary: str) -> None:
        """A warm transfer's first step (app/transports/sip/warm.py): call the person and tell them
        who is calling; ToolFailed, which the model is told, if they cannot be reached."""
        if self.consulting is not None:  # (two calls in one reply, or a new turn's while the first rings)
            raise ToolFailed(f"{self.consulting} is being called already; wait for that to end")
        self.consulting = name
        try:
            await self._consult(name, destination, summary)
        finally:
            self.consulting = None

    async def _consult(self, name: str, destination: str, summary: str) -> None:
        calls = self.calls
        tools = calls.runtime.settings.tools
        await self.drop_leg()  # a second try replaces the first
        log.info("%s: warm transfer: calling %s first", self.label, name)
        stop_ringing = asyncio.Event()  # the caller hears it ring meanwhile
        ringing = asyncio.create_task(ringback(self.media.track, stop_ringing)) if self.media is not None else None
        try:
            try:
                leg = await calls.dial_leg(name, destination, tools.transfer_ring_timeout_s)
            except ValueError as exc:
                raise ToolFailed(f"{name} cannot be called: {exc}") from None
            self.leg = leg
            assert calls.runtime.backends is not None
            message = tools.warm_transfer_message.replace("{summary}", summary).replace("  ", " ").strip()
            try:
                await announce(leg, calls.runtime.backends, calls.runtime.settings.session.tts_trim, message)
                if self.hung_up:
                    raise ToolFailed("the caller hung up while the person was called")
            except BaseException:
                await self.drop_leg()
                raise
        finally:
            stop_ringing.set()
            if ringing is not None:
                await ringing
        log.info("%s: warm transfer: %s answered and was told; the calls are joined after the agent's words",
                 self.label, name)
        self.leg_watch = calls.spawn(self._join_or_drop(leg, tools.transfer_ring_timeout_s))

    async def _join_or_drop(self, leg: Leg, wait_s: float) -> None:
        """A person told of a caller who is then never put through (the agent's words were cut off,
        the model changed its mind) is not left on a silent line: hung up after `wait_s`."""
        await self.calls.runtime.clock.sleep(wait_s)
        if self.leg is leg:
            log.warning("%s: warm transfer: the call was not put through to %s within %.0f s; hanging up on them",
                        self.label, leg.name, wait_s)
            await self.drop_leg()

    async def drop_leg(self) -> None:
        """Hang up a warm transfer's person who was called but not joined (the call ended first)."""
        leg, self.leg = self.leg, None
        self._stop_leg_watch()
        if leg is not None:
            await self.calls.end_leg(leg)

    def _stop_leg_watch(self) -> None:
        watch, self.leg_watch = self.leg_watch, None
        if watch is not None and watch is not asyncio.current_task():
            watch.cancel()

    async def transfer(self, destination: str) -> None:
        """Hand the call on: joined to the person already called (a warm transfer), or a REFER to
        `destination` (a SIP URI, or a number through the trunk), after which the far end calls it
        and this dialog ends."""
        if self.hung_up:
            return
        leg = self.leg
        if leg is not None and leg.destination == destination and self.media is not None:
            if not leg.ended.is_set():
                return await self._join(leg)
            log.warning("%s: warm transfer: %s hung up after the message, before the calls were joined; sending the "
                        "caller to them cold", self.label, leg.name)
            await self.drop_leg()
        self.hung_up = True
        uri = self.calls.transfer_uri(destination)
        log.info("%s: transferring the call to %s (REFER)", self.label, mask_number(uri))
        self.calls.signalling.run(Signalling.transfer, self.dialog, uri)
        self.socket.gone()

    async def _join(self, leg: Leg) -> None:
        """Relay the caller and the person to each other until one of them hangs up; then the other
        is hung up too. The call keeps its slot meanwhile (the record ends `transferred`)."""
        assert self.media is not None
        self.leg = None
        self._stop_leg_watch()
        try:
            ended_by = await bridge(self.media, self.gone, leg, self.calls.runtime.settings.sip.rtp_timeout_s,
                                    self.label)
            log.info("%s: the joined call with %s ended (%s hung up or went silent)", self.label, leg.name, ended_by)
        finally:  # (also when the server stops mid-call: both sides are hung up)
            await self.calls.end_leg(leg)
            if not self.gone.is_set():
                await self._hang_up("the joined call ended")
            self.hung_up = True
            self.socket.gone()

    def far_end_hung_up(self, why: str) -> None:
        self.hung_up = True
        self.gone.set()
        if self.call is not None and self.call.end_reason != "transferred":  # (a joined call stays transferred)
            self.call.end_reason = "hangup"
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


@dataclass
class Dialing:
    """A call being placed out: its line, and what became of it so far."""

    line: SipCall | None  # None: a warm transfer's call to the person (a Leg once answered)
    dialog: Any
    state: asyncio.Queue[Progress] = field(default_factory=asyncio.Queue)


class SipCalls:
    """The server's SIP side: the signalling, and the calls on it (see the module doc)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.config = runtime.settings.sip
        self.signalling = Signalling(self.config, asyncio.get_running_loop(), self._invite, self._hangup,
                                     self._progress)
        self.calls: dict[int, SipCall] = {}  # id(dialog) -> call
        self.dialing: dict[int, Dialing] = {}  # id(dialog) -> a call placed out, until answered or failed
        self.legs: dict[int, Leg] = {}  # id(dialog) -> a warm transfer's person, answered, until hung up
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await self.signalling.start()

    async def stop(self) -> None:
        for call in list(self.calls.values()):
            await call.socket.close(1001, "the server is shutting down")
        for leg in list(self.legs.values()):
            await self.end_leg(leg)
        for dialing in list(self.dialing.values()):  # calls out, and warm transfers' persons, still ringing
            self.signalling.run(Signalling.hang_up, dialing.dialog)
        await self.signalling.stop()

    def spawn(self, work: Any) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def _invite(self, invite: Invite) -> None:
        self.spawn(self._take(invite))

    def _hangup(self, dialog: Any, origin: str) -> None:
        leg = self.legs.get(id(dialog))
        if leg is not None:
            log.info("SIP: the warm transfer's %s hung up (%s)", leg.name, origin)
            leg.ended.set()
            return
        if id(dialog) not in self.calls and id(dialog) not in self.dialing:
            dialog.ended_early = True  # a CANCEL before the answer: _answer gives the call up
        call = self.calls.get(id(dialog))
        if call is not None and not call.hung_up:
            log.info("%s: the far end hung up (%s)", call.label, origin)
            call.far_end_hung_up(origin)
        dialing = self.dialing.get(id(dialog))
        if dialing is not None:
            dialing.state.put_nowait(Progress(dialog, "failed", 0, f"ended ({origin})"))

    def _progress(self, progress: Progress) -> None:
        dialing = self.dialing.get(id(progress.dialog))
        if dialing is not None:
            dialing.state.put_nowait(progress)

    # -- calls in ------------------------------------------------------------------------------------
    async def _take(self, invite: Invite) -> None:
        """Answer the call and run it; a failure before the answer is a 500, never the server's end."""
        try:
            await self._answer(invite)
        except Exception:
            log.exception("SIP: the call from %s failed", invite.source[0])
            if id(invite.dialog) not in self.calls:
                self.signalling.run(Signalling.refuse, invite.dialog, 500, "Server Internal Error")

    async def _answer(self, invite: Invite) -> None:
        run = self.signalling.run
        try:
            offer = sdp.parse(invite.sdp)
            codec = offer.codec()
        except sdp.SdpError as exc:
            log.warning("SIP: refused a call from %s: %s", invite.source[0], exc)
            self.runtime.metrics.error("sip_bad_offer")
            run(Signalling.refuse, invite.dialog, 488, "Not Acceptable Here")
            return
        line = self._line(invite.dialog, None)
        line.socket.client = Address(*invite.source)
        log.info("%s: a call from %s at %s:%d to %s", line.label, mask_number(invite.caller), *invite.source,
                 invite.called)
        assert line.call is not None
        refused = await line.call.admit()
        if refused is not None:
            log.warning("%s: call refused: %s", line.label, refused.message)
            run(Signalling.refuse, invite.dialog, 503, "Service Unavailable")
            return
        try:
            media = await self._media(line)
        except OSError as exc:
            log.error("%s: %s", line.label, exc)
            line.call.release()
            run(Signalling.refuse, invite.dialog, 500, "No Media Port")
            return
        if getattr(invite.dialog, "ended_early", False):  # the caller gave up (CANCEL) while it was admitted
            log.info("%s: cancelled by the caller before the answer", line.label)
            line.call.release()
            await media.close()
            return
        run(Signalling.answer, invite.dialog, sdp.write(self.signalling.address, media.port, (codec,),
                                                        offer.dtmf_type()))
        await self._run(line, offer, codec, invite.caller, None)

    # -- calls out -----------------------------------------------------------------------------------
    def target(self, to: str) -> tuple[tuple[str, int], str]:
        """Where a call to `to` goes: a SIP URI (sip:user@host[:port]) directly, a number through
        sip.trunk.address. Raises ValueError with the reason."""
        if to.startswith("sip:"):
            user, _, hostport = to.removeprefix("sip:").partition("@")
            host, _, port = hostport.partition(":")
            if not user or not host or (port and not port.isdigit()):
                raise ValueError(f"not a SIP URI: {to!r} (sip:user@host[:port])")
            return (host, int(port or 5060)), user
        if not self.config.trunk.address:
            raise ValueError("calls to numbers go through sip.trunk.address, which is not set")
        host, _, port = self.config.trunk.address.partition(":")
        return (host, int(port or 5060)), to

    def transfer_uri(self, destination: str) -> str:
        """The SIP URI a transfer sends the caller to: a URI as it is, a number at the trunk."""
        if destination.startswith(("sip:", "sips:")):
            return destination
        return f"sip:{destination}@{self.config.trunk.address or self.signalling.address}"

    async def place(self, to: str, *, first_message: str | None, instructions: str | None,
                    placed: dict[str, Any], on_state: Callable[[str, str], None], ring_timeout_s: float,
                    machine: str = "off", voicemail_message: str | None = None,
                    on_verdict: Callable[[Verdict], None] | None = None) -> str:
        """Place a call; it runs (in a task) until it ends. `on_state(state, detail)` hears "ringing",
        "answered", "failed" (with the SIP status), "ended" (with the reason). The call's slot is
        taken before it is placed (ValueError if the server refuses it). Returns the call's id (its
        record's, once answered)."""
        target, called = self.target(to)
        line = self._line(None, first_message)
        log.info("%s: calling %s through %s:%d", line.label, mask_number(called), *target)
        line.instructions = instructions
        if machine != "off":
            wire = line.call.wire if line.call is not None else None
            assert isinstance(wire, LineWire) and self.runtime.backends is not None
            wire.screen = Screen(self.runtime.backends, self.runtime.settings.machine_detection, machine,
                                 voicemail_message, on_verdict or (lambda verdict: None))
        assert line.call is not None
        refused = await line.call.admit()
        if refused is not None:
            raise ValueError(refused.message)
        try:
            media = await self._media(line)
        except OSError:
            line.call.release()
            raise
        offer = sdp.write(self.signalling.address, media.port, (PCMU, PCMA), sdp.DTMF_TYPE)
        assert self.signalling.reactor is not None
        try:
            line.dialog = await asyncio.to_thread(self.signalling.reactor.call_sync, self.signalling.dial, target,
                                                  called, offer)
        except BaseException:
            line.call.release()
            await media.close()
            raise
        dialing = self.dialing[id(line.dialog)] = Dialing(line, line.dialog)
        self.spawn(self._dial(dialing, placed, on_state, ring_timeout_s))
        return line.call.session_id

    async def _dial(self, dialing: Dialing, placed: dict[str, Any], on_state: Callable[[str, str], None],
                    ring_timeout_s: float) -> None:
        line = dialing.line
        assert line is not None and line.call is not None and line.media is not None
        answered: Progress | None = None
        deadline = self.runtime.clock.now() + ring_timeout_s
        try:
            while answered is None:
                left = deadline - self.runtime.clock.now()
                try:
                    progress = await asyncio.wait_for(dialing.state.get(), max(left, 0.001))
                except TimeoutError:
                    log.info("%s: no answer in %.0f s; cancelled", line.label, ring_timeout_s)
                    self.signalling.run(Signalling.hang_up, line.dialog)
                    on_state("failed", f"no answer in {ring_timeout_s:g} s")
                    return
                if progress.state == "ringing":
                    on_state("ringing", f"{progress.code} {progress.reason}")
                elif progress.state == "failed":
                    log.info("%s: not answered: %d %s", line.label, progress.code, progress.reason)
                    on_state("failed", f"{progress.code} {progress.reason}".strip())
                    return
                else:
                    answered = progress
            try:
                answer = sdp.parse(answered.sdp)
                codec = answer.codec()
            except sdp.SdpError as exc:
                log.warning("%s: the answer's SDP: %s; hanging up", line.label, exc)
                self.signalling.run(Signalling.hang_up, line.dialog)
                on_state("failed", f"bad answer: {exc}")
                return
            on_state("answered", f"{answered.code} {answered.reason}")
            self.dialing.pop(id(line.dialog), None)
            await self._run(line, answer, codec, None, placed)
            on_state("ended", line.call.end_reason)
        finally:
            self.dialing.pop(id(line.dialog), None)
            if answered is None:
                line.call.release()
                await line.media.close()

    # -- warm transfers -------------------------------------------------------------------------------
    async def dial_leg(self, name: str, destination: str, ring_timeout_s: float) -> Leg:
        """Call a warm transfer's person (through the trunk for a number) and wait for the answer:
        the answered Leg, its media flowing; ToolFailed with what happened if not answered, ValueError
        for a destination that cannot be called. Takes no call slot (no models run on it)."""
        target, called = self.target(destination)
        media = await open_rtp(self.config.host, (self.config.rtp_port_min, self.config.rtp_port_max),
                               lambda: RtpSession(ReplyTrack(self.runtime.clock, SAMPLE_RATE), self.config.reorder_ms,
                                                  ignore, ignore))
        offer = sdp.write(self.signalling.address, media.port, (PCMU, PCMA), sdp.DTMF_TYPE)
        assert self.signalling.reactor is not None
        inviting = asyncio.ensure_future(asyncio.to_thread(self.signalling.reactor.call_sync, self.signalling.dial,
                                                           target, called, offer))
        try:
            dialog = await asyncio.shield(inviting)  # (cut short, the dialog it makes is still hung up)
        except BaseException:
            inviting.add_done_callback(self._hang_up_made)
            await media.close()
            raise
        dialing = self.dialing[id(dialog)] = Dialing(None, dialog)
        deadline = self.runtime.clock.now() + ring_timeout_s
        try:
            while True:
                try:
                    progress = await asyncio.wait_for(dialing.state.get(),
                                                      max(deadline - self.runtime.clock.now(), 0.001))
                except TimeoutError:
                    self.signalling.run(Signalling.hang_up, dialog)
                    raise ToolFailed(f"{name} did not answer within {ring_timeout_s:g} s") from None
                if progress.state == "failed":
                    raise ToolFailed(f"{name} did not answer: {progress.code} {progress.reason}".strip())
                if progress.state == "answered":
                    break
            try:
                answer = sdp.parse(progress.sdp)
                codec = answer.codec()
            except sdp.SdpError as exc:
                self.signalling.run(Signalling.hang_up, dialog)
                raise ToolFailed(f"{name}'s phone answered with media this server cannot use: {exc}") from None
        except BaseException as exc:
            if not isinstance(exc, ToolFailed):  # cut short (the call or the server ended): stop the ringing
                self.signalling.run(Signalling.hang_up, dialog)
            await media.close()
            raise
        finally:
            self.dialing.pop(id(dialog), None)
        media.start((answer.address, answer.port), codec, answer.dtmf_type())
        leg = self.legs[id(dialog)] = Leg(name, destination, dialog, media)
        return leg

    def _hang_up_made(self, inviting: asyncio.Future[Any]) -> None:
        """A dialog whose INVITE went out after its caller gave up waiting for it: hung up."""
        if not inviting.cancelled() and inviting.exception() is None:
            self.signalling.run(Signalling.hang_up, inviting.result())

    async def end_leg(self, leg: Leg) -> None:
        """Hang up a warm transfer's person (unless they did) and close the leg's media."""
        self.legs.pop(id(leg.dialog), None)
        if not leg.ended.is_set():
            leg.ended.set()
            self.signalling.run(Signalling.hang_up, leg.dialog)
        await leg.media.close()

    # -- every call ----------------------------------------------------------------------------------
    def _line(self, dialog: Any, first_message: str | None) -> SipCall:
        """A call's parts, named in every log line by the call's id (its record's)."""
        line = SipCall(self, dialog, "")
        line.call = Call(line.socket, self.runtime, TRANSPORT,  # type: ignore[arg-type]
                         lambda c: LineWire(c, c.session_id, first_message))
        line.label = line.call.session_id
        line.call.transfer_line = line.transfer
        return line

    async def _media(self, line: SipCall) -> RtpSession:
        assert line.call is not None
        wire = line.call.wire
        assert isinstance(wire, LineWire)
        track = ReplyTrack(self.runtime.clock, SAMPLE_RATE)
        line.media = await open_rtp(self.config.host, (self.config.rtp_port_min, self.config.rtp_port_max),
                                    lambda: RtpSession(track, self.config.reorder_ms, wire.audio, wire.key,
                                                                      self.config.conceal_loss))
        return line.media

    async def _run(self, line: SipCall, remote: sdp.Media, codec: int, caller: str | None,
                   placed: dict[str, Any] | None) -> None:
        """The call is up: media flows, the session starts, the runner runs it to its end."""
        call, media, runtime = line.call, line.media, self.runtime
        assert call is not None and media is not None
        self.calls[id(line.dialog)] = line
        media.track.on_played = lambda turn_id, ms: call.session.on_played(turn_id, ms) if call.session else None
        media.start((remote.address, remote.port), codec, remote.dtmf_type())
        toolbox = runtime.toolbox()
        toolbox.on_consult = line.consult  # transfer_call's warm targets (tools.warm_transfers)
        call.start_session(LineOutbound(media.track, runtime.metrics, line.label), input_rate=SAMPLE_RATE,
                           output_rate=SAMPLE_RATE, toolbox=toolbox, caller=caller, placed=placed,
                           system_prompt=line.instructions)
        log.info("%s: connected (%s, RTP %d <-> %s:%d)", line.label, CODEC_NAMES[codec], media.port, remote.address,
                 remote.port)
        watch = asyncio.create_task(line.watch_media())
        try:
            await call.serve(take_slot=False)
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            await line.drop_leg()  # a person called for a warm transfer the call never reached
            await line.socket.close(1000)
            await media.close()
            self.calls.pop(id(line.dialog), None)

