"""The OpenAI Realtime API at /v1/realtime (docs/realtime.md): client events to the call runner.

The session's settings are the client's until its first audio or response: then the pipeline's
Session starts with them (the audio formats fix its rates). GA event names by default, the beta
ones when the client sent `OpenAI-Beta: realtime=v1`. A bad event gets OpenAI's `error` event,
naming the client's `event_id`, and the call goes on (the call runner closes it after
server.max_protocol_errors of them)."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import logging
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, WebSocket

from app.runtime import Runtime
from app.security.guard import MINTED_SESSION, rate_limits
from app.transports.call import Call, Message
from app.transports.realtime.idle import IdleTimer
from app.transports.realtime.items import item_message
from app.transports.realtime.messages import (
    Dialect,
    RealtimeError,
    ServerFailure,
    error_event,
    message_item,
    new_id,
)
from app.transports.realtime.outbound import RealtimeOutbound
from app.transports.realtime.settings import RealtimeSettings, parse_modalities
from core.errors import ConfigError
from models.llm.tool_calls import Tools
from models.protocols import ChatMessage
from pipeline.audio import alaw_to_pcm16, mulaw_to_pcm16, pcm16_to_float, resample

log = logging.getLogger(__name__)
router = APIRouter()
PATH = "/v1/realtime"
MAX_PENDING_ITEMS = 64  # typed messages waiting for a response.create


class RealtimeWire:
    def __init__(self, call: Call, dialect: Dialect, model: str) -> None:
        self.call = call
        self.dialect = dialect
        self.label = call.session_id
        self.settings = RealtimeSettings(model=model, id=call.session_id)
        self.outbound: RealtimeOutbound | None = None
        self.pending_text: list[tuple[str | None, str]] = []  # user messages not yet answered: (item id, words)
        # an item the client added, in the history -> (the turn it is kept under, its role, its words): delete
        self.typed: dict[str, tuple[int, str, str]] = {}
        self.pending_outputs: list[tuple[str, str]] = []  # function_call_output items, given at response.create
        self.buffer: list[np.ndarray] = []  # turn_detection null: the caller's audio until they commit it
        self.buffered = 0  # its samples
        # The call's tools: the client's (session.tools) and the server's own. No spoken filler or
        # acknowledgement while a call runs: a Realtime client waits for its function's result in
        # silence, or speaks its own (OpenAI's says only what its model writes).
        self.toolbox = call.runtime.toolbox()
        self.toolbox.config = self.toolbox.config.model_copy(update={"filler": "", "acknowledgement": ""})
        self.event_id: str | None = None  # the client event being handled, for its error
        self.param: str | None = None  # the field it got wrong
        self.limit = call.runtime.settings.realtime.max_event_bytes
        self.idle = IdleTimer(call.runtime.clock, self._idle)
        self.input_samples = 0  # the caller's audio appended so far (the input buffer's clock)

    # -- the call runner's Wire ----------------------------------------------------------------------
    async def report(self, code: str, message: str, bad: bool = False) -> None:
        await self.call.writer.text(json.dumps(error_event(self.dialect, code, message, param=self.param,
                                                           event_id=self.event_id)))

    async def goodbye(self) -> None:
        await self.report("server_shutting_down", "the server is shutting down; please reconnect")

    async def greet(self) -> None:
        """The call is admitted: the session exists for the client from now on (session.created)."""
        self.call.started = True
        await self._send("session.created", session=self._session_json())

    async def handle(self, message: Message) -> bool:
        self.event_id = self.param = None
        text = message.get("text")
        if text is None:
            if message.get("bytes") is not None:
                await self.call.bad_message("binary_frame", "binary frames are not part of the Realtime "
                                            "API: send input_audio_buffer.append with base64 audio")
            return True
        if len(text) > self.limit or len(text.encode()) > self.limit:
            await self.call.bad_message("event_too_large", f"client events are limited to {self.limit} bytes "
                                        "(realtime.max_event_bytes); send audio in smaller appends")
            return True
        try:
            event = json.loads(text)
        except json.JSONDecodeError as exc:
            await self.call.bad_message("invalid_json", f"the event is not JSON: {exc.msg} at {exc.pos}")
            return True
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            await self.call.bad_message("invalid_event", "an event is a JSON object with a string `type`")
            return True
        if isinstance(event.get("event_id"), str):
            self.event_id = event["event_id"][:200]
        handler = HANDLERS.get(event["type"])
        if handler is None:
            await self._refuse("invalid_event", f"unknown event type {event['type'][:80]!r}", "type")
            return True
        try:
            await getattr(self, handler.__name__)(event)  # a subclass's own, where it has one
        except ServerFailure as exc:  # ours, not the client's: told, not counted, and the call goes on
            self.param = exc.param
            self.call.runtime.metrics.error(exc.code)
            await self.call.writer.text(json.dumps(error_event(self.dialect, exc.code, str(exc), kind="server_error",
                                                               param=exc.param, event_id=self.event_id)))
        except RealtimeError as exc:
            await self._refuse(exc.code, str(exc), exc.param)
        return True

    async def _refuse(self, code: str, message: str, param: str | None) -> None:
        self.param = param
        await self.call.bad_message(code, message)

    def adopt(self, settings: RealtimeSettings) -> None:
        """The session's settings before the call starts (an ephemeral key's, a WebRTC offer's), its tools
        declared; RealtimeError when they are not good."""
        if settings.tools or settings.tool_choice != self.settings.tool_choice:
            self._declare(settings)
        self.settings = settings

    def _declare(self, settings: RealtimeSettings) -> None:
        try:
            self.toolbox.declare(list(settings.tools), settings.tool_choice)
        except ConfigError as exc:
            raise RealtimeError("invalid_tools", str(exc), "session.tools") from exc

    # -- client events -------------------------------------------------------------------------------
    async def session_update(self, event: dict[str, Any]) -> None:
        new = self.settings.updated(event.get("session"), self.dialect.beta)
        if self.outbound is not None and (new.input_format, new.output_format) != (
                self.settings.input_format, self.settings.output_format):
            raise RealtimeError("unsupported", "the audio formats cannot change once audio has been sent or a "
                                "response made; open a new session", "session.audio")
        if (new.tools, new.tool_choice) != (self.settings.tools, self.settings.tool_choice):
            self._declare(new)
        if self.call.session is not None and new.instructions != self.settings.instructions:
            self.call.session.set_instructions(new.instructions or self._default_prompt())
        self.settings = new
        self._apply()
        await self._send("session.updated", session=self._session_json())

    def _samples(self, audio: Any, param: str) -> np.ndarray:
        """Base64 audio in the session's input format, as float samples at its rate."""
        if not isinstance(audio, str):
            raise RealtimeError("invalid_value", f"`{param}` must be base64 audio", param)
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise RealtimeError("invalid_value", f"`{param}` is not base64: {exc}", param) from exc
        fmt = self.settings.input_format
        if fmt == "pcm" and len(data) % 2:
            raise RealtimeError("invalid_value", f"audio/pcm is 16-bit: {len(data)} bytes is not a whole sample",
                                param)
        return pcm16_to_float(data if fmt == "pcm" else mulaw_to_pcm16(data) if fmt == "pcmu" else alaw_to_pcm16(data))

    async def _transcribe(self, samples: np.ndarray, param: str | None = None) -> str:
        """The server's Whisper on the client's audio; whatever the recognizer raises ends this event
        with a ServerFailure (an error event), never the call."""
        backends = self.call.runtime.backends
        assert backends is not None
        audio = resample(samples, self.input_rate, backends.asr.sample_rate)
        try:
            text: str = await backends.asr_worker.run(backends.asr.transcribe, audio)
        except Exception as exc:
            log.error("%s: the recognizer failed on %.1f s of the client's audio: %r", self.label,
                      len(samples) / self.input_rate, exc, exc_info=exc)
            raise ServerFailure("transcription_failed", "the speech recognizer failed on this audio, so nothing was "
                                "added for it; send it again, or the words as text", param) from exc
        return text.strip()

    @property
    def input_rate(self) -> int:
        """The rate of the caller's audio as it reaches the wire (the input format's)."""
        return self.settings.input_rate

    async def audio_append(self, event: dict[str, Any]) -> None:
        await self.take_audio(self._samples(event.get("audio"), "audio"))

    async def take_audio(self, samples: np.ndarray) -> None:
        """The caller's audio at `input_rate`: to the session (server turn detection), or to the
        buffer the client commits (turn_detection null)."""
        self._start()
        if not len(samples):
            return
        self.input_samples += len(samples)
        if self.settings.turn_detection is not None:
            return await self.call.feed(samples)
        limit = int(self.call.runtime.settings.endpointing.max_turn_s * self.input_rate)
        if self.buffered + len(samples) > limit:
            raise RealtimeError("input_audio_buffer_full", f"the input audio buffer holds at most "
                                f"{limit / self.input_rate:g} s (endpointing.max_turn_s): commit or clear it")
        self.buffer.append(samples)
        self.buffered += len(samples)

    async def audio_commit(self, event: dict[str, Any]) -> None:
        """turn_detection null: the client ends its turn; the buffer becomes a user message,
        transcribed, that the next response.create answers."""
        detection = self.settings.turn_detection
        if detection is not None:
            raise RealtimeError("unsupported", f"with {detection['type']} the server commits the caller's audio itself "
                                "at the end of their speech; set turn_detection null to commit it yourself")
        rate = self.input_rate
        if self.buffered < rate // 10:
            raise RealtimeError("input_audio_buffer_commit_empty", f"the buffer holds {1000 * self.buffered // rate} "
                                "ms of audio; commit at least 100 ms")
        self._start()
        outbound = self.outbound
        assert outbound is not None
        audio = np.concatenate(self.buffer)
        self.buffer, self.buffered = [], 0
        item_id = new_id("item")
        await self._send("input_audio_buffer.committed", item_id=item_id, previous_item_id=outbound.last_item)
        await outbound.add_item(message_item(item_id, "user", "completed", [{"type": "input_audio",
                                                                             "transcript": None}]))
        try:
            text = await self._transcribe(audio)
        except ServerFailure as exc:  # the item stays, without a transcript, as OpenAI's does
            await self._send("conversation.item.input_audio_transcription.failed", item_id=item_id, content_index=0,
                             error={"type": "transcription_error", "code": exc.code, "message": str(exc),
                                    "param": None})
            raise
        await outbound.transcribed(item_id, text, len(audio) / rate)
        if text:
            self.pending_text.append((item_id, text))

    async def audio_clear(self, event: dict[str, Any]) -> None:
        detection = self.settings.turn_detection
        if detection is not None:
            raise RealtimeError("unsupported", f"with {detection['type']} the server's turn detection owns the audio "
                                "it has been sent; set turn_detection null to clear a buffer of your own")
        self.buffer, self.buffered = [], 0
        await self._send("input_audio_buffer.cleared")

    async def item_create(self, event: dict[str, Any]) -> None:
        item = event.get("item")
        if not isinstance(item, dict):
            raise RealtimeError("invalid_value", "conversation.item.create needs an `item` object", "item")
        given = item.get("id")
        item_id = given[:64] if isinstance(given, str) and given else new_id("item")
        if item.get("type") == "function_call_output":
            return await self._function_output(item_id, item)
        if item.get("type") == "message" and item.get("role") in ("assistant", "system"):
            return await self._said_item(item_id, item)
        if item.get("type") != "message" or item.get("role") != "user":
            raise RealtimeError("unsupported", "messages and function_call_output items can be added (not "
                                f"{item.get('type')!r} items of role {item.get('role')!r})", "item.type")
        content = item.get("content")
        if not isinstance(content, list) or not content:
            raise RealtimeError("invalid_value", "a message needs `content`: a list of parts", "item.content")
        texts, parts = [], []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "input_text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
                parts.append({"type": "input_text", "text": part["text"]})
            elif kind == "input_audio":  # transcribed by the server's Whisper, as a spoken turn is
                heard = await self._transcribe(self._samples(part.get("audio"), "item.content.audio"),
                                               "item.content.audio")
                texts.append(heard)
                parts.append({"type": "input_audio", "transcript": heard})
            else:
                raise RealtimeError("unsupported", "a user message's parts must be input_text or input_audio "
                                    "(images are not served)", "item.content")
        text = " ".join(t for t in texts if t).strip()
        limit = self.call.runtime.settings.session.max_instructions_chars
        if len(text) > limit:
            raise RealtimeError("invalid_value", f"a message is limited to {limit} characters", "item.content")
        if len(self.pending_text) >= MAX_PENDING_ITEMS:
            raise RealtimeError("too_many_items", f"{MAX_PENDING_ITEMS} messages wait for a response.create already",
                                "item")
        await self._add(message_item(item_id, "user", "completed", parts))
        if text:
            self.pending_text.append((item_id, text))

    async def _said_item(self, item_id: str, item: dict[str, Any]) -> None:
        """An assistant's or a system message the client adds (earlier words, a note): it joins the
        conversation and the history as it is, and no reply is made."""
        message = item_message(item, "item")
        limit = self.call.runtime.settings.session.max_instructions_chars
        if not message.content or len(message.content) > limit:
            raise RealtimeError("invalid_value", f"a message needs words, at most {limit} characters", "item.content")
        self._start()
        assert self.call.session is not None
        turn_id = self.call.session.add_message(message)
        part = (self.dialect.text_part(message.content) if message.role == "assistant"
                else {"type": "input_text", "text": message.content})
        await self._add(message_item(item_id, message.role, "completed", [part]))
        self.typed[item_id] = (turn_id, message.role, message.content)

    async def _function_output(self, item_id: str, item: dict[str, Any]) -> None:
        """The result of a function the server asked the client to run: kept until response.create,
        which lets the model answer from it (as OpenAI's server waits for it)."""
        call_id, output = item.get("call_id"), item.get("output")
        if not isinstance(call_id, str) or not isinstance(output, str):
            raise RealtimeError("invalid_value", "a function_call_output needs `call_id` and `output`, both strings",
                                "item")
        if self.call.session is None or not self.call.session.awaits_output(call_id) or any(
                waiting == call_id for waiting, _ in self.pending_outputs):
            raise RealtimeError("unknown_call_id", f"no function call {call_id[:80]!r} is waiting for its output "
                                "(answered already, timed out, or never asked)", "item.call_id")
        await self._add({"id": item_id, "object": "realtime.item", "type": "function_call_output", "call_id": call_id,
                         "output": output})
        self.pending_outputs.append((call_id, output))

    async def _add(self, item: dict[str, Any]) -> None:
        self._start()
        assert self.outbound is not None
        await self.outbound.add_item(item)
        await self._send("conversation.item.done", item=item)

    async def item_retrieve(self, event: dict[str, Any]) -> None:
        item = self.outbound.items.get(str(event.get("item_id"))) if self.outbound is not None else None
        if item is None:
            raise RealtimeError("item_not_found", f"no item {str(event.get('item_id'))[:80]!r} in this conversation",
                                "item_id")
        await self._send("conversation.item.retrieved", item=item)

    async def item_truncate(self, event: dict[str, Any]) -> None:
        item_id, end = event.get("item_id"), event.get("audio_end_ms")
        if not isinstance(end, int) or isinstance(end, bool) or end < 0:
            raise RealtimeError("invalid_value", "audio_end_ms must be a whole number of ms, 0 or more", "audio_end_ms")
        placed = self.outbound.item_turns.get(str(item_id)) if self.outbound is not None else None
        if placed is None:
            raise RealtimeError("item_not_found", f"no assistant audio item {str(item_id)[:80]!r}", "item_id")
        turn_id, offset_ms = placed
        assert self.call.session is not None and self.outbound is not None
        heard = self.call.session.cut_heard(turn_id, offset_ms + end)  # exactly what was heard
        item = self.outbound.items.get(str(item_id))
        if heard is not None and item is not None:  # a reply sent whole: its item says what was heard now
            item["content"] = [self.dialect.audio_part(heard)]
            item["status"] = "incomplete"
        await self._send("conversation.item.truncated", item_id=item_id, content_index=0, audio_end_ms=end)

    async def response_create(self, event: dict[str, Any]) -> None:
        asked = event.get("response") or {}
        if not isinstance(asked, dict):
            raise RealtimeError("invalid_value", "`response` must be an object", "response")
        modalities = "modalities" if self.dialect.beta else "output_modalities"
        served = ("metadata", modalities, "instructions", "conversation", "tools", "tool_choice", "input")
        unsupported = sorted(k for k, v in asked.items() if v not in (None, [], "auto") and k not in served)
        if unsupported:
            raise RealtimeError("unsupported", f"response.create with {', '.join(unsupported)} is not served yet "
                                "(docs/realtime.md)", "response")
        speaks = (self.settings.speaks if asked.get(modalities) is None
                  else parse_modalities(asked[modalities], f"response.{modalities}"))
        instructions = asked.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise RealtimeError("invalid_value", "response.instructions must be a string", "response.instructions")
        conversation = asked.get("conversation", "auto")
        if conversation not in ("auto", "none", None):
            raise RealtimeError("invalid_value", "response.conversation must be 'auto' or 'none'",
                                "response.conversation")
        tools: Tools | Literal["call"] | None = "call"
        if asked.get("tools") is not None or asked.get("tool_choice") is not None:
            try:
                tools = self.toolbox.for_response(asked.get("tools"), asked.get("tool_choice"))
            except ConfigError as exc:
                raise RealtimeError("invalid_tools", str(exc), "response.tools") from exc
        context = None if asked.get("input") is None else await self._context(asked["input"])
        out_of_band = conversation == "none"
        self._start()
        session, outbound = self.call.session, self.outbound
        assert session is not None and outbound is not None
        texts: list[tuple[str | None, str]] = []
        if not out_of_band and context is None:
            outputs, self.pending_outputs = self.pending_outputs, []
            answered = [session.on_function_output(call_id, output) for call_id, output in outputs]
            if any(answered) and not self.pending_text:
                return  # the reply that made the calls goes on from their results
            texts, self.pending_text = self.pending_text, []
        # this response's own settings; the session's hold again after it
        session.configure(speaks=speaks)
        outbound.next_speaks, outbound.next_in_conversation = speaks, not out_of_band
        try:
            turn_id = await session.on_text([text for _, text in texts], instructions=instructions or None,
                                            in_history=not out_of_band, context=context, tools=tools)
        finally:
            session.configure(speaks=self.settings.speaks)
        for item_id, text in texts:
            if item_id is not None:
                self.typed[item_id] = (turn_id, "user", text)

    async def _context(self, items: Any) -> tuple[ChatMessage, ...]:
        """response.input: the messages one response answers, in place of the conversation."""
        if not isinstance(items, list) or len(items) > MAX_PENDING_ITEMS:
            raise RealtimeError("invalid_value", f"response.input must be a list of at most {MAX_PENDING_ITEMS} "
                                "items", "response.input")
        messages = []
        for i, item in enumerate(items):
            param = f"response.input[{i}]"
            if not isinstance(item, dict):
                raise RealtimeError("invalid_value", "an input item must be an object", param)
            if item.get("type") == "item_reference":
                found = self.outbound.items.get(str(item.get("id"))) if self.outbound is not None else None
                if found is None:
                    raise RealtimeError("item_not_found", f"no item {str(item.get('id'))[:80]!r} in this "
                                        "conversation", f"{param}.id")
                item = found
            elif item.get("type") == "message":
                item = await self._heard_parts(item, param)
            messages.append(item_message(item, param))
        limit = self.call.runtime.settings.session.max_instructions_chars * 4
        if sum(len(m.content) for m in messages) > limit:
            raise RealtimeError("invalid_value", f"response.input is limited to {limit} characters of words",
                                "response.input")
        return tuple(messages)

    async def _heard_parts(self, item: dict[str, Any], param: str) -> dict[str, Any]:
        """A message with its input_audio parts' audio turned into transcripts (by the server's Whisper)."""
        content = item.get("content")
        if not isinstance(content, list):
            return item
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "input_audio" and part.get("audio") is not None:
                heard = await self._transcribe(self._samples(part["audio"], f"{param}.content.audio"),
                                               f"{param}.content.audio")
                part = {"type": "input_audio", "transcript": heard}
            parts.append(part)
        return {**item, "content": parts}

    async def item_delete(self, event: dict[str, Any]) -> None:
        """The item leaves the conversation, and its words (or its call) leave the model's context."""
        item_id = str(event.get("item_id"))
        outbound = self.outbound
        item = outbound.items.get(item_id) if outbound is not None else None
        if outbound is None or item is None:
            raise RealtimeError("item_not_found", f"no item {item_id[:80]!r} in this conversation", "item_id")
        if outbound.response is not None and any(o["id"] == item_id for o in outbound.response.output):
            raise RealtimeError("invalid_value", "the item is part of the response in progress: cancel the response "
                                "or wait for its response.done", "item_id")
        session = self.call.session
        assert session is not None
        gone = [item_id]
        if item.get("type") in ("function_call", "function_call_output"):
            call_id = str(item.get("call_id"))
            session.forget_call(call_id)
            self.pending_outputs = [(c, o) for c, o in self.pending_outputs if c != call_id]
            gone += [i for i, other in outbound.items.items()
                     if i != item_id and other.get("call_id") == call_id and other.get("type") in
                     ("function_call", "function_call_output")]
        elif item_id in self.typed:  # a message the client added, answered or kept as it is
            turn_id, role, text = self.typed.pop(item_id)
            session.forget(turn_id, role, text)
        elif item.get("role") == "user":
            waiting = [(i, t) for i, t in self.pending_text if i == item_id]
            if waiting:  # not answered yet: it never reached the history
                self.pending_text.remove(waiting[0])
            else:
                spoken = next((t for t, i in outbound.user_items.items() if i == item_id), None)
                if spoken is not None:
                    session.forget(spoken, "user")
        elif item_id in outbound.item_turns:
            turn_id, _ = outbound.item_turns[item_id]
            content = item.get("content") or [{}]
            session.forget(turn_id, "assistant", content[0].get("transcript") or content[0].get("text"))
        for gone_id in gone:
            outbound.forget_item(gone_id)
            await self._send("conversation.item.deleted", item_id=gone_id)

    async def response_cancel(self, event: dict[str, Any]) -> None:
        session = self.call.session
        if session is None or not await session.cancel_reply():
            raise RealtimeError("response_cancel_not_active", "no response is in progress to cancel")

    async def _idle(self) -> None:
        """idle_timeout_ms ran out after a reply played: the silence is committed as the caller's
        (empty) turn, and the model answers it, knowing only that the caller said nothing."""
        session, outbound, timeout_s = self.call.session, self.outbound, self.settings.idle_timeout_s
        if session is None or session.closed or outbound is None or timeout_s is None:
            return
        end_ms = 1000 * self.input_samples // self.input_rate
        item_id = new_id("item")
        log.info("%s: the caller was silent for %.1f s after the reply (idle_timeout_ms)", self.label, timeout_s)
        await self._send("input_audio_buffer.timeout_triggered", audio_start_ms=max(0, end_ms - int(1000 * timeout_s)),
                         audio_end_ms=end_ms, item_id=item_id)
        await self._send("input_audio_buffer.committed", item_id=item_id, previous_item_id=outbound.last_item)
        await self._add(message_item(item_id, "user", "completed", [{"type": "input_audio", "transcript": ""}]))
        note = self.call.runtime.settings.realtime.idle_note.replace("{seconds}", f"{timeout_s:g}")
        if not self.settings.answers_turns:
            self.pending_text.append((item_id, note))
            return
        turn_id = await session.on_text([note])
        self.typed[item_id] = (turn_id, "user", note)

    # -- helpers -------------------------------------------------------------------------------------
    async def _send(self, ga_name: str, **fields: Any) -> None:
        event = self.dialect.event(ga_name, **fields)
        if event is not None:
            await self.call.writer.text(json.dumps(event))

    def _session_json(self) -> dict[str, Any]:
        return self.settings.as_beta() if self.dialect.beta else self.settings.as_ga()

    def _heard(self, turn_id: int, text: str) -> None:
        """create_response false: the caller's words (turn `turn_id`'s item) wait for the client's
        response.create."""
        if len(self.pending_text) < MAX_PENDING_ITEMS and self.outbound is not None:
            self.pending_text.append((self.outbound.user_items.get(turn_id), text))

    def _default_prompt(self) -> str:
        return self.call.runtime.settings.session.system_prompt

    def _apply(self) -> None:
        """The settings the running Session and its output follow from their next reply on."""
        session, outbound, settings = self.call.session, self.outbound, self.settings
        if session is None or outbound is None:
            return
        outbound.speaks = settings.speaks
        # the client holds the conversation's items: a reply is never taken back
        session.configure(speaks=settings.speaks, turns="answered" if settings.answers_turns else self._heard,
                          speech_interrupts=settings.interrupts, takes_back=False)
        self.idle.timeout_s = settings.idle_timeout_s

    def _new_outbound(self) -> RealtimeOutbound:
        settings = self.settings
        return RealtimeOutbound(self.call.writer, self.dialect, self.call.runtime.metrics, settings.output_format,
                                settings.output_rate)

    def _start(self) -> None:
        """The pipeline's Session, started with the settings as they are now."""
        if self.call.session is not None:
            return
        runtime = self.call.runtime
        settings = self.settings
        outbound = self.outbound = self._new_outbound()
        client = getattr(self.call.websocket, "client", None)
        config = runtime.pipeline_config()
        outbound.idle = self.idle
        outbound.lead_s = config.session.output_lead_ms / 1000
        outbound.rate_limits = rate_limits(getattr(self.call.websocket, "scope", None))
        config = dataclasses.replace(config, endpointing=settings.endpointing(config.endpointing))
        self.call.start_session(self.outbound, input_rate=self.input_rate,
                                          output_rate=settings.output_rate, toolbox=self.toolbox,
                                          system_prompt=settings.instructions or None,
                                          caller=client.host if client else None, config=config)
        self._apply()
        detection = settings.turn_detection
        log.info("%s started (%s in, %s out, %s)", self.label, settings.input_format, settings.output_format,
                 detection["type"] if detection else "the client commits turns")


HANDLERS = {
    "session.update": RealtimeWire.session_update,
    "input_audio_buffer.append": RealtimeWire.audio_append,
    "input_audio_buffer.commit": RealtimeWire.audio_commit,
    "input_audio_buffer.clear": RealtimeWire.audio_clear,
    "conversation.item.create": RealtimeWire.item_create,
    "conversation.item.retrieve": RealtimeWire.item_retrieve,
    "conversation.item.truncate": RealtimeWire.item_truncate,
    "conversation.item.delete": RealtimeWire.item_delete,
    "response.create": RealtimeWire.response_create,
    "response.cancel": RealtimeWire.response_cancel,
}


def realtime_call(websocket: WebSocket, runtime: Runtime, beta: bool, model: str) -> Call:
    return Call(websocket, runtime, "realtime", lambda call: RealtimeWire(call, Dialect(beta), model))


@router.websocket(PATH)
async def realtime_endpoint(websocket: WebSocket) -> None:
    runtime: Runtime = websocket.app.state.runtime
    headers = websocket.headers
    beta = "realtime=v1" in headers.get("openai-beta", "").replace(" ", "")
    model = websocket.query_params.get("model") or runtime.settings.llm.model
    call = realtime_call(websocket, runtime, beta, model)
    minted = websocket.scope.get(MINTED_SESSION)  # the guard redeemed an ephemeral key
    if isinstance(minted, dict):  # an ephemeral key: the session starts with the settings it was minted with
        wire = call.wire
        assert isinstance(wire, RealtimeWire)
        wire.adopt(wire.settings.updated(minted, beta=False))  # checked when it was minted
    offered = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",")]
    await call.serve(subprotocol="realtime" if "realtime" in offered else None)
