"""The OpenAI Realtime API's shapes: event names in their GA and beta spellings, items, responses,
errors. Everything the server writes goes through `Dialect`, so a beta client (`OpenAI-Beta:
realtime=v1`) gets the beta names and an item's content in the beta types."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

# GA name -> beta name, where they differ (every other event is spelled the same)
BETA_NAMES = {
    "conversation.item.added": "conversation.item.created",
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
}
GA_ONLY = frozenset({"conversation.item.done"})  # the beta API has no such event

# wire format names: GA `audio.*.format.type`, beta `*_audio_format`, both to the codec used here
GA_FORMATS = {"audio/pcm": "pcm", "audio/pcmu": "pcmu", "audio/pcma": "pcma"}
BETA_FORMATS = {"pcm16": "pcm", "g711_ulaw": "pcmu", "g711_alaw": "pcma"}
FORMAT_RATES = {"pcm": 24000, "pcmu": 8000, "pcma": 8000}


class RealtimeError(ValueError):
    """A client event the server will not take: OpenAI's error `code`, what to do, the field at fault."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param


class ServerFailure(RealtimeError):
    """The server failed on a client event (the recognizer, say): not the client's fault, so it is told
    with an error of type server_error and not counted against it (server.max_protocol_errors). The
    message says what to do; the detail stays in the server's log."""


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@dataclass(frozen=True)
class Dialect:
    beta: bool

    def name(self, ga_name: str) -> str | None:
        """The event's name in this dialect; None when the dialect has no such event."""
        if self.beta:
            return None if ga_name in GA_ONLY else BETA_NAMES.get(ga_name, ga_name)
        return ga_name

    def event(self, ga_name: str, **fields: Any) -> dict[str, Any] | None:
        name = self.name(ga_name)
        if name is None:
            return None
        return {"type": name, "event_id": new_id("event"), **fields}

    def audio_part(self, transcript: str | None) -> dict[str, Any]:
        """An assistant item's audio content (GA `output_audio`, beta `audio`)."""
        return {"type": "audio" if self.beta else "output_audio", "transcript": transcript}

    def text_part(self, text: str) -> dict[str, Any]:
        return {"type": "text" if self.beta else "output_text", "text": text}


def message_item(item_id: str, role: str, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": item_id, "object": "realtime.item", "type": "message", "role": role, "status": status,
            "content": content}


def error_event(dialect: Dialect, code: str, message: str, *, kind: str = "invalid_request_error",
                param: str | None = None, event_id: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape; `event_id` names the client event it answers."""
    event = dialect.event("error", error={"type": kind, "code": code, "message": message, "param": param,
                                          "event_id": event_id})
    assert event is not None
    return event
