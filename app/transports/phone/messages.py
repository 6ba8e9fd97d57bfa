"""The frames of the phone transports (docs/phone.md). Twilio Media Streams and Telnyx media
streaming send the same events (`connected`, `start`, `media`, `dtmf`, `mark`, `stop`) and take the
same ones (`media`, `mark`, `clear`); they differ in field names (camelCase `streamSid` against
snake_case `stream_id`) and in how `start` describes the call. A `Provider` holds the differences.

Audio is 8 kHz mono G.711 mu-law, base64, no header, both ways.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.alias_generators import to_camel

from core.errors import ProtocolError

SAMPLE_RATE = 8000
FRAME_SAMPLES = SAMPLE_RATE * 20 // 1000  # one 20 ms media frame: 160 mu-law bytes
DTMF_DIGITS = frozenset("0123456789*#ABCD")
_MARK = re.compile(r"t(\d{1,9}):(\d{1,12})")


def mark_name(turn_id: int, sent_ms: int) -> str:
    """A mark's name says which turn's reply audio it follows and how much of it was sent before it:
    "t3:1400" is echoed once the first 1400 ms of turn 3's reply have played."""
    return f"t{turn_id}:{sent_ms}"


def parse_mark(name: str) -> tuple[int, int] | None:
    """(turn id, ms of that turn's reply audio played) from an echoed mark, or None if it is not ours."""
    found = _MARK.fullmatch(name)
    return (int(found.group(1)), int(found.group(2))) if found else None


# -- what the provider sends ---------------------------------------------------------------------


@dataclass(frozen=True)
class Connected:
    pass


@dataclass(frozen=True)
class CallStart:
    stream_id: str
    call_id: str  # Twilio's callSid, Telnyx's call_control_id
    parameters: dict[str, str]  # Twilio's <Parameter>s (customParameters), Telnyx's custom_parameters


@dataclass(frozen=True)
class Media:
    payload: bytes  # mu-law
    track: str | None


@dataclass(frozen=True)
class Dtmf:
    digit: str


@dataclass(frozen=True)
class Mark:
    name: str


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class ProviderError:
    """Telnyx's `error` event: it found fault with a frame the server sent."""

    detail: str


Frame = Connected | CallStart | Media | Dtmf | Mark | Stop | ProviderError


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _MediaBody(_Lenient):
    payload: str
    track: str | None = None


class _MediaFrame(_Lenient):
    event: Literal["media"]
    media: _MediaBody


class _DigitBody(_Lenient):
    digit: str


class _DtmfFrame(_Lenient):
    event: Literal["dtmf"]
    dtmf: _DigitBody


class _MarkBody(_Lenient):
    name: str


class _MarkFrame(_Lenient):
    event: Literal["mark"]
    mark: _MarkBody


class _ConnectedFrame(_Lenient):
    event: Literal["connected"]


class _StopFrame(_Lenient):
    event: Literal["stop"]


class _ErrorFrame(_Lenient):
    """Telnyx only; what it says is passed on as JSON text, whatever its shape."""

    event: Literal["error"]


class _Format(_Lenient):
    encoding: str
    sample_rate: int
    channels: int = 1


class _TwilioFormat(_Format):
    model_config = ConfigDict(extra="ignore", alias_generator=to_camel)


class _TwilioCall(_Lenient):
    model_config = ConfigDict(extra="ignore", alias_generator=to_camel)
    stream_sid: str
    call_sid: str
    custom_parameters: dict[str, Any] = {}
    media_format: _TwilioFormat


class _TwilioStart(_Lenient):
    event: Literal["start"]
    start: _TwilioCall


class _TelnyxCall(_Lenient):
    call_control_id: str
    custom_parameters: dict[str, Any] = {}
    media_format: _Format


class _TelnyxStart(_Lenient):
    event: Literal["start"]
    stream_id: str
    start: _TelnyxCall


# Every frame a provider takes, told apart by `event`; an event not listed is `union_tag_invalid`.
_TwilioFrame = Annotated[_MediaFrame | _DtmfFrame | _MarkFrame | _ConnectedFrame | _StopFrame | _TwilioStart,
                         Field(discriminator="event")]
_TelnyxFrame = Annotated[_MediaFrame | _DtmfFrame | _MarkFrame | _ConnectedFrame | _StopFrame | _TelnyxStart
                         | _ErrorFrame, Field(discriminator="event")]
_FRAMES: dict[str, TypeAdapter[Any]] = {"twilio": TypeAdapter(_TwilioFrame), "telnyx": TypeAdapter(_TelnyxFrame)}


# -- the providers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Provider:
    name: str  # "twilio" | "telnyx": also the `transport` label in /metrics
    stream_key: str  # the stream id's field in frames
    encoding: str  # the media format `start` must announce
    stream_in_replies: bool  # whether frames sent to the provider name the stream

    def parse(self, text: str, max_payload_bytes: int) -> Frame:
        """One text frame, or ProtocolError saying what is wrong with it."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ProtocolError("invalid_json", f"not JSON: {exc.msg} at char {exc.pos}") from exc
        if not isinstance(raw, dict) or not isinstance(raw.get("event"), str):
            raise ProtocolError("invalid_message", 'a frame must be a JSON object with a string "event"')
        event = raw["event"]
        try:
            frame = _FRAMES[self.name].validate_python(raw)
        except ValidationError as exc:
            errors = exc.errors()
            if any(e["type"] == "union_tag_invalid" for e in errors):
                raise ProtocolError("unknown_event", f"unknown event {event[:40]!r}") from exc
            # each error's loc starts with the event (the union's tag): the rest is the field's path
            details = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in errors)
            raise ProtocolError("invalid_message", f"{event}: {details}") from exc
        match frame:
            case _MediaFrame(media=media):
                return _media(media, max_payload_bytes)
            case _TwilioStart(start=call):
                return self._start(CallStart(call.stream_sid, call.call_sid, _strings(call.custom_parameters)),
                                   call.media_format)
            case _TelnyxStart(stream_id=stream_id, start=call):
                return self._start(CallStart(stream_id, call.call_control_id, _strings(call.custom_parameters)),
                                   call.media_format)
            case _DtmfFrame(dtmf=_DigitBody(digit=digit)):
                if digit not in DTMF_DIGITS:
                    raise ProtocolError("invalid_dtmf", f"dtmf digit {digit[:8]!r} is not one of 0-9 * # A-D")
                return Dtmf(digit)
            case _MarkFrame(mark=mark):
                return Mark(mark.name)
            case _ConnectedFrame():
                return Connected()
            case _StopFrame():
                return Stop()
            case _ErrorFrame():
                return ProviderError(json.dumps(raw.get("payload", raw))[:500])
        raise AssertionError(f"no frame for {type(frame).__name__}")  # the union and the match list the same

    def _start(self, start: CallStart, fmt: _Format) -> CallStart:
        if fmt.encoding.lower() != self.encoding.lower() or fmt.sample_rate != SAMPLE_RATE or fmt.channels != 1:
            raise ProtocolError(
                "unsupported_media_format",
                f"media format {fmt.encoding} {fmt.sample_rate} Hz x{fmt.channels}; this server takes "
                f"{self.encoding} {SAMPLE_RATE} Hz mono")
        return start

    # -- what the server sends --------------------------------------------------------------------
    def media(self, stream_id: str, mulaw: bytes) -> dict[str, Any]:
        return self._frame("media", stream_id, media={"payload": base64.b64encode(mulaw).decode()})

    def mark(self, stream_id: str, name: str) -> dict[str, Any]:
        return self._frame("mark", stream_id, mark={"name": name})

    def clear(self, stream_id: str) -> dict[str, Any]:
        return self._frame("clear", stream_id)

    def _frame(self, event: str, stream_id: str, **body: Any) -> dict[str, Any]:
        frame: dict[str, Any] = {"event": event}
        if self.stream_in_replies:
            frame[self.stream_key] = stream_id
        return {**frame, **body}


def _media(body: _MediaBody, max_payload_bytes: int) -> Media:
    if len(body.payload) * 3 // 4 > max_payload_bytes + 2:
        raise ProtocolError("payload_too_large",
                            f"a media payload of ~{len(body.payload) * 3 // 4} bytes; the limit is {max_payload_bytes} "
                            "(phone.max_media_payload_bytes)")
    try:
        payload = base64.b64decode(body.payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ProtocolError("invalid_audio_payload", f"media.payload is not base64: {exc}") from exc
    return Media(payload, body.track)


def _strings(values: dict[str, Any]) -> dict[str, str]:
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in values.items()}


# Twilio names the stream in every frame it takes; Telnyx's frames to it carry none (one stream per
# socket).
TWILIO = Provider("twilio", "streamSid", "audio/x-mulaw", stream_in_replies=True)
TELNYX = Provider("telnyx", "stream_id", "PCMU", stream_in_replies=False)
