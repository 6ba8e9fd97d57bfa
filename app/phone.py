"""Phone calls over a provider's media WebSocket (Twilio Media Streams, Telnyx media streaming),
shared by app/phone_twilio.py and app/phone_telnyx.py; docs/phone.md describes the setup.

A call drives the same Session as the native socket (app/ws_native.py, whose Connection this
extends): the same VAD, ASR, LLM, TTS and latency marks. The caller's 8 kHz mu-law is resampled to
the VAD's rate; the reply comes out at 8 kHz, paced by the session as for the native socket, and is
written as 20 ms mu-law `media` frames.

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
from collections.abc import MutableMapping
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect
from starlette.websockets import WebSocketState

from app.call_log import CallLog
from app.metrics import Metrics
from app.phone_wire import (
    FRAME_SAMPLES,
    SAMPLE_RATE,
    CallStart,
    Connected,
    Dialect,
    Dtmf,
    Mark,
    Media,
    ProviderError,
    Stop,
    mark_name,
    parse_mark,
)
from app.redact import mask_number
from app.runtime import Runtime
from app.settings import PhoneConfig
from app.wire import event_json
from app.ws_native import CLOSE_ERROR, CLOSE_NORMAL, CLOSE_POLICY, CLOSE_TRY_LATER, Connection, SocketOutbound
from core.errors import ProtocolError
from pipeline.audio import StreamResampler, mulaw_to_float, pcm16_to_mulaw
from pipeline.events import ErrorEvent, OutEvent, ResponseDone, SpeechStarted, TranscriptFinal
from pipeline.session import Session

log = logging.getLogger(__name__)
NONCE_PARAMETER = "nonce"  # the TwiML <Parameter> that Twilio hands back in `start`
CLOSING = ("session_expired", "too_many_errors", "start_timeout")  # Connection.run's reasons to close a call


class PhoneOutbound(SocketOutbound):
    """The session's output as the provider's frames: reply audio as `media` with `mark`s, `clear`
    after a barge-in. Events go to the log only: a phone line carries no text."""

    def __init__(self, websocket: WebSocket, dialect: Dialect, phone: PhoneConfig, timeout_s: float,
                 metrics: Metrics) -> None:
        super().__init__(websocket, timeout_s, metrics)
        self.dialect = dialect
        self.mark_every = max(1, phone.mark_interval_ms * SAMPLE_RATE // 1000)  # in samples
        self.stream_id = ""
        self.label = dialect.name  # "twilio CA..." once the call has started: every log line names the call
        self.turn_id: int | None = None  # the reply whose audio is being sent
        # the turn's samples sent, by every reply to it (a tool call's filler, then the answer): the
        # marks count per turn, as the native client's played reports do
        self.turn_sent = 0
        self.counted_turn: int | None = None
        self.turn_marked = 0  # its samples sent before the last mark

    async def send_frame(self, frame: dict[str, Any]) -> None:
        await self._send(self.websocket.send_text, json.dumps(frame))

    async def send_audio(self, pcm16: bytes, turn_id: int) -> None:
        if turn_id != self.counted_turn:
            self.counted_turn, self.turn_sent, self.turn_marked = turn_id, 0, 0
        self.turn_id = turn_id
        mulaw = pcm16_to_mulaw(pcm16)
        for start in range(0, len(mulaw), FRAME_SAMPLES):
            frame = mulaw[start:start + FRAME_SAMPLES]
            await self.send_frame(self.dialect.media(self.stream_id, frame))
            self.turn_sent += len(frame)
            if self.turn_sent - self.turn_marked >= self.mark_every:
                await self._mark()

    async def _mark(self) -> None:
        assert self.turn_id is not None
        self.turn_marked = self.turn_sent
        await self.send_frame(self.dialect.mark(self.stream_id, mark_name(self.turn_id,
                                                                          self.turn_sent * 1000 // SAMPLE_RATE)))

    async def send_event(self, event: OutEvent) -> None:
        if isinstance(event, ResponseDone):
            await self._reply_done(event)
        elif isinstance(event, ErrorEvent):
            self.metrics.error(event.code)
            log.warning("%s: turn %s: %s: %s", self.label, event.turn_id, event.code, event.message)
        elif isinstance(event, TranscriptFinal):
            log.info("%s: turn %d: caller: %r", self.label, event.turn_id, event.text)
        elif isinstance(event, SpeechStarted):
            log.debug("%s: turn %d: the caller speaks", self.label, event.turn_id)

    async def _reply_done(self, done: ResponseDone) -> None:
        self.turns += 1
        self.deadline_misses += done.deadline_missed
        self.underruns += done.underruns
        # The call's record of the turn, as the native socket sends it: what was kept (heard), marks.
        log.info("%s: response.done %s", self.label, json.dumps(event_json(done)))
        if done.turn_id != self.turn_id:
            return  # no audio of it went out
        if done.status == "interrupted":
            # Drop what the provider still holds; the marks it returns for it come after the
            # session finished the turn (it sent this event then), so they count for nothing.
            await self.send_frame(self.dialect.clear(self.stream_id))
            log.info("%s: turn %d interrupted: clear after %d ms of its audio", self.label, done.turn_id,
                     self.turn_sent * 1000 // SAMPLE_RATE)
        elif self.turn_sent > self.turn_marked:
            await self._mark()  # the end of the reply's audio
        self.turn_id = None


class PhoneCall(Connection):
    """One call's socket: the provider's frames in, the session's output out."""

    def __init__(self, websocket: WebSocket, runtime: Runtime, dialect: Dialect) -> None:
        super().__init__(websocket, runtime)
        self.dialect = dialect
        self.phone = runtime.settings.phone
        self.outbound: PhoneOutbound = PhoneOutbound(websocket, dialect, self.phone, self.settings.send_timeout_s,
                                                     runtime.metrics)
        self.session_id = f"{dialect.name}_{self.session_id.removeprefix('sess_')}"
        self.reason = ""  # why the call is closed, for the close frame

    @property
    def label(self) -> str:
        return self.outbound.label

    async def error(self, code: str, message: str) -> None:
        """A bad frame: the provider has no error message, so it is logged and counted; the call goes on
        (Connection.run closes it after server.max_protocol_errors, or at server.max_session_s)."""
        self.reason = f"{code}: {message}"
        self.runtime.metrics.error(code)
        if code in CLOSING:
            log.warning("%s: closing the call: %s", self.label, message)
            return
        self.errors += 1
        log.warning("%s: bad frame (%s): %s", self.label, code, message)

    async def goodbye(self) -> None:
        """The server is draining: the call is closed (1001) with the reason; a phone line takes no text."""
        self.reason = "the server is shutting down"
        log.info("%s: the server is shutting down; closing the call", self.label)

    async def handle(self, message: MutableMapping[str, Any]) -> bool:
        if message.get("bytes") is not None:
            await self.error("binary_frame", f"a binary frame of {len(message['bytes'])} bytes; {self.dialect.name} "
                             "sends JSON text frames only")
            return True
        text = message.get("text")
        if text is None:
            return True
        if len(text) > self.phone.max_frame_bytes or len(text.encode()) > self.phone.max_frame_bytes:
            await self.error("frame_too_large", f"a text frame of {len(text.encode())} bytes; the limit is "
                             f"{self.phone.max_frame_bytes} (phone.max_frame_bytes)")
            return True
        try:
            frame = self.dialect.parse(text, self.phone.max_media_payload_bytes)
        except ProtocolError as exc:
            await self.error(exc.code, str(exc))
            return True
        if isinstance(frame, Media):
            await self.handle_media(frame)
        elif isinstance(frame, Mark):
            self.handle_mark(frame.name)
        elif isinstance(frame, Dtmf):
            if self.session is None:
                await self.error("dtmf_before_start", "a dtmf event before start")
            else:
                log.info("%s: key %s", self.label, frame.digit)
                await self.session.on_dtmf(frame.digit)
        elif isinstance(frame, CallStart):
            await self.start_call(frame)
        elif isinstance(frame, Stop):
            log.info("%s: stop: the call is over", self.label)
            await self.stop_session()
            await self.close(CLOSE_NORMAL)
            return False
        elif isinstance(frame, ProviderError):
            self.runtime.metrics.error("provider_error")
            log.warning("%s: %s reports an error: %s", self.label, self.dialect.name, frame.detail)
        elif isinstance(frame, Connected):
            log.debug("%s: connected", self.label)
        return True

    async def start_call(self, start: CallStart) -> None:
        """The provider's `start`: the call is admitted here, not when the socket opened, so a socket
        that never starts holds no call slot. A Twilio stream must hand back the one-use nonce of the
        TwiML that opened it (app/phone_twilio.py): a captured stream replayed later is refused."""
        if self.session is not None:
            await self.error("already_started", "a second start event on this stream")
            return
        runtime = self.runtime
        assert runtime.backends is not None
        self.outbound.stream_id = start.stream_id
        self.outbound.label = f"{self.dialect.name} {start.call_id}"
        refusal = self.start_refusal(start)
        if refusal is not None:
            code, why, close_code = refusal
            log.warning("%s: call refused: %s", self.label, why)
            runtime.metrics.error(code)
            self.reason, self.end_reason = why, "refused"
            await self.close(close_code)
            return
        runtime.open_session(self.session_id, self.dialect.name)
        self.resampler = StreamResampler(SAMPLE_RATE, runtime.backends.vad.sample_rate)
        caller = start.parameters.get("From") or start.parameters.get("from")
        self.call_log = CallLog(runtime, self.session_id, self.dialect.name, caller=caller)
        # the server's own tools (tools.file): a phone call has no client that could run any
        self.session = Session(runtime.backends, runtime.pipeline_config(), runtime.clock, self.outbound,
                               output_rate=SAMPLE_RATE, on_turn=self.on_turn, tap=self.call_log.recorder,
                               toolbox=runtime.toolbox(), hang_up=self.hang_up)
        runtime.metrics.sessions.labels(self.dialect.name).inc()
        self.task = asyncio.create_task(self.session.run())
        runtime.keep_call_task(self.task)
        shown = {k: mask_number(v) if k.lower() in ("from", "to") else v for k, v in start.parameters.items()
                 if k != NONCE_PARAMETER}
        log.info("%s: call started (stream %s, %s)", self.label, start.stream_id, shown)

    def start_refusal(self, start: CallStart) -> tuple[str, str, int] | None:
        """Why this `start` may not begin a call (error code, reason, close code), or None."""
        runtime = self.runtime
        if self.dialect.name == "twilio" and runtime.settings.twilio.check_signatures:
            nonce = start.parameters.get(NONCE_PARAMETER, "")
            owner = runtime.stream_nonces.take(nonce) if nonce else None
            if owner is None or (owner and owner != start.call_id):
                return ("bad_nonce", "the stream did not come from this server's TwiML (its nonce is missing, used "
                        "or expired)", CLOSE_POLICY)
        if runtime.draining.is_set():
            return "shutting_down", "the server is shutting down", CLOSE_TRY_LATER
        limit = runtime.settings.server.max_sessions
        if len(runtime.sessions) >= limit:
            return "server_busy", f"all {limit} call slots are taken", CLOSE_TRY_LATER
        return None

    async def handle_media(self, media: Media) -> None:
        if self.session is None or self.resampler is None:
            await self.error("media_before_start", "a media event before start")
            return
        if media.track == "outbound" or not media.payload:  # Telnyx both_tracks also sends the bot's own audio
            return
        await self.feed(mulaw_to_float(media.payload))

    async def backlog_warning(self) -> None:
        """The provider takes no error message, and the server is slow, not the provider wrong: logged
        and counted in /metrics, not as a bad frame."""
        self.runtime.metrics.error("audio_backlog")
        log.warning("%s: audio arrives faster than it is processed; frames are dropped", self.label)

    def handle_mark(self, name: str) -> None:
        played = parse_mark(name)
        if played is None:
            log.warning("%s: a mark the server did not send: %r", self.label, name[:80])
            return
        if self.session is not None:
            self.session.on_played(*played)

    async def _session_crashed(self) -> None:
        assert self.task is not None
        exc = self.task.exception() if not self.task.cancelled() else None
        log.error("%s: the session failed: %r", self.label, exc, exc_info=exc)
        self.reason = f"the session failed ({getattr(exc, 'code', 'internal_error')})"
        self.end_reason, self.end_error = "error", repr(exc)
        await self.close(CLOSE_ERROR)

    async def close(self, code: int) -> None:
        if self.websocket.application_state == WebSocketState.CONNECTED:
            with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
                await self.websocket.close(code, reason=_reason(self.reason) if code != CLOSE_NORMAL else None)


def _reason(text: str) -> str:
    """A close reason fits in 123 bytes."""
    return text.encode()[:120].decode(errors="ignore")


async def deny(websocket: WebSocket) -> None:
    """Refuse the upgrade with HTTP 403 and nothing else: a close before accept is answered so by
    every ASGI server (the ASGI spec says so), and no socket is opened. (A denial response would
    do the same, but uvicorn's websockets protocol then logs an ERROR for each refusal.)"""
    await websocket.close(1008)


async def serve_call(websocket: WebSocket, dialect: Dialect) -> None:
    """Run one call on an authenticated provider socket. The call takes its slot at `start`
    (PhoneCall.start_call); a socket that sends none within server.start_timeout_s is closed."""
    runtime: Runtime = websocket.app.state.runtime
    await websocket.accept()
    if runtime.draining.is_set():
        log.warning("%s call refused: the server is shutting down", dialect.name)
        await websocket.close(CLOSE_TRY_LATER, reason="shutting down")
        return
    if not runtime.ready.is_set():
        detail = runtime.load_error or runtime.status
        log.warning("%s call refused: models are not loaded yet (%s)", dialect.name, detail)
        await websocket.close(CLOSE_TRY_LATER, reason=_reason(f"models are not loaded yet ({detail})"))
        return
    call = PhoneCall(websocket, runtime, dialect)
    runtime.keep_call_task(asyncio.current_task())
    try:
        await call.run()
    except WebSocketDisconnect:
        pass
    finally:
        call.release()
        out = call.outbound
        log.info("%s closed: %d replies, %d deadline misses, %d underruns", call.label, out.turns,
                 out.deadline_misses, out.underruns)
