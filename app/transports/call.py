"""The call runner: one call on one socket, whatever the wire format.

A transport supplies a `Wire`: it parses the caller's messages and writes the session's output in
its own format, and tells the caller about errors its own way (an `error` event; on a phone line,
which carries no text, a log line). Everything else is here, once for every transport:

- admission (app/admission.py, the same for every transport, /v1 and the health probes);
- the call's loop (`Call.run`): its deadline (server.max_session_s), a socket that never starts its
  call (server.start_timeout_s), a caller who stopped reading (server.send_timeout_s), the agent's
  hang-up, a session that failed, too many bad messages (server.max_protocol_errors), and the
  goodbye when the server drains;
- the session's life (`start_session`, `stop_session`), the caller's audio to it (`feed`, bounded
  by server.max_audio_backlog_ms), its finished turns to the metrics and the call's QA record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from fastapi import WebSocket, WebSocketDisconnect
from starlette.websockets import WebSocketState

from app.admission import Refusal, admit_call, call_refusal
from app.call_log import CallLog
from app.runtime import Runtime
from app.security.guard import client_slot
from models.protocols import Audio
from pipeline.audio import StreamResampler
from pipeline.events import AudioFrame, ResponseDone
from pipeline.session import Outbound, PipelineConfig, Session
from pipeline.tools import ToolBox

log = logging.getLogger(__name__)

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CLOSE_ERROR = 1011

Message = MutableMapping[str, Any]


class SocketWriter:
    """Writes to one caller's socket; a lock keeps frames whole when tasks send at once. A caller
    who reads nothing for `timeout_s` is gone (`gone` is set), and nothing more is written."""

    def __init__(self, websocket: WebSocket, timeout_s: float) -> None:
        self.websocket = websocket
        self.timeout_s = timeout_s
        self.lock = asyncio.Lock()
        self.closed = False
        self.gone = asyncio.Event()

    async def text(self, data: str) -> None:
        await self._send(self.websocket.send_text, data)

    async def bytes(self, data: bytes) -> None:
        await self._send(self.websocket.send_bytes, data)

    async def _send(self, fn: Any, payload: Any) -> None:
        if self.closed:
            return
        async with self.lock:
            try:
                await asyncio.wait_for(fn(payload), self.timeout_s)
            except (WebSocketDisconnect, RuntimeError, OSError, TimeoutError) as exc:
                self.closed = True
                self.gone.set()
                why = (f"it read nothing for {self.timeout_s:g} s (server.send_timeout_s)"
                       if isinstance(exc, TimeoutError) else type(exc).__name__)
                log.info("caller socket closed while sending: %s", why)


class Wire(Protocol):
    """What a transport supplies: its wire format, nothing of the call's life."""

    @property
    def label(self) -> str:
        """Names the call in log lines."""
        ...

    async def handle(self, message: Message) -> bool:
        """One message from the caller; False when the caller ended the call."""
        ...

    async def report(self, code: str, message: str, bad: bool) -> None:
        """Tell the caller what went wrong, in the wire's own way (`bad`: a message of theirs)."""
        ...

    async def greet(self) -> None:
        """The call is admitted: the first words, if the wire has any."""
        ...

    async def goodbye(self) -> None:
        """The server drains: the last words before the call is closed (1001)."""
        ...


class Call:
    """One call: its admission, its loop, its session and its record (see the module doc)."""

    def __init__(self, websocket: WebSocket, runtime: Runtime, transport: str, wire: Callable[[Call], Wire],
                 writer: SocketWriter | None = None) -> None:
        self.websocket = websocket
        self.runtime = runtime
        self.transport = transport  # "ws", "twilio", "telnyx", "realtime": metrics labels and records
        self.settings = runtime.settings.server
        self.writer = writer or SocketWriter(websocket, self.settings.send_timeout_s)
        self.session_id = f"{'sess' if transport == 'ws' else transport}_{uuid.uuid4().hex[:16]}"
        self.session: Session | None = None
        self.task: asyncio.Task[None] | None = None
        self.resampler: StreamResampler | None = None
        self.call_log: CallLog | None = None  # the call's QA record, from its start
        self.agent_hung_up = asyncio.Event()  # set by end_call's hang-up (and transfer_call's transfer)
        # how the line transfers a call (a SIP REFER); None: the line cannot, and transfer_call is not offered
        self.transfer_line: Callable[[str], Awaitable[None]] | None = None
        self.transfer_to: str | None = None  # transfer_call chose this destination
        self.hang_up_reason = "agent_hangup"  # the record's end_reason when the agent's side hangs up
        self.started = False  # the caller started the call (else it is closed after server.start_timeout_s)
        self.errors = 0  # bad messages, up to server.max_protocol_errors
        self.reason = ""  # the last thing reported, for the close frame
        self.backlog_warned_at = -1e9
        self.end_reason = "client_closed"  # why the call ended, for its record
        self.end_error: str | None = None
        self.turns = self.deadline_misses = self.underruns = 0  # for the call's closing log line
        self.wire = wire(self)

    @property
    def label(self) -> str:
        return self.wire.label

    # -- admission and the socket's life -----------------------------------------------------------
    async def serve(self, *, take_slot: bool = True, subprotocol: str | None = None) -> None:
        """Accept the socket, admit the call (or close it with the reason), run it to its end."""
        await self.websocket.accept(subprotocol=subprotocol)
        if take_slot:
            refused = await admit_call(self.runtime, self.settings.admission_wait_s)
        else:
            refused = call_refusal(self.runtime, needs_slot=False)
        if refused is not None:
            log.warning("%s: call refused: %s", self.label, refused.message)
            await self.tell(refused.code, refused.message)
            return await self.close(refused.close_code)
        if take_slot:
            self.open()
        self.runtime.keep_call_task(asyncio.current_task())
        try:
            await self.wire.greet()
            await self.run()
        except WebSocketDisconnect:
            pass
        finally:
            self.release()
            log.info("%s closed: %d replies, %d deadline misses, %d underruns", self.label, self.turns,
                     self.deadline_misses, self.underruns)

    async def admit(self) -> Refusal | None:
        """Take a call slot now (waiting up to server.admission_wait_s for one to come free), unless
        the call may not start (then nothing is taken)."""
        refused = await admit_call(self.runtime, self.settings.admission_wait_s)
        if refused is None:
            self.open()
        return refused

    def open(self) -> None:
        self.runtime.open_session(self.session_id, self.transport)

    def release(self) -> None:
        """Give back the call's slot in the server (server.max_sessions) and in its client's count."""
        self.runtime.close_session(self.session_id)
        slot = client_slot(getattr(self.websocket, "scope", {}))
        if slot is not None:
            slot.release()

    async def close(self, code: int) -> None:
        if self.websocket.application_state == WebSocketState.CONNECTED:
            reason = None if code == CLOSE_NORMAL else _reason(self.reason)
            with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
                await self.websocket.close(code, reason=reason)

    # -- telling the caller --------------------------------------------------------------------------
    async def bad_message(self, code: str, message: str) -> None:
        """The caller sent something wrong: reported and counted (server.max_protocol_errors)."""
        self.errors += 1
        await self.tell(code, message, bad=True)

    async def tell(self, code: str, message: str, bad: bool = False) -> None:
        """Something the caller should know (a refusal, a limit reached): reported, not counted."""
        self.reason = f"{code}: {message}"
        self.runtime.metrics.error(code)
        await self.wire.report(code, message, bad)

    # -- the loop ------------------------------------------------------------------------------------
    async def run(self) -> None:
        clock = self.runtime.clock
        deadline = clock.now() + self.settings.max_session_s
        start_by = clock.now() + self.settings.start_timeout_s  # a socket that never starts its call is closed
        gone = asyncio.ensure_future(self.writer.gone.wait())
        draining = asyncio.ensure_future(self.runtime.draining.wait())
        hung_up = asyncio.ensure_future(self.agent_hung_up.wait())
        farewell: asyncio.Task[None] | None = None  # the goodbye once the server drains
        receive: asyncio.Future[Any] | None = None
        try:
            while True:
                remaining = deadline - clock.now()
                if remaining <= 0:
                    await self.tell("session_expired", f"calls are limited to {self.settings.max_session_s:.0f} s")
                    self.end_reason = "expired"
                    return await self.close(CLOSE_NORMAL)
                if not self.started:
                    if clock.now() >= start_by:
                        await self.tell("start_timeout", f"the call was not started within "
                                        f"{self.settings.start_timeout_s:g} s (server.start_timeout_s)")
                        return await self.close(CLOSE_POLICY)
                    remaining = min(remaining, start_by - clock.now())
                # Whichever comes first: a message, a caller who stopped reading, or a session that
                # failed (reported at once, not at the caller's next message).
                if receive is None:
                    receive = asyncio.ensure_future(self.websocket.receive())
                waiting: set[asyncio.Future[Any]] = {receive, gone, farewell or draining, hung_up}
                if self.task is not None:
                    waiting.add(self.task)
                await asyncio.wait(waiting, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                if hung_up.done() and self.transfer_to is not None and self.transfer_line is not None:
                    log.info("%s: the agent transferred the call (transfer_call)", self.label)
                    self.end_reason = "transferred"
                    await self.stop_session()
                    return await self.transfer_line(self.transfer_to)
                if hung_up.done():
                    log.info("%s: the agent's side ended the call (%s)", self.label, self.hang_up_reason)
                    self.end_reason = self.hang_up_reason
                    await self.stop_session()
                    return await self.close(CLOSE_NORMAL)
                if gone.done():
                    log.info("%s: the caller stopped reading; call ended and its slot freed", self.label)
                    self.end_reason = "caller_stopped_reading"
                    self.reason = "the caller stopped reading"
                    return await self.close(CLOSE_POLICY)
                if self.task is not None and self.task.done():
                    return await self._session_crashed()
                if farewell is None and draining.done():
                    farewell = asyncio.create_task(self._finish_for_shutdown())
                if farewell is not None and farewell.done():
                    self.end_reason = "server_shutdown"
                    return await self.close(CLOSE_GOING_AWAY)
                if not receive.done():
                    continue
                message, receive = receive.result(), None
                if message["type"] == "websocket.disconnect":
                    return
                if not await self.wire.handle(message):
                    self.end_reason = "hangup"
                    return
                if self.errors >= self.settings.max_protocol_errors:
                    await self.tell("too_many_errors", f"{self.errors} bad messages; closing the session")
                    self.end_reason = "too_many_errors"
                    return await self.close(CLOSE_POLICY)
        except asyncio.CancelledError:  # the server is going down past its grace: the record says so
            self.end_reason = "server_shutdown"
            raise
        finally:
            for future in (gone, draining, hung_up, farewell, receive):
                if future is not None:
                    future.cancel()
            self.release()  # the caller is gone: its slots are free now, not after the clean-up
            try:
                await self.stop_session()
            except asyncio.CancelledError:  # the clean-up was cut short by a forced shutdown
                self.end_reason = "server_shutdown"
                raise
            finally:  # in every case the call's end is written
                if self.call_log is not None:
                    self.call_log.ended(self.end_reason, self.end_error)

    async def _finish_for_shutdown(self) -> None:
        """The server is draining: let the reply in progress finish, until Runtime.drain_deadline,
        then say goodbye. Messages (audio, playback reports) go on being handled meanwhile."""
        clock = self.runtime.clock
        while self.session is not None and self.session.reply is not None and clock.now() < self.runtime.drain_deadline:
            await asyncio.sleep(0.05)
        log.info("%s: the server is shutting down; closing the call", self.label)
        self.reason = "the server is shutting down"
        await self.wire.goodbye()

    async def _session_crashed(self) -> None:
        assert self.task is not None
        exc = self.task.exception() if not self.task.cancelled() else None
        log.error("%s: the session failed: %r", self.label, exc, exc_info=exc)
        self.end_reason, self.end_error = "error", repr(exc)
        code = getattr(exc, "code", "internal_error")
        # the caller gets the code, not the exception's text (which may show the server's insides)
        await self.tell(code, f"the session failed ({code}); please reconnect")
        await self.close(CLOSE_ERROR)

    # -- the session ---------------------------------------------------------------------------------
    def start_session(self, outbound: Outbound, *, input_rate: int, output_rate: int, toolbox: ToolBox,
                      system_prompt: str | None = None, caller: str | None = None,
                      config: PipelineConfig | None = None, placed: dict[str, Any] | None = None) -> Session:
        """Start the call's session: its record, its resampler, its task. `config`: the call's own
        settings (the server's, by default); `placed`: who placed the call and why (an outbound call)."""
        runtime = self.runtime
        assert runtime.backends is not None and self.session is None
        self.started = True
        self.resampler = StreamResampler(input_rate, runtime.backends.vad.sample_rate)
        self.call_log = CallLog(runtime, self.session_id, self.transport, caller=caller, placed=placed)
        self.session = Session(
            runtime.backends, config or runtime.pipeline_config(), runtime.clock, outbound, output_rate=output_rate,
            input_rate=input_rate, system_prompt=system_prompt, on_turn=self.on_turn, tap=self.call_log.recorder,
            toolbox=toolbox, hang_up=self.hang_up, transfer=self.transfer if self.transfer_line is not None else None,
        )
        runtime.metrics.sessions.labels(self.transport).inc()
        self.task = asyncio.create_task(self.session.run())
        runtime.keep_call_task(self.task)
        return self.session

    async def feed(self, audio: Audio) -> None:
        """The caller's audio, at the call's input rate, to the session: dropped while
        `max_audio_backlog_ms` of it waits for the pipeline (counted in samples: frames may differ in
        size), else resampled to the VAD's rate, recorded for the call and queued."""
        assert self.session is not None and self.resampler is not None
        if 1000 * self.session.audio_in.backlog_samples / self.resampler.out_rate > self.settings.max_audio_backlog_ms:
            now = self.runtime.clock.now()
            if now - self.backlog_warned_at > 1.0:  # at most once a second
                self.backlog_warned_at = now
                await self.tell("audio_backlog",
                                "audio is arriving faster than it can be processed; frames are being dropped")
            return
        samples = self.resampler(audio)
        now = self.runtime.clock.now()
        if self.call_log is not None:
            self.call_log.caller_audio(samples, self.resampler.out_rate, now)
        await self.session.audio_in.put(AudioFrame(samples, now))

    async def on_turn(self, done: ResponseDone) -> None:
        """A finished turn: the service's metrics, and the call's record."""
        self.turns += 1
        self.deadline_misses += done.deadline_missed
        self.underruns += done.underruns
        await self.runtime.on_turn(done, self.call_log.call.id if self.call_log is not None else None)
        if self.call_log is not None:
            self.call_log.turn(done)

    def hang_up(self, reason: str = "agent_hangup") -> None:
        """The agent ends the call (end_call, once the goodbye was heard): the call's loop stops the
        session and closes with 1000 (on a phone line, closing the media stream ends Twilio's
        <Connect> and Telnyx's stream, and with them the call). `reason`: the record's end_reason."""
        self.hang_up_reason = reason
        self.agent_hung_up.set()

    def transfer(self, destination: str) -> None:
        """The agent hands the call on (transfer_call, once its last words were heard): the call's
        loop stops the session and the line transfers the call (`transfer_line`)."""
        self.transfer_to = destination
        self.agent_hung_up.set()

    async def stop_session(self) -> None:
        if self.session is None or self.task is None:
            return
        session, task = self.session, self.task
        self.session = None
        await session.audio_in.put(None)
        try:
            await asyncio.wait_for(asyncio.shield(task), 5.0)
        except TimeoutError:
            task.cancel()
        except asyncio.CancelledError:
            task.cancel()  # the call itself is being cut (a forced shutdown): its session stops with it
            raise
        except Exception as exc:  # already reported or the caller is gone; keep the server up
            log.warning("%s ended with %r", self.label, exc)
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def _reason(text: str) -> str:
    """A close reason fits in 123 bytes."""
    return text.encode()[:120].decode(errors="ignore")
