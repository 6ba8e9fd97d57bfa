"""The native WebSocket protocol at /ws: client messages (validated with pydantic) and the JSON
the server sends for each pipeline event. docs/websocket.md describes it for client authors."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from app.call_log import turn_json
from core.errors import ProtocolError
from pipeline.audio import SUPPORTED_INPUT_RATES
from pipeline.events import (
    ErrorEvent,
    FunctionCallDelta,
    FunctionCallRequest,
    OutEvent,
    ReplyText,
    ResponseDone,
    SpeechStarted,
    SpeechStopped,
    TranscriptFinal,
    TranscriptPartial,
)


class AudioFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sample_rate: int
    encoding: Literal["pcm16"] = "pcm16"


class OutputAudioFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sample_rate: int | None = None
    encoding: Literal["pcm16"] = "pcm16"


class SessionStart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["session.start"]
    audio: AudioFormat
    output_audio: OutputAudioFormat | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None  # the client's tools, in OpenAI's function shape
    tool_choice: str | dict[str, Any] | None = None
    end_call: bool | None = None  # offer the built-in end_call tool (default: tools.end_call)


class SessionUpdate(BaseModel):
    """Changes the call's tools from the next reply on (fields left out stay as they are)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["session.update"]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None


class FunctionCallOutput(BaseModel):
    """The client's result of a call it was asked to run (response.function_call)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["function_call.output"]
    call_id: str = Field(min_length=1, max_length=200)
    output: str


class SessionEnd(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["session.end"]


class OutputAudioPlayed(BaseModel):
    """The client's playback clock: `played_ms` of the turn's reply audio have been played."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["output_audio.played"]
    turn_id: int = Field(ge=0)
    played_ms: float = Field(ge=0, le=24 * 3600 * 1000)


Message = SessionStart | SessionEnd | OutputAudioPlayed | SessionUpdate | FunctionCallOutput
ClientMessage = Annotated[Message, Field(discriminator="type")]
_client = TypeAdapter(ClientMessage)
CLIENT_TYPES = ("session.start", "session.end", "output_audio.played", "session.update", "function_call.output")
OUTPUT_RATES = (8000, 16000, 22050, 24000, 44100, 48000)


def parse_client_text(data: str) -> Message:
    """Parse one text message, or raise ProtocolError with a message a client author can act on."""
    try:
        raw = json.loads(data)
    except json.JSONDecodeError as exc:
        raise ProtocolError("invalid_json", f"text messages must be JSON objects: {exc.msg} at char {exc.pos}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise ProtocolError("invalid_message", 'a message must be a JSON object with a string "type"')
    if raw["type"] not in CLIENT_TYPES:
        raise ProtocolError("unknown_type", f"unknown message type {raw['type']!r}; expected one of {CLIENT_TYPES}")
    try:
        message: Message = _client.validate_python(raw)
    except ValidationError as exc:
        details = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ProtocolError("invalid_message", f"{raw['type']}: {details}") from exc
    if isinstance(message, SessionStart):
        if message.audio.sample_rate not in SUPPORTED_INPUT_RATES:
            raise ProtocolError(
                "unsupported_sample_rate",
                f"audio.sample_rate {message.audio.sample_rate} is not supported; use one of {SUPPORTED_INPUT_RATES}",
            )
        out_rate = message.output_audio.sample_rate if message.output_audio else None
        if out_rate is not None and out_rate not in OUTPUT_RATES:
            raise ProtocolError(
                "unsupported_sample_rate",
                f"output_audio.sample_rate {out_rate} is not supported; use one of {OUTPUT_RATES}",
            )
    return message


def event_json(event: OutEvent) -> dict[str, Any]:
    """The wire form of a pipeline event."""
    if isinstance(event, SpeechStarted):
        return {"type": "speech.started", "turn_id": event.turn_id, "audio_start_ms": round(event.audio_ms)}
    if isinstance(event, SpeechStopped):
        ended_by = "max_turn" if event.forced else "turn_model" if event.turn_probability is not None else "silence"
        stopped: dict[str, Any] = {"type": "speech.stopped", "turn_id": event.turn_id,
                                   "audio_end_ms": round(event.audio_ms), "ended_by": ended_by}
        if event.turn_probability is not None:
            stopped["turn_probability"] = round(event.turn_probability, 3)
        return stopped
    if isinstance(event, TranscriptPartial):
        return {"type": "transcript.partial", "turn_id": event.turn_id, "text": event.text}
    if isinstance(event, TranscriptFinal):
        return {"type": "transcript.final", "turn_id": event.turn_id, "text": event.text}
    if isinstance(event, ReplyText):
        return {"type": "response.text.delta", "turn_id": event.turn_id, "text": event.text}
    if isinstance(event, ResponseDone):
        return {"type": "response.done", **turn_json(event)}
    if isinstance(event, FunctionCallDelta):
        return {"type": "response.function_call_arguments.delta", "turn_id": event.turn_id, "call_id": event.call_id,
                "name": event.name, "delta": event.delta}
    if isinstance(event, FunctionCallRequest):
        return {"type": "response.function_call", "turn_id": event.turn_id, "call_id": event.call.call_id,
                "name": event.call.name, "arguments": event.call.arguments}
    if isinstance(event, ErrorEvent):
        out: dict[str, Any] = {"type": "error", "code": event.code, "message": event.message}
        if event.turn_id is not None:
            out["turn_id"] = event.turn_id
        return out
    raise TypeError(f"no wire form for {type(event).__name__}")


def error_json(code: str, message: str) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message}
