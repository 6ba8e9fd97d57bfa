"""The native WebSocket transport at /ws (protocol in docs/websocket.md).

The socket is the edge: inbound audio is checked, converted and resampled here and queued for the
session (bounded by `max_audio_backlog_ms`); outbound events and audio are written here, one at a
time. A bad message gets an `error` event; the session is closed only when going on makes no sense.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import MutableMapping
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from starlette.websockets import WebSocketState

from app.call_log import CallLog
from app.guard import client_slot
from app.metrics import Metrics
from app.runtime import Runtime
from app.wire import (
    FunctionCallOutput,
    OutputAudioPlayed,
    SessionEnd,
    SessionStart,
    SessionUpdate,
    error_json,
    event_json,
    parse_client_text,
)
from core.errors import ConfigError, ProtocolError
from models.protocols import Audio
from pipeline.audio import StreamResampler, pcm16_to_float
from pipeline.events import AudioFrame, OutEvent, ResponseDone
from pipeline.session import Session
from pipeline.tools import ToolBox

log = logging.getLogger(__name__)
router = APIRouter()

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CLOSE_ERROR = 1011
CLOSE_TRY_LATER = 1013


class SocketOutbound:
    """Writes to one caller's socket; a lock keeps frames whole when tasks send at once."""

    def __init__(self, websocket: WebSocket, timeout_s: float, metrics: Metrics) -> None:
        self.websocket = websocket
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.lock = asyncio.Lock()
        self.closed = False
        self.gone = asyncio.Event()  # set when the caller stopped reading or the socket broke
        self.turns = self.deadline_misses = self.underruns = 0  # the call's, for its closing log line

    async def send_json(self, data: dict[str, Any]) -> None:
        if data.get("type") == "error":
            self.metrics.error(str(data.get("code")))
        await self._send(self.websocket.send_text, json.dumps(data))

    async def send_event(self, event: OutEvent) -> None:
        if isinstance(event, ResponseDone):
            self.turns += 1
            self.deadline_misses += event.deadline_missed
            self.underruns += event.underruns
        await self.send_json(event_json(event))

    async def send_audio(self, pcm16: bytes, turn_id: int) -> None:
        await self._send(self.websocket.send_bytes, pcm16)

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


class Connection:
    def __init__(self, websocket: WebSocket, runtime: Runtime) -> None:
        self.websocket = websocket
        self.runtime = runtime
        self.settings = runtime.settings.server
        self.outbound = SocketOutbound(websocket, self.settings.send_timeout_s, runtime.metrics)
        self.session_id = "sess_" + uuid.uuid4().hex[:16]
        self.session: Session | None = None
        self.agent_hung_up = asyncio.Event()  # set by end_call's hang-up
        self.toolbox: ToolBox | None = None
        self.task: asyncio.Task[None] | None = None
        self.resampler: StreamResampler | None = None
        self.errors = 0
        self.backlog_warned_at = -1e9
        self.call_log: CallLog | None = None  # the call's QA record, from its start
        self.end_reason = "client_closed"  # why the call ended, for its record
        self.end_error: str | None = None

    async def on_turn(self, done: ResponseDone) -> None:
        """A finished turn: the service's metrics, and the call's record."""
        await self.runtime.on_turn(done, self.call_log.call.id if self.call_log is not None else None)
        if self.call_log is not None:
            self.call_log.turn(done)

    async def feed(self, audio: Audio) -> None:
        """The caller's audio, at the call's input rate, to the session: dropped while
        `max_audio_backlog_ms` of it waits for the pipeline (counted in samples: frames may differ in
        size), else resampled to the VAD's rate, recorded for the call and queued."""
        assert self.session is not None and self.resampler is not None
        if 1000 * self.session.audio_in_samples / self.resampler.out_rate > self.settings.max_audio_backlog_ms:
            now = self.runtime.clock.now()
            if now - self.backlog_warned_at > 1.0:
                self.backlog_warned_at = now
                await self.backlog_warning()
            return
        samples = self.resampler(audio)
        now = self.runtime.clock.now()
        if self.call_log is not None:
            self.call_log.caller_audio(samples, self.resampler.out_rate, now)
        self.session.audio_in_samples += len(samples)
        await self.session.audio_in.put(AudioFrame(samples, now))

    async def backlog_warning(self) -> None:
        """Audio is being dropped (at most once a second): the caller is told."""
        await self.error("audio_backlog", "audio is arriving faster than it can be processed; frames are being dropped")

    async def error(self, code: str, message: str) -> None:
        self.errors += 1
        await self.outbound.send_json(error_json(code, message))

    async def run(self) -> None:
        clock = self.runtime.clock
        deadline = clock.now() + self.settings.max_session_s
        start_by = clock.now() + self.settings.start_timeout_s  # a socket that never starts its call is closed
        gone = asyncio.ensure_future(self.outbound.gone.wait())
        draining = asyncio.ensure_future(self.runtime.draining.wait())
        hung_up = asyncio.ensure_future(self.agent_hung_up.wait())
        farewell: asyncio.Task[None] | None = None  # the goodbye once the server drains
        receive: asyncio.Future[Any] | None = None
        try:
            while True:
                remaining = deadline - clock.now()
                if remaining <= 0:
                    await self.error("session_expired", f"calls are limited to {self.settings.max_session_s:.0f} s")
                    self.end_reason = "expired"
                    return await self.close(CLOSE_NORMAL)
                if self.session is None and self.call_log is None:
                    if clock.now() >= start_by:
                        await self.error("start_timeout", f"the call was not started within "
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
                if hung_up.done():
                    log.info("%s: the agent ended the call (end_call)", self.session_id)
                    self.end_reason = "agent_hangup"
                    await self.stop_session()
                    return await self.close(CLOSE_NORMAL)
                if gone.done():
                    log.info("%s: the caller stopped reading; call ended and its slot freed", self.session_id)
                    self.end_reason = "caller_stopped_reading"
                    return await self.close(CLOSE_POLICY)
                if self.task is not None and self.task.done():
                    return await self._session_crashed()
                if farewell is None and draining.done():
                    farewell = asyncio.create_task(self.finish_for_shutdown())
                if farewell is not None and farewell.done():
                    self.end_reason = "server_shutdown"
                    return await self.close(CLOSE_GOING_AWAY)
                if not receive.done():
                    continue
                message, receive = receive.result(), None
                if message["type"] == "websocket.disconnect":
                    return
                keep_going = await self.handle(message)
                if not keep_going:
                    self.end_reason = "hangup"
                    return
                if self.errors >= self.settings.max_protocol_errors:
                    await self.error("too_many_errors", f"{self.errors} bad messages; closing the session")
                    self.end_reason = "too_many_errors"
                    return await self.close(CLOSE_POLICY)
        except asyncio.CancelledError:  # the server is going down past its grace: the record says so
            self.end_reason = "server_shutdown"
            raise
        finally:
            gone.cancel()
            draining.cancel()
            hung_up.cancel()
            if farewell is not None:
                farewell.cancel()
            if receive is not None:
                receive.cancel()
            self.release()  # the caller is gone: its slots are free now, not after the clean-up
            try:
                await self.stop_session()
            except asyncio.CancelledError:  # the clean-up was cut short by a forced shutdown
                self.end_reason = "server_shutdown"
                raise
            finally:  # in every case the call's end is written
                if self.call_log is not None:
                    self.call_log.ended(self.end_reason, self.end_error)

    def release(self) -> None:
        """Give back the call's slot in the server (server.max_sessions) and in its client's count."""
        self.runtime.close_session(self.session_id)
        slot = client_slot(getattr(self.websocket, "scope", {}))
        if slot is not None:
            slot.release()

    async def finish_for_shutdown(self) -> None:
        """The server is draining: let the reply in progress finish, until Runtime.drain_deadline,
        then say goodbye. Messages (audio, playback reports) go on being handled meanwhile."""
        clock = self.runtime.clock
        while self.session is not None and self.session.reply is not None and clock.now() < self.runtime.drain_deadline:
            await asyncio.sleep(0.05)
        await self.goodbye()

    async def goodbye(self) -> None:
        log.info("%s: the server is shutting down; closing the call", self.session_id)
        await self.outbound.send_json(error_json("server_shutting_down",
                                                 "the server is shutting down; please call again"))

    async def handle(self, message: MutableMapping[str, Any]) -> bool:
        data = message.get("bytes")
        if data is not None:
            await self.handle_audio(data)
            return True
        text = message.get("text")
        if text is None:
            return True
        if len(text.encode()) > self.settings.max_text_bytes:
            await self.error("message_too_large", f"text messages are limited to {self.settings.max_text_bytes} bytes")
            return True
        try:
            parsed = parse_client_text(text)
        except ProtocolError as exc:
            await self.error(exc.code, str(exc))
            return True
        if isinstance(parsed, SessionEnd):
            await self.stop_session()
            await self.close(CLOSE_NORMAL)
            return False
        if isinstance(parsed, OutputAudioPlayed):
            if self.session is None:
                await self.error("session_not_started", "send session.start first")
            else:
                self.session.on_played(parsed.turn_id, parsed.played_ms)
            return True
        if isinstance(parsed, SessionUpdate | FunctionCallOutput) and self.session is None:
            await self.error("session_not_started", "send session.start first")
            return True
        if isinstance(parsed, SessionUpdate):
            await self.update_tools(parsed.tools, parsed.tool_choice)
            return True
        if isinstance(parsed, FunctionCallOutput):
            assert self.session is not None
            if not self.session.on_function_output(parsed.call_id, parsed.output):
                await self.error("unknown_call_id", f"no function call {parsed.call_id!r} is waiting for its output "
                                                    "(answered already, timed out, or never asked)")
            return True
        await self.start_session(parsed)
        return True

    def hang_up(self) -> None:
        """The agent ends the call (end_call, once the goodbye was heard): the call's loop stops the
        session and closes with 1000, as after session.end (on a phone line, closing the media
        stream ends Twilio's <Connect> and Telnyx's stream, and with them the call)."""
        self.agent_hung_up.set()

    async def update_tools(self, tools: list[dict[str, Any]] | None, choice: Any) -> bool:
        """The client's tools for the next replies; an error message says what is wrong with them."""
        if self.toolbox is None:
            return True
        kept = [{"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters}
                for t in self.toolbox.client_tools]
        try:
            self.toolbox.declare(tools if tools is not None else kept, choice)
        except ConfigError as exc:
            await self.error("invalid_tools", str(exc))
            return False
        return True

    async def start_session(self, start: SessionStart) -> None:
        if self.session is not None:
            await self.error("session_already_started", "session.start was already accepted on this connection")
            return
        runtime = self.runtime
        assert runtime.backends is not None
        instructions = start.instructions
        limit = runtime.settings.session.max_instructions_chars
        if instructions is not None and len(instructions) > limit:
            await self.error("instructions_too_long", f"instructions are limited to {limit} characters")
            return
        asked = start.output_audio.sample_rate if start.output_audio else None
        output_rate = asked or runtime.backends.tts.sample_rate
        self.resampler = StreamResampler(start.audio.sample_rate, runtime.backends.vad.sample_rate)
        client = getattr(self.websocket, "client", None)  # the peer address, when the server knows it
        self.call_log = CallLog(runtime, self.session_id, "ws", caller=client.host if client else None)
        self.toolbox = runtime.toolbox()
        if start.end_call is not None:
            self.toolbox.end_call = start.end_call
        if (start.tools or start.tool_choice) and not await self.update_tools(start.tools or [], start.tool_choice):
            return
        self.session = Session(
            runtime.backends, runtime.pipeline_config(), runtime.clock, self.outbound,
            output_rate=output_rate, system_prompt=instructions or None, on_turn=self.on_turn,
            tap=self.call_log.recorder, toolbox=self.toolbox, hang_up=self.hang_up,
        )
        runtime.metrics.sessions.labels("ws").inc()
        await self.outbound.send_json({
            "type": "session.started",
            "session_id": self.session_id,
            "input_audio": {"sample_rate": start.audio.sample_rate, "encoding": "pcm16"},
            "output_audio": {"sample_rate": output_rate, "encoding": "pcm16"},
        })
        self.task = asyncio.create_task(self.session.run())
        runtime.keep_call_task(self.task)
        log.info("%s started (input %d Hz, output %d Hz)", self.session_id, start.audio.sample_rate, output_rate)

    async def handle_audio(self, data: bytes) -> None:
        if self.session is None or self.resampler is None:
            await self.error("session_not_started", "send session.start before any audio")
            return
        if len(data) > self.settings.max_frame_bytes:
            await self.error("frame_too_large",
                             f"audio frames are limited to {self.settings.max_frame_bytes} bytes, got {len(data)}")
            return
        if len(data) % 2:
            await self.error("invalid_audio_frame", f"PCM16 frames need an even number of bytes, got {len(data)}")
            return
        if not data:
            return
        await self.feed(pcm16_to_float(data))

    async def _session_crashed(self) -> None:
        assert self.task is not None
        exc = self.task.exception() if not self.task.cancelled() else None
        log.error("%s: session failed: %r", self.session_id, exc, exc_info=exc)
        self.end_reason, self.end_error = "error", repr(exc)
        code = getattr(exc, "code", "internal_error")
        # the caller gets the code, not the exception's text (which may show the server's insides)
        await self.outbound.send_json(error_json(code, f"the session failed ({code}); please reconnect"))
        await self.close(CLOSE_ERROR)

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
            log.warning("%s ended with %r", self.session_id, exc)
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

    async def close(self, code: int) -> None:
        if self.websocket.application_state == WebSocketState.CONNECTED:
            with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
                await self.websocket.close(code)


@router.websocket("/ws")
async def ws_endpoint(websocket: WebSocket) -> None:
    runtime: Runtime = websocket.app.state.runtime
    await websocket.accept()
    if runtime.draining.is_set():
        await websocket.send_text(json.dumps(error_json("shutting_down", "the server is shutting down; call again")))
        await websocket.close(CLOSE_TRY_LATER, reason="shutting down")
        return
    if not runtime.ready.is_set():
        detail = runtime.load_error or runtime.status
        await websocket.send_text(json.dumps(error_json("not_ready", f"models are not loaded yet ({detail})")))
        await websocket.close(CLOSE_TRY_LATER)
        return
    if len(runtime.sessions) >= runtime.settings.server.max_sessions:
        await websocket.send_text(json.dumps(error_json(
            "server_busy", f"all {runtime.settings.server.max_sessions} call slots are taken; try again later")))
        await websocket.close(CLOSE_TRY_LATER)
        return
    connection = Connection(websocket, runtime)
    runtime.open_session(connection.session_id, "ws")
    runtime.keep_call_task(asyncio.current_task())
    try:
        await connection.run()
    except WebSocketDisconnect:
        pass
    finally:
        connection.release()
        out = connection.outbound
        log.info("%s closed: %d replies, %d deadline misses, %d underruns", connection.session_id, out.turns,
                 out.deadline_misses, out.underruns)
