"""Phone calls over a provider's media WebSocket (Twilio Media Streams, Telnyx media streaming),
shared by app/transports/phone/twilio.py and app/transports/phone/telnyx.py; docs/phone.md describes the setup.

A call runs on the same call runner as the native socket (app/transports/call.py): the same
admission, Session, VAD, ASR, LLM, TTS and latency marks; this module only translates the frames.
The caller's 8 kHz mu-law is resampled to the VAD's rate; the reply comes out at 8 kHz, paced by the
session as for the native socket, and is written as 20 ms mu-law `media` frames.

What the caller heard: after every `phone.mark_interval_ms` of a reply's audio, and at its end, a
`mark` named for the turn and the audio sent before it ("t3:1400"). The provider echoes a mark once
that audio has played, and the echo goes to `Session.on_played`, as the native client's
`output_audio.played` does. When the session cuts a reply short (a barge-in: its `response.done` says
"interrupted"), the provider is told to `clear` the audio it still holds; it then returns the pending
marks at once, for audio nobody heard. By then the session has finished that reply and kept its
heard words, and it ignores reports about a turn it is not playing, so they count for nothing.

Providers send no error messages and take none: a bad frame is logged (WARNING) and counted in
/metrics (`voice_agent_errors_total{code}`), and the call goes on, until `server.max_protocol_errors`
of them close it (1008, with the reason).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any

from fastapi import WebSocket

from app.call_log import turn_json
from app.metrics import Metrics
from app.redact import mask_number, mask_parameters
from app.runtime import Runtime
from app.settings import PhoneConfig
from app.transports.call import CLOSE_NORMAL, CLOSE_POLICY, Call, Message, SocketWriter
from app.transports.phone.errors import DialError
from app.transports.phone.messages import (
    FRAME_SAMPLES,
    SAMPLE_RATE,
    CallStart,
    Connected,
    Dtmf,
    Mark,
    Media,
    Provider,
    ProviderError,
    Stop,
    mark_name,
    parse_mark,
)
from core.errors import ProtocolError
from core.private import Private, content, keys, log_private, words
from pipeline.audio import mulaw_to_float, pcm16_to_mulaw
from pipeline.events import ErrorEvent, OutEvent, ResponseDone, SpeechStarted, TranscriptFinal

if TYPE_CHECKING:
    from app.transports.phone.dial import PhoneDialer, PlacedLine

log = logging.getLogger(__name__)
NONCE_PARAMETER = "nonce"  # the TwiML <Parameter> that Twilio hands back in `start`
PLACED = "placed"  # a call placed out: its stream's credential (a <Parameter>, or the Telnyx URL's query)


def logged_turn(done: ResponseDone) -> Private:
    """A turn's `response.done` for the log (the native wire form): in full, or with the words kept
    and each tool call's arguments, answer and error summarized (core/private.py)."""
    record = {"type": "response.done", **turn_json(done)}
    summary = {**record, "text": words(done.text).summary}
    if "tool_calls" in record:
        summary["tool_calls"] = [{**call, **{k: content(call[k]).summary for k in ("arguments", "output", "error")
                                            if call.get(k) is not None}} for call in record["tool_calls"]]
    return Private(json.dumps(record), json.dumps(summary))


class PhoneOutbound:
    """The session's output as the provider's frames: reply audio as `media` with `mark`s, `clear`
    after a barge-in. Events go to the log only: a phone line carries no text."""

    def __init__(self, writer: SocketWriter, provider: Provider, phone: PhoneConfig, metrics: Metrics) -> None:
        self.writer = writer
        self.provider = provider
        self.metrics = metrics
        self.mark_every = max(1, phone.mark_interval_ms * SAMPLE_RATE // 1000)  # in samples
        self.stream_id = ""
        self.label = provider.name  # "twilio CA..." once the call has started: every log line names the call
        self.turn_id: int | None = None  # the reply whose audio is being sent
        # the turn's samples sent, by every reply to it (a tool call's filler, then the answer): the
        # marks count per turn, as the native client's played reports do
        self.turn_sent = 0
        self.counted_turn: int | None = None
        self.turn_marked = 0  # its samples sent before the last mark
        self.last_mark = ""  # the name of the last mark sent

    async def send_frame(self, frame: dict[str, Any]) -> None:
        await self.writer.text(json.dumps(frame))

    async def send_audio(self, pcm16: bytes, turn_id: int) -> None:
        if turn_id != self.counted_turn:
            self.counted_turn, self.turn_sent, self.turn_marked = turn_id, 0, 0
        self.turn_id = turn_id
        mulaw = pcm16_to_mulaw(pcm16)
        for start in range(0, len(mulaw), FRAME_SAMPLES):
            frame = mulaw[start:start + FRAME_SAMPLES]
            await self.send_frame(self.provider.media(self.stream_id, frame))
            self.turn_sent += len(frame)
            if self.turn_sent - self.turn_marked >= self.mark_every:
                await self._mark()

    async def _mark(self) -> None:
        assert self.turn_id is not None
        self.turn_marked = self.turn_sent
        self.last_mark = mark_name(self.turn_id, self.turn_sent * 1000 // SAMPLE_RATE)
        await self.send_frame(self.provider.mark(self.stream_id, self.last_mark))

    async def send_event(self, event: OutEvent) -> None:
        if isinstance(event, ResponseDone):
            await self._reply_done(event)
        elif isinstance(event, ErrorEvent):
            self.metrics.error(event.code)
            log.warning("%s: turn %s: %s: %s", self.label, event.turn_id, event.code, event.message)
        elif isinstance(event, TranscriptFinal):
            log_private(log, logging.INFO, "%s: turn %d: caller: %r", self.label, event.turn_id, words(event.text))
        elif isinstance(event, SpeechStarted):
            log.debug("%s: turn %d: the caller speaks", self.label, event.turn_id)

    async def _reply_done(self, done: ResponseDone) -> None:
        # The call's record of the turn, as the native socket sends it: what was kept (heard), marks.
        log_private(log, logging.INFO, "%s: response.done %s", self.label, logged_turn(done))
        if done.turn_id != self.turn_id:
            return  # no audio of it went out
        if done.status == "interrupted":
            # Drop what the provider still holds; the marks it returns for it come after the
            # session finished the turn (it sent this event then), so they count for nothing.
            await self.send_frame(self.provider.clear(self.stream_id))
            log.info("%s: turn %d interrupted: clear after %d ms of its audio", self.label, done.turn_id,
                     self.turn_sent * 1000 // SAMPLE_RATE)
        elif self.turn_sent > self.turn_marked:
            await self._mark()  # the end of the reply's audio
        self.turn_id = None


class PhoneWire:
    """A provider's frames to the call: `start` admits it, `media` is the caller's audio, `mark`
    echoes are playback reports, `dtmf` keys go to the session, `stop` ends the call."""

    def __init__(self, call: Call, provider: Provider, dialer: PhoneDialer | None = None) -> None:
        self.call = call
        self.provider = provider
        self.dialer = dialer  # calls placed out, and transfers (None: neither)
        self.phone = call.runtime.settings.phone
        self.outbound = PhoneOutbound(call.writer, provider, self.phone, call.runtime.metrics)
        self.placed: PlacedLine | None = None  # a call the service placed (app/transports/phone/dial.py)
        self.opening: asyncio.Task[None] | None = None  # a screened call's opening, once the verdict is in
        self.echoed = ""  # the last mark the provider echoed
        self.mark_echoed = asyncio.Event()  # set at each echoed mark

    @property
    def label(self) -> str:
        return self.outbound.label

    async def report(self, code: str, message: str, bad: bool) -> None:
        """The provider has no error message: logged (and counted in /metrics by the call runner)."""
        if bad:
            log.warning("%s: bad frame (%s): %s", self.label, code, message)
        else:
            log.warning("%s: %s: %s", self.label, code, message)

    async def greet(self) -> None:
        """Nothing: the caller speaks first (session.start / the provider's start)."""

    async def goodbye(self) -> None:
        """A phone line takes no text: the call is closed (1001) with the reason."""

    async def handle(self, message: Message) -> bool:
        call = self.call
        if message.get("bytes") is not None:
            await call.bad_message("binary_frame", f"a binary frame of {len(message['bytes'])} bytes; "
                                   f"{self.provider.name} sends JSON text frames only")
            return True
        text = message.get("text")
        if text is None:
            return True
        if len(text) > self.phone.max_frame_bytes or len(text.encode()) > self.phone.max_frame_bytes:
            await call.bad_message("frame_too_large", f"a text frame of {len(text.encode())} bytes; the limit is "
                                   f"{self.phone.max_frame_bytes} (phone.max_frame_bytes)")
            return True
        try:
            frame = self.provider.parse(text, self.phone.max_media_payload_bytes)
        except ProtocolError as exc:
            await call.bad_message(exc.code, str(exc))
            return True
        if isinstance(frame, Media):
            await self.handle_media(frame)
        elif isinstance(frame, Mark):
            self.handle_mark(frame.name)
        elif isinstance(frame, Dtmf):
            if call.session is None:
                await call.bad_message("dtmf_before_start", "a dtmf event before start")
            else:
                log_private(log, logging.INFO, "%s: key pressed: %s", self.label, keys(frame.digit))
                await call.session.on_dtmf(frame.digit)
        elif isinstance(frame, CallStart):
            await self.start_call(frame)
        elif isinstance(frame, Stop):
            log.info("%s: stop: the call is over", self.label)
            await call.stop_session()
            await call.close(CLOSE_NORMAL)
            return False
        elif isinstance(frame, ProviderError):
            call.runtime.metrics.error("provider_error")
            log.warning("%s: %s reports an error: %s", self.label, self.provider.name, frame.detail)
        elif isinstance(frame, Connected):
            log.debug("%s: connected", self.label)
        return True

    async def start_call(self, start: CallStart) -> None:
        """The provider's `start`: the call is admitted here, not when the socket opened, so a socket
        that never starts holds no call slot. A Twilio stream must hand back the one-use nonce of the
        TwiML that opened it (app/transports/phone/twilio.py): a captured stream replayed later is refused."""
        call, runtime = self.call, self.call.runtime
        if call.session is not None or call.call_log is not None:
            await call.bad_message("already_started", "a second start event on this stream")
            return
        self.outbound.stream_id = start.stream_id
        self.outbound.label = f"{self.provider.name} {start.call_id}"
        credential = start.parameters.get(PLACED) or call.websocket.query_params.get(PLACED)
        if credential:
            return await self._start_placed(start, credential)
        if not await self._nonce_ok(start):
            await call.tell("bad_nonce", "the stream did not come from this server's TwiML (its nonce is missing, "
                            "used or expired)")
            call.end_reason = "refused"
            return await call.close(CLOSE_POLICY)
        refused = await call.admit()
        if refused is not None:
            await call.tell(refused.code, refused.message)
            call.end_reason = "refused"
            return await call.close(refused.close_code)
        caller = start.parameters.get("From") or start.parameters.get("from")
        self._offer_transfer(start.call_id)
        # the server's own tools (tools.file): a phone call has no client that could run any
        call.start_session(self.outbound, input_rate=SAMPLE_RATE, output_rate=SAMPLE_RATE,
                           toolbox=runtime.toolbox(), caller=caller)
        shown = mask_parameters({k: v for k, v in start.parameters.items() if k != NONCE_PARAMETER})
        log.info("%s: call started (stream %s, %s)", self.label, start.stream_id, shown)

    async def _start_placed(self, start: CallStart, credential: str) -> None:
        """The stream of a call the service placed: its slot was taken when it was placed; it runs
        with the call's instructions and record, and says its first message at once."""
        call = self.call
        line = self.dialer.claim(credential, self.provider.name) if self.dialer is not None else None
        if line is None:
            await call.tell("unknown_call", "the stream names a call this replica did not place, or one already "
                            "answered or given up")
            call.end_reason = "refused"
            return await call.close(CLOSE_POLICY)
        self.placed = line
        line.provider_id = line.provider_id or start.call_id  # (the stream came before the API's answer)
        call.session_id = line.session_id
        self._offer_transfer(start.call_id)
        session = call.start_session(self.outbound, input_rate=SAMPLE_RATE, output_rate=SAMPLE_RATE,
                                     toolbox=call.runtime.toolbox(), placed=line.placed,
                                     system_prompt=line.instructions)
        log.info("%s: the call placed out as %s is answered (stream %s)", self.label, line.id, start.stream_id)
        if line.screen is not None:  # the callee's first seconds go to the detector; the verdict opens the call
            self.opening = asyncio.create_task(line.screen.open(call, line.first_message, self._played_out))
        elif line.first_message:
            await session.say(line.first_message)

    def _offer_transfer(self, call_id: str) -> None:
        """Where phone.transfer_calls is on and the provider's REST API is set up, the call can be
        handed on (transfer_call, to tools.transfer_targets)."""
        if (call_id and self.dialer is not None and self.phone.transfer_calls
                and self.dialer.can_transfer(self.provider.name)):
            self.call.transfer_line = lambda destination: self._transfer(call_id, destination)

    async def _transfer(self, call_id: str, destination: str) -> None:
        """A cold transfer through the provider's REST API, then this stream ends. A refused
        transfer ends the call too (the session has stopped): logged, counted, in the record."""
        call = self.call
        log.info("%s: transferring the call to %s through %s's API", self.label, mask_number(destination),
                 self.provider.name)
        assert self.dialer is not None
        try:
            await self.dialer.transfer(self.provider.name, call_id, destination)
        except DialError as exc:
            call.runtime.metrics.error("transfer_failed")
            log.warning("%s: the transfer failed, and the call ends: %s", self.label, exc)
            call.end_reason = "transfer_failed"
        await call.close(CLOSE_NORMAL)

    async def _nonce_ok(self, start: CallStart) -> bool:
        runtime = self.call.runtime
        if self.provider.name != "twilio" or not runtime.settings.twilio.check_signatures:
            return True
        nonce = start.parameters.get(NONCE_PARAMETER, "")
        owner = await runtime.stream_nonces.take(nonce) if nonce else None
        return owner is not None and (not owner or owner == start.call_id)

    async def handle_media(self, media: Media) -> None:
        if self.call.session is None:
            await self.call.bad_message("media_before_start", "a media event before start")
            return
        if media.track == "outbound" or not media.payload:  # Telnyx both_tracks also sends the bot's own audio
            return
        screen = self.placed.screen if self.placed is not None else None
        if screen is not None and not screen.lets_through():
            await screen.screening.feed(mulaw_to_float(media.payload))  # a machine's greeting is never answered
            return
        await self.call.feed(mulaw_to_float(media.payload))

    async def _played_out(self) -> None:
        """Once the provider has played all the reply audio sent (its last mark echoed), or 5 s."""
        clock = self.call.runtime.clock
        deadline = clock.now() + 5.0
        while self.echoed != self.outbound.last_mark and (left := deadline - clock.now()) > 0:
            self.mark_echoed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.mark_echoed.wait(), left)

    def handle_mark(self, name: str) -> None:
        played = parse_mark(name)
        if played is None:
            log.warning("%s: a mark the server did not send: %r", self.label, name[:80])
            return
        self.echoed = name
        self.mark_echoed.set()
        if self.call.session is not None:
            self.call.session.on_played(*played)


def phone_call(websocket: WebSocket, runtime: Runtime, provider: Provider, dialer: PhoneDialer | None = None) -> Call:
    """A call on a provider's media stream (not yet admitted: it takes its slot at `start`)."""
    return Call(websocket, runtime, provider.name, lambda call: PhoneWire(call, provider, dialer))


async def deny(websocket: WebSocket) -> None:
    """Refuse the upgrade with HTTP 403 and nothing else: a close before accept is answered so by
    every ASGI server (the ASGI spec says so), and no socket is opened. (A denial response would
    do the same, but uvicorn's websockets protocol then logs an ERROR for each refusal.)"""
    await websocket.close(1008)


async def serve_call(websocket: WebSocket, provider: Provider) -> None:
    """Run one call on an authenticated provider socket. The call takes its slot at `start`
    (PhoneWire.start_call); a socket that sends none within server.start_timeout_s is closed."""
    dialer: PhoneDialer = websocket.app.state.phone_dialer  # made with the app (app/main.py)
    call = phone_call(websocket, websocket.app.state.runtime, provider, dialer)
    try:
        await call.serve(take_slot=False)
    finally:
        wire = call.wire
        if isinstance(wire, PhoneWire) and wire.opening is not None:
            wire.opening.cancel()  # a screened call that ended before its verdict
        if isinstance(wire, PhoneWire) and wire.placed is not None:
            await dialer.finish(wire.placed, call.end_reason)
