"""A Realtime session's settings: read from `session.update` (GA or beta shape), checked, and
written back in `session.created` / `session.updated`.

What the server cannot do yet is refused with a clear error rather than silently ignored: the
client would otherwise believe it got what it asked for (see docs/realtime.md's table)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from app.transports.realtime.messages import BETA_FORMATS, FORMAT_RATES, GA_FORMATS, RealtimeError, new_id
from pipeline.config import EndpointingConfig

TURN_DETECTIONS = ("server_vad", "semantic_vad")


@dataclass(frozen=True)
class RealtimeSettings:
    model: str
    instructions: str = ""
    input_format: str = "pcm"  # pcm (24 kHz PCM16), pcmu, pcma (8 kHz G.711)
    output_format: str = "pcm"
    voice: str = "alloy"  # echoed: the server speaks with its own TTS voice (tts.voice)
    turn_detection: dict[str, Any] | None = field(default_factory=lambda: {
        "type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500,
        "create_response": True, "interrupt_response": True, "idle_timeout_ms": None})
    transcription: dict[str, Any] | None = None  # echoed: the server transcribes with its own Whisper
    speaks: bool = True  # output_modalities ["audio"] (with its transcript); False: ["text"]
    vad_asked: tuple[tuple[str, Any], ...] = ()  # the turn_detection values the client itself set
    tools: tuple[dict[str, Any], ...] = ()  # the client's functions (checked by the call's ToolBox)
    tool_choice: Any = "auto"
    id: str = field(default_factory=lambda: new_id("sess"))

    def endpointing(self, base: EndpointingConfig) -> EndpointingConfig:
        """The server's end-of-turn settings with what the client asked for applied: server_vad's
        threshold and prefix_padding_ms as they are, its silence_duration_ms as the longest pause
        waited out (the server's end-of-turn detection may end a turn sooner); semantic_vad's
        eagerness as more patience (low: twice) or less (high: half)."""
        asked = dict(self.vad_asked)
        update: dict[str, Any] = {}
        if isinstance(asked.get("threshold"), int | float) and 0 < asked["threshold"] < 1:
            update["threshold"] = float(asked["threshold"])
        if isinstance(asked.get("prefix_padding_ms"), int) and asked["prefix_padding_ms"] >= 0:
            update["prefix_padding_ms"] = asked["prefix_padding_ms"]
        if isinstance(asked.get("silence_duration_ms"), int) and asked["silence_duration_ms"] >= 64:
            update["max_patience_ms"] = min(base.max_patience_ms, asked["silence_duration_ms"])
            update["end_silence_ms"] = asked["silence_duration_ms"]
        scale = {"low": 2.0, "high": 0.5}.get(str(asked.get("eagerness")))
        if scale is not None:
            update["max_patience_ms"] = int(base.max_patience_ms * scale)
        return base.model_copy(update=update)

    @property
    def answers_turns(self) -> bool:
        """The server answers each turn its turn detection ends (create_response), else the client asks."""
        return self.turn_detection is not None and self.turn_detection.get("create_response", True) is not False

    @property
    def interrupts(self) -> bool:
        """The caller's speech pauses the reply, and a word stops it (interrupt_response)."""
        return self.turn_detection is None or self.turn_detection.get("interrupt_response", True) is not False

    @property
    def idle_timeout_s(self) -> float | None:
        """turn_detection's idle_timeout_ms: how long the caller may stay silent after a reply has
        played before the server answers them anyway (None: never)."""
        idle = self.turn_detection.get("idle_timeout_ms") if self.turn_detection is not None else None
        return idle / 1000 if isinstance(idle, int) else None

    @property
    def input_rate(self) -> int:
        return FORMAT_RATES[self.input_format]

    @property
    def output_rate(self) -> int:
        return FORMAT_RATES[self.output_format]

    def updated(self, session: Any, beta: bool) -> RealtimeSettings:
        """These settings with a client's `session` object applied; RealtimeError when it asks for
        something this server does not do."""
        if not isinstance(session, dict):
            raise RealtimeError("invalid_value", "session must be an object", "session")
        return _beta_update(self, session) if beta else _ga_update(self, session)

    def as_ga(self) -> dict[str, Any]:
        formats = {v: k for k, v in GA_FORMATS.items()}

        def fmt(name: str) -> dict[str, Any]:
            return {"type": formats[name], **({"rate": 24000} if name == "pcm" else {})}

        return {
            "type": "realtime", "object": "realtime.session", "id": self.id, "model": self.model,
            "output_modalities": ["audio"] if self.speaks else ["text"], "instructions": self.instructions,
            "audio": {
                "input": {"format": fmt(self.input_format), "transcription": self.transcription,
                          "noise_reduction": None, "turn_detection": self.turn_detection},
                "output": {"format": fmt(self.output_format), "voice": self.voice, "speed": 1.0},
            },
            "tools": list(self.tools), "tool_choice": self.tool_choice, "max_output_tokens": "inf",
        }

    def as_beta(self) -> dict[str, Any]:
        formats = {v: k for k, v in BETA_FORMATS.items()}
        return {
            "object": "realtime.session", "id": self.id, "model": self.model,
            "modalities": ["audio", "text"] if self.speaks else ["text"],
            "instructions": self.instructions, "voice": self.voice,
            "input_audio_format": formats[self.input_format], "output_audio_format": formats[self.output_format],
            "input_audio_transcription": self.transcription, "turn_detection": self.turn_detection,
            "tools": list(self.tools), "tool_choice": self.tool_choice, "max_response_output_tokens": "inf",
        }


def _ga_update(current: RealtimeSettings, session: dict[str, Any]) -> RealtimeSettings:
    kind = session.get("type", "realtime")
    if kind != "realtime":
        raise RealtimeError("invalid_value", f"session.type {kind!r}: only 'realtime' sessions are served here "
                            "(transcription sessions are not)", "session.type")
    new = _common(current, session)
    if "output_modalities" in session:
        new = replace(new, speaks=parse_modalities(session["output_modalities"], "session.output_modalities"))
    audio = session.get("audio") or {}
    if not isinstance(audio, dict):
        raise RealtimeError("invalid_value", "session.audio must be an object", "session.audio")
    audio_in, audio_out = audio.get("input") or {}, audio.get("output") or {}
    if "format" in audio_in:
        new = replace(new, input_format=_ga_format(audio_in["format"], "session.audio.input.format"))
    if "format" in audio_out:
        new = replace(new, output_format=_ga_format(audio_out["format"], "session.audio.output.format"))
    if "turn_detection" in audio_in:
        new = _with_turn_detection(new, audio_in["turn_detection"], "session.audio.input.turn_detection")
    if "transcription" in audio_in:
        new = replace(new, transcription=audio_in["transcription"])
    if isinstance(audio_out.get("voice"), str | dict):
        voice = audio_out["voice"]
        new = replace(new, voice=voice if isinstance(voice, str) else str(voice.get("id", "")))
    return new


def _beta_update(current: RealtimeSettings, session: dict[str, Any]) -> RealtimeSettings:
    new = _common(current, session)
    if "modalities" in session:
        new = replace(new, speaks=parse_modalities(session["modalities"], "session.modalities"))
    for key, attr in (("input_audio_format", "input_format"), ("output_audio_format", "output_format")):
        if key in session:
            name = session[key]
            if name not in BETA_FORMATS:
                raise RealtimeError("invalid_value", f"session.{key} {name!r}: one of {sorted(BETA_FORMATS)}",
                                    f"session.{key}")
            new = replace(new, input_format=BETA_FORMATS[name]) if attr == "input_format" else replace(
                new, output_format=BETA_FORMATS[name])
    if "turn_detection" in session:
        new = _with_turn_detection(new, session["turn_detection"], "session.turn_detection")
    if "input_audio_transcription" in session:
        new = replace(new, transcription=session["input_audio_transcription"])
    if isinstance(session.get("voice"), str):
        new = replace(new, voice=session["voice"])
    return new


def _common(current: RealtimeSettings, session: dict[str, Any]) -> RealtimeSettings:
    new = current
    if "model" in session and isinstance(session["model"], str):
        new = replace(new, model=session["model"])
    if "instructions" in session:
        if not isinstance(session["instructions"], str):
            raise RealtimeError("invalid_value", "session.instructions must be a string", "session.instructions")
        new = replace(new, instructions=session["instructions"])
    if "tools" in session:
        tools = session["tools"]
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise RealtimeError("invalid_value", "session.tools must be a list of function objects", "session.tools")
        new = replace(new, tools=tuple(tools))
    if "tool_choice" in session:
        new = replace(new, tool_choice=session["tool_choice"])
    return new


def parse_modalities(modalities: Any, param: str) -> bool:
    """Whether replies are spoken: ["audio"] (GA; beta ["audio", "text"]) or ["text"]."""
    if isinstance(modalities, list) and modalities and set(modalities) <= {"audio", "text"}:
        return "audio" in modalities
    raise RealtimeError("invalid_value", f"{param} {modalities!r}: [\"audio\"] or [\"text\"]", param)


def _ga_format(value: Any, param: str) -> str:
    if not isinstance(value, dict) or value.get("type") not in GA_FORMATS:
        raise RealtimeError("invalid_value", f"{param}: type must be one of {sorted(GA_FORMATS)}", param)
    name = GA_FORMATS[value["type"]]
    rate = value.get("rate")
    if rate is not None and rate != FORMAT_RATES[name]:
        raise RealtimeError("invalid_value", f"{param}: {value['type']} is {FORMAT_RATES[name]} Hz, not {rate}",
                            f"{param}.rate")
    return name


def _with_turn_detection(current: RealtimeSettings, value: Any, param: str) -> RealtimeSettings:
    if value is None:  # the client commits its turns (input_audio_buffer.commit) and asks for replies
        return replace(current, turn_detection=None, vad_asked=())
    detection = _turn_detection(value, current.turn_detection or {}, param)
    same_kind = current.turn_detection is not None and detection["type"] == current.turn_detection["type"]
    asked = {**(dict(current.vad_asked) if same_kind else {}),
             **{k: v for k, v in value.items() if k not in ("type", "create_response", "interrupt_response")}}
    return replace(current, turn_detection=detection, vad_asked=tuple(sorted(asked.items())))


def _turn_detection(value: Any, current: dict[str, Any], param: str) -> dict[str, Any]:
    if not isinstance(value, dict) or value.get("type") not in TURN_DETECTIONS:
        raise RealtimeError("invalid_value", f"{param}.type must be one of {list(TURN_DETECTIONS)}", f"{param}.type")
    for flag in ("create_response", "interrupt_response"):
        if not isinstance(value.get(flag, True), bool):
            raise RealtimeError("invalid_value", f"{param}.{flag} must be true or false", f"{param}.{flag}")
    idle = value.get("idle_timeout_ms")
    if idle is not None and (not isinstance(idle, int) or isinstance(idle, bool) or idle < 1):
        raise RealtimeError("invalid_value", f"{param}.idle_timeout_ms must be a whole number of ms, 1 or more, or "
                            "null", f"{param}.idle_timeout_ms")
    kept = {k: v for k, v in current.items() if k != "type" and k != "eagerness"} or {
        "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500, "idle_timeout_ms": None}
    if value["type"] == "semantic_vad":
        kept = {"create_response": True, "interrupt_response": True, "eagerness": "auto"}
    return {"create_response": True, "interrupt_response": True, **kept, **value}
