"""A SIP call on the call runner (app/transports/call.py): the dialog stands in for the runner's
socket, the RTP session carries the audio, and the wire turns keypad events and the far end's BYE
into the session's input. Like a phone media stream, the line carries no text: events go to the log.

What the caller heard is what went out as RTP (`ReplyTrack.on_played`): a barge-in drops the rest of
the reply at once, and the history keeps only the words sent."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from starlette.datastructures import Address
from starlette.websockets import WebSocketDisconnect, WebSocketState

from app.metrics import Metrics
from app.transports.call import Call, Message
from app.transports.phone.wire import logged_turn
from app.transports.queue_socket import QueueSocket
from app.transports.webrtc.media import ReplyTrack
from core.private import keys, log_private, words
from models.protocols import Audio
from pipeline.events import ErrorEvent, OutEvent, ResponseDone, TranscriptFinal

if TYPE_CHECKING:
    from app.transports.screen import Screen

log = logging.getLogger(__name__)


class DialogSocket(QueueSocket):
    """The subset of Starlette's WebSocket the call runner uses, over a SIP dialog: `put` queues the
    line's events (a key, the far end's hang-up); `close` hangs up (BYE) through `on_close`."""

    flooded = "a SIP call sent more than %d events unread; ending it"

    def __init__(self, client: Address | None, on_close: Callable[[str], Awaitable[None]]) -> None:
        super().__init__({"type": "sip"}, client)
        self.on_close = on_close

    async def send_text(self, data: str) -> None:
        if self.application_state == WebSocketState.DISCONNECTED:
            raise WebSocketDisconnect(1000)

    async def send_bytes(self, data: bytes) -> None:
        await self.send_text("")

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        if self.application_state == WebSocketState.DISCONNECTED:
            return
        self.gone()
        await self.on_close(reason or "")


class LineOutbound:
    """The session's output on a SIP line: reply audio onto the RTP track, dropped at once when it
    is interrupted; events to the log (a phone line carries no text)."""

    def __init__(self, track: ReplyTrack, metrics: Metrics, label: str) -> None:
        self.track = track
        self.metrics = metrics
        self.label = label

    async def send_audio(self, pcm16: bytes, turn_id: int) -> None:
        self.track.push(pcm16, turn_id)

    async def send_event(self, event: OutEvent) -> None:
        if isinstance(event, ResponseDone):
            if event.status == "interrupted":
                dropped = self.track.clear()
                log.info("%s: turn %d interrupted: %d ms of its audio dropped", self.label, event.turn_id,
                         1000 * dropped // self.track.rate)
            log_private(log, logging.INFO, "%s: response.done %s", self.label, logged_turn(event))
        elif isinstance(event, ErrorEvent):
            self.metrics.error(event.code)
            log.warning("%s: turn %s: %s: %s", self.label, event.turn_id, event.code, event.message)
        elif isinstance(event, TranscriptFinal):
            log_private(log, logging.INFO, "%s: turn %d: caller: %r", self.label, event.turn_id, words(event.text))


class LineWire:
    """The call runner's wire for a SIP line: keys to the session, the far end's BYE ends the call,
    an optional first message said when the call is answered."""

    def __init__(self, call: Call, label: str, first_message: str | None = None) -> None:
        self.call = call
        self._label = label
        self.first_message = first_message
        self.screen: Screen | None = None  # a call placed out, screened for an answering machine first
        self.opening: asyncio.Task[None] | None = None

    @property
    def label(self) -> str:
        return self._label

    async def report(self, code: str, message: str, bad: bool) -> None:
        log.warning("%s: %s: %s", self.label, code, message)

    async def greet(self) -> None:
        """The first message, at once; or, on a screened call, once the verdict is in (a task: the
        call's loop runs meanwhile)."""
        if self.screen is not None:
            self.opening = asyncio.create_task(self.screen.open(self.call, self.first_message, self._sent))
        elif self.first_message and self.call.session is not None:
            await self.call.session.say(self.first_message)

    async def _sent(self) -> None:
        """Once the reply audio handed to the line has all gone out as RTP."""
        session = self.call.session
        if session is not None and isinstance(session.outbound, LineOutbound):
            await session.outbound.track.drained.wait()

    async def goodbye(self) -> None:
        """A phone line takes no text: the call is hung up (BYE) with the reason in the log."""

    async def handle(self, message: Message) -> bool:
        if message.get("type") == "sip.key":
            digit = str(message.get("digit", ""))
            if self.call.session is not None:
                log_private(log, logging.INFO, "%s: key pressed: %s", self.label, keys(digit))
                await self.call.session.on_dtmf(digit)
        return True

    async def audio(self, samples: Audio) -> None:
        """A piece of the caller's audio, at 8 kHz: to the screening until it has decided for a
        person (a machine's greeting never reaches the session), then to the session."""
        if self.screen is not None and not self.screen.lets_through():
            await self.screen.screening.feed(samples)
            return
        if self.call.session is not None and not self.call.writer.closed:
            await self.call.feed(samples)

    async def key(self, digit: str) -> None:
        socket = self.call.websocket
        assert isinstance(socket, DialogSocket)
        socket.put({"type": "sip.key", "digit": digit})
