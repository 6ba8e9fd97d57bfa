"""The native WebSocket transport at /ws (protocol in docs/websocket.md).

The socket is the edge: inbound audio is checked, converted and queued for the call runner
(app/transports/call.py, which resamples it and bounds its backlog); outbound events and audio are
written here, one at a time. A bad message gets an `error` event; the call is closed only when going
on makes no sense.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import APIRouter, WebSocket

from app.metrics import Metrics
from app.runtime import Runtime
from app.transports.call import CLOSE_NORMAL, Call, Message, SocketWriter
from app.transports.native.messages import (
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
from pipeline.audio import pcm16_to_float
from pipeline.events import ErrorEvent, OutEvent
from pipeline.tools import ToolBox

log = logging.getLogger(__name__)
router = APIRouter()


class NativeOutbound:
    """The session's output as the native protocol's JSON events and binary PCM16 frames."""

    def __init__(self, writer: SocketWriter, metrics: Metrics) -> None:
        self.writer = writer
        self.metrics = metrics

    async def send_event(self, event: OutEvent) -> None:
        if isinstance(event, ErrorEvent):
            self.metrics.error(event.code)
        await self.writer.text(json.dumps(event_json(event)))

    async def send_audio(self, pcm16: bytes, turn_id: int) -> None:
        await self.writer.bytes(pcm16)


class NativeWire:
    """/ws messages to the call: session.start/update/end, binary audio, playback reports, the
    client's function outputs."""

    def __init__(self, call: Call) -> None:
        self.call = call
        self.label = call.session_id
        self.settings = call.settings
        self.outbound = NativeOutbound(call.writer, call.runtime.metrics)
        self.toolbox: ToolBox | None = None

    async def report(self, code: str, message: str, bad: bool = False) -> None:
        await self.call.writer.text(json.dumps(error_json(code, message)))

    async def greet(self) -> None:
        """Nothing: the caller speaks first (session.start / the provider's start)."""

    async def goodbye(self) -> None:
        await self.report("server_shutting_down", "the server is shutting down; please call again")

    async def handle(self, message: Message) -> bool:
        call = self.call
        data = message.get("bytes")
        if data is not None:
            await self.handle_audio(data)
            return True
        text = message.get("text")
        if text is None:
            return True
        if len(text.encode()) > self.settings.max_text_bytes:
            await call.bad_message("message_too_large",
                                   f"text messages are limited to {self.settings.max_text_bytes} bytes")
            return True
        try:
            parsed = parse_client_text(text)
        except ProtocolError as exc:
            await call.bad_message(exc.code, str(exc))
            return True
        if isinstance(parsed, SessionEnd):
            await call.stop_session()
            await call.close(CLOSE_NORMAL)
            return False
        if isinstance(parsed, SessionStart):
            await self.start_session(parsed)
            return True
        if call.session is None:
            await call.bad_message("session_not_started", "send session.start first")
            return True
        if isinstance(parsed, OutputAudioPlayed):
            call.session.on_played(parsed.turn_id, parsed.played_ms)
        elif isinstance(parsed, SessionUpdate):
            await self.update_tools(parsed.tools, parsed.tool_choice)
        elif isinstance(parsed, FunctionCallOutput) and not call.session.on_function_output(parsed.call_id,
                                                                                             parsed.output):
            await call.bad_message("unknown_call_id", f"no function call {parsed.call_id!r} is waiting for its "
                                   "output (answered already, timed out, or never asked)")
        return True

    async def update_tools(self, tools: list[dict[str, Any]] | None, choice: Any) -> bool:
        """The client's tools for the next replies; an error message says what is wrong with them."""
        if self.toolbox is None:
            return True
        kept = [{"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters}
                for t in self.toolbox.client_tools]
        try:
            self.toolbox.declare(tools if tools is not None else kept, choice)
        except ConfigError as exc:
            await self.call.bad_message("invalid_tools", str(exc))
            return False
        return True

    async def start_session(self, start: SessionStart) -> None:
        call, runtime = self.call, self.call.runtime
        if call.session is not None or call.call_log is not None:
            await call.bad_message("session_already_started", "session.start was already accepted on this connection")
            return
        assert runtime.backends is not None
        instructions = start.instructions
        limit = runtime.settings.session.max_instructions_chars
        if instructions is not None and len(instructions) > limit:
            await call.bad_message("instructions_too_long", f"instructions are limited to {limit} characters")
            return
        asked = start.output_audio.sample_rate if start.output_audio else None
        output_rate = asked or runtime.backends.tts.sample_rate
        self.toolbox = runtime.toolbox()
        if start.end_call is not None:
            self.toolbox.end_call = start.end_call
        if (start.tools or start.tool_choice) and not await self.update_tools(start.tools or [], start.tool_choice):
            return
        client = getattr(call.websocket, "client", None)  # the peer address, when the server knows it
        await call.writer.text(json.dumps({
            "type": "session.started",
            "session_id": call.session_id,
            "input_audio": {"sample_rate": start.audio.sample_rate, "encoding": "pcm16"},
            "output_audio": {"sample_rate": output_rate, "encoding": "pcm16"},
        }))
        call.start_session(self.outbound, input_rate=start.audio.sample_rate, output_rate=output_rate,
                           toolbox=self.toolbox, system_prompt=instructions or None,
                           caller=client.host if client else None)
        log.info("%s started (input %d Hz, output %d Hz)", call.session_id, start.audio.sample_rate, output_rate)

    async def handle_audio(self, data: bytes) -> None:
        call = self.call
        if call.session is None:
            await call.bad_message("session_not_started", "send session.start before any audio")
            return
        if len(data) > self.settings.max_frame_bytes:
            await call.bad_message("frame_too_large", f"audio frames are limited to "
                                   f"{self.settings.max_frame_bytes} bytes, got {len(data)}")
            return
        if len(data) % 2:
            await call.bad_message("invalid_audio_frame", f"PCM16 frames need an even number of bytes, got {len(data)}")
            return
        if data:
            await call.feed(pcm16_to_float(data))


def native_call(websocket: WebSocket, runtime: Runtime) -> Call:
    """A call on the native protocol (not yet admitted: `Call.serve` does that)."""
    return Call(websocket, runtime, "ws", NativeWire)


@router.websocket("/ws")
async def ws_endpoint(websocket: WebSocket) -> None:
    await native_call(websocket, websocket.app.state.runtime).serve()
