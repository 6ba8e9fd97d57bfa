"""The session's output as Realtime server events: the caller's speech and transcripts as
`input_audio_buffer.*` and `conversation.item.*`, each reply as one response (`response.created`,
an assistant message item with one audio content part, audio and transcript deltas, the `.done`
events, `response.done`)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from app.metrics import Metrics
from app.transports.call import SocketWriter
from app.transports.realtime.idle import IdleTimer
from app.transports.realtime.messages import Dialect, error_event, message_item, new_id
from core.errors import error_code
from models.llm.tool_calls import ToolCall
from pipeline.audio import pcm16_to_alaw, pcm16_to_mulaw
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

log = logging.getLogger(__name__)
RATE_LIMITS_WAIT_S = 0.05  # the longest a response's start waits for the client's rate limits
STATUS = {"completed": "completed", "tool_calls": "completed", "interrupted": "cancelled", "failed": "failed"}


@dataclass
class Response:
    """One reply going out: its id, its output items in order (the spoken message, made with its
    first words or audio, and the function calls the client is asked to run)."""

    id: str
    turn_id: int
    offset_ms: float  # the turn's audio sent before this reply (a tool call's filler)
    output: list[dict[str, Any]] = field(default_factory=list)
    message: dict[str, Any] | None = None
    message_index: int = 0
    speaks: bool = True  # audio with its transcript; False: text
    in_conversation: bool = True  # False: out of band (conversation "none"): its items join no conversation


@dataclass
class CallItem:
    """A function_call item going out: its response, the item, its place, the arguments shown so far."""

    response: Response
    item: dict[str, Any]
    index: int
    shown: str = ""

    def where(self) -> dict[str, Any]:
        return {"response_id": self.response.id, "item_id": self.item["id"], "output_index": self.index,
                "call_id": self.item["call_id"]}


class RealtimeOutbound:
    def __init__(self, writer: SocketWriter, dialect: Dialect, metrics: Metrics, output_format: str,
                 output_rate: int) -> None:
        self.writer = writer
        self.dialect = dialect
        self.metrics = metrics
        self.output_format = output_format
        self.output_rate = output_rate
        self.user_items: dict[int, str] = {}  # turn id -> the caller's message item
        self.conversation_id = new_id("conv")
        self.items: dict[str, dict[str, Any]] = {}  # item id -> item, for conversation.item.retrieve
        self.item_turns: dict[str, tuple[int, float]] = {}  # assistant item -> (turn id, its audio's offset)
        self.last_item: str | None = None
        self.response: Response | None = None
        self.turn_sent: dict[int, int] = {}  # samples sent per turn, every reply to it
        self.speech_ms: dict[int, list[float]] = {}  # turn id -> where its speech began and ended
        self.calls_sent: set[str] = set()  # function calls the client was shown whole
        self.calls_open: dict[str, CallItem] = {}  # function calls whose arguments are coming in pieces
        self.speaks = True  # the session's output_modalities: audio (with its transcript), or text
        self.next_speaks: bool | None = None  # response.create's own output_modalities, for the next response
        self.next_in_conversation = True  # response.create's conversation ("none": False), for the next response
        self.idle: IdleTimer | None = None  # idle_timeout_ms: armed by each reply done, disarmed by speech
        self.lead_s = 0.0  # how far reply audio runs ahead of playback (session.output_lead_ms)
        self.rate_limits: Callable[[], Awaitable[list[dict[str, Any]]]] | None = None  # the client's, from the guard
        # one Session event at a time: a function call (asked from its own task) and the end of the
        # reply that made it must not interleave their events
        self.lock = asyncio.Lock()

    async def send(self, ga_name: str, **fields: Any) -> None:
        event = self.dialect.event(ga_name, **fields)
        if event is not None:
            await self.writer.text(json.dumps(event))

    async def send_error(self, code: str, message: str, **kw: Any) -> None:
        await self.writer.text(json.dumps(error_event(self.dialect, code, message, **kw)))

    def user_item(self, turn_id: int) -> str:
        return self.user_items.setdefault(turn_id, new_id("item"))

    async def add_item(self, item: dict[str, Any]) -> None:
        """An item joins the conversation (conversation.item.added, beta .created)."""
        previous, self.last_item = self.last_item, item["id"]
        self.items[item["id"]] = item
        await self.send("conversation.item.added", previous_item_id=previous, item=item)

    def forget_item(self, item_id: str) -> None:
        """The item left the conversation (conversation.item.delete)."""
        self.items.pop(item_id, None)
        self.item_turns.pop(item_id, None)
        if self.last_item == item_id:
            self.last_item = next(reversed(self.items), None)

    # -- the Session's Outbound ----------------------------------------------------------------------
    async def send_event(self, event: OutEvent) -> None:
        async with self.lock:
            await self._event(event)

    async def _event(self, event: OutEvent) -> None:
        if isinstance(event, SpeechStarted):
            if self.idle is not None:
                self.idle.disarm()
            self.speech_ms[event.turn_id] = [event.audio_ms, event.audio_ms]
            await self.send("input_audio_buffer.speech_started", audio_start_ms=int(event.audio_ms),
                            item_id=self.user_item(event.turn_id))
        elif isinstance(event, SpeechStopped):
            item_id = self.user_item(event.turn_id)
            self.speech_ms.setdefault(event.turn_id, [event.audio_ms, event.audio_ms])[1] = event.audio_ms
            await self.send("input_audio_buffer.speech_stopped", audio_end_ms=int(event.audio_ms), item_id=item_id)
            await self.send("input_audio_buffer.committed", item_id=item_id, previous_item_id=self.last_item)
            await self.add_item(message_item(item_id, "user", "completed", [{"type": "input_audio",
                                                                             "transcript": None}]))
        elif isinstance(event, TranscriptPartial):
            await self.send("conversation.item.input_audio_transcription.delta", item_id=self.user_item(event.turn_id),
                            content_index=0, delta=event.text)
        elif isinstance(event, TranscriptFinal):
            await self._transcript(event)
        elif isinstance(event, ReplyText):
            response = await self._message(event.turn_id)
            kind = "response.output_audio_transcript.delta" if response.speaks else "response.output_text.delta"
            await self.send(kind, **self._where(response), delta=event.text)
        elif isinstance(event, FunctionCallDelta):
            await self._call_delta(event)
        elif isinstance(event, FunctionCallRequest):
            await self._function_call(event.turn_id, event.call)
        elif isinstance(event, ResponseDone):
            await self._done(event)
        elif isinstance(event, ErrorEvent):
            self.metrics.error(event.code)
            await self.send_error(event.code, event.message, kind="server_error")

    async def send_audio(self, pcm16: bytes, turn_id: int) -> None:
        async with self.lock:
            await self._audio(pcm16, turn_id)

    async def _audio(self, pcm16: bytes, turn_id: int) -> None:
        response = await self._message(turn_id)
        data = (pcm16 if self.output_format == "pcm" else
                pcm16_to_mulaw(pcm16) if self.output_format == "pcmu" else pcm16_to_alaw(pcm16))
        self.turn_sent[turn_id] = self.turn_sent.get(turn_id, 0) + len(pcm16) // 2
        await self.send("response.output_audio.delta", **self._where(response),
                        delta=base64.b64encode(data).decode())

    # -- the pieces ----------------------------------------------------------------------------------
    async def _transcript(self, event: TranscriptFinal) -> None:
        item_id = self.user_items.get(event.turn_id)
        if item_id is None or item_id not in self.items:
            return  # a turn the client typed: its item was added when the client created it
        start, end = self.speech_ms.pop(event.turn_id, (0.0, 0.0))
        await self.transcribed(item_id, event.text, max(0.0, end - start) / 1000)

    async def transcribed(self, item_id: str, text: str, seconds: float) -> None:
        """The caller's audio message `item_id` is transcribed: its transcript, and the item done."""
        await self.send("conversation.item.input_audio_transcription.completed", item_id=item_id, content_index=0,
                        transcript=text, usage={"type": "duration", "seconds": round(seconds, 3)})
        item = message_item(item_id, "user", "completed", [{"type": "input_audio", "transcript": text}])
        self.items[item_id] = item
        await self.send("conversation.item.done", item=item)

    def _where(self, response: Response) -> dict[str, Any]:
        assert response.message is not None
        return {"response_id": response.id, "item_id": response.message["id"], "output_index": response.message_index,
                "content_index": 0}

    async def _open(self, turn_id: int) -> Response:
        """The response this turn's output belongs to, started with its first words, audio or call."""
        if self.response is not None and self.response.turn_id == turn_id:
            return self.response
        speaks = self.speaks if self.next_speaks is None else self.next_speaks
        offset_ms = 1000 * self.turn_sent.get(turn_id, 0) / self.output_rate
        response = Response(new_id("resp"), turn_id, offset_ms, speaks=speaks,
                            in_conversation=self.next_in_conversation)
        self.next_speaks, self.next_in_conversation = None, True
        self.response = response
        await self.send("response.created", response={"id": response.id, "object": "realtime.response",
                                                      "status": "in_progress", "output": [],
                                                      **self._conversation(response), **self._modalities(response)})
        if self.idle is not None:
            self.idle.disarm()
        if self.rate_limits is not None:  # as OpenAI's server, at the start of each response
            try:  # never at the cost of the reply's first audio (a Redis that is slow or down)
                limits = await asyncio.wait_for(self.rate_limits(), RATE_LIMITS_WAIT_S)
            except TimeoutError:
                log.debug("rate_limits.updated skipped: the limits took over %.0f ms", 1000 * RATE_LIMITS_WAIT_S)
            else:
                await self.send("rate_limits.updated", rate_limits=limits)
        return response

    async def _message(self, turn_id: int) -> Response:
        """The response, with its spoken message item (audio, and the audio's transcript)."""
        response = await self._open(turn_id)
        if response.message is not None:
            return response
        item = message_item(new_id("item"), "assistant", "in_progress", [])
        response.message, response.message_index = item, len(response.output)
        response.output.append(item)
        self.item_turns[item["id"]] = (turn_id, response.offset_ms)
        await self.send("response.output_item.added", response_id=response.id, output_index=response.message_index,
                        item=item)
        if response.in_conversation:
            await self.add_item(item)
        part = {"type": "audio", "transcript": ""} if response.speaks else {"type": "text", "text": ""}
        await self.send("response.content_part.added", **self._where(response), part=part)
        return response

    async def _call_item(self, turn_id: int, call_id: str, name: str) -> CallItem:
        """A function_call output item, in progress, in the response this turn's output belongs to."""
        response = await self._open(turn_id)
        item = {"id": new_id("item"), "object": "realtime.item", "type": "function_call", "status": "in_progress",
                "name": name, "call_id": call_id, "arguments": ""}
        index = len(response.output)
        response.output.append(item)
        await self.send("response.output_item.added", response_id=response.id, output_index=index, item=dict(item))
        await self.add_item(dict(item))
        return CallItem(response, item, index)

    async def _call_delta(self, event: FunctionCallDelta) -> None:
        """A piece of a client call's arguments as the model writes them."""
        if event.call_id in self.calls_sent:
            return
        open_call = self.calls_open.get(event.call_id)
        if open_call is None:
            open_call = self.calls_open[event.call_id] = await self._call_item(event.turn_id, event.call_id,
                                                                                event.name)
        open_call.shown += event.delta
        await self.send("response.function_call_arguments.delta", **open_call.where(), delta=event.delta)

    async def _function_call(self, turn_id: int, call: ToolCall) -> None:
        """The client is asked to run one of its tools: a function_call item (opened by the first
        piece of its arguments, if they came in pieces), the rest of its arguments, done (status
        completed: what OpenAI's clients act on), in the response that made the call (or, asked
        after it ended, in one of its own). The client answers with a function_call_output item and
        response.create."""
        if call.call_id in self.calls_sent:
            return
        self.calls_sent.add(call.call_id)
        open_call = self.calls_open.pop(call.call_id, None)
        opened = open_call is None and (self.response is None or self.response.turn_id != turn_id)
        if open_call is None:
            open_call = await self._call_item(turn_id, call.call_id, call.name)
        response, item, where = open_call.response, open_call.item, open_call.where()
        rest = call.arguments[len(open_call.shown):] if call.arguments.startswith(open_call.shown) else ""
        if rest or not open_call.shown:
            await self.send("response.function_call_arguments.delta", **where, delta=rest)
        await self.send("response.function_call_arguments.done", **where, name=call.name, arguments=call.arguments)
        item.update(status="completed", arguments=call.arguments)
        self.items[item["id"]] = item
        await self.send("response.output_item.done", response_id=response.id, output_index=open_call.index, item=item)
        await self.send("conversation.item.done", item=item)
        if opened:  # asked after its reply had ended: a response of its own
            await self._close(response, "completed", None)

    async def _end_unfinished_calls(self, response: Response) -> None:
        """Calls the response began writing and never finished (cut off, or the reply stopped)."""
        for call_id, open_call in list(self.calls_open.items()):
            if open_call.response is response:
                del self.calls_open[call_id]
                item = open_call.item
                item.update(status="incomplete", arguments=open_call.shown)
                self.items[item["id"]] = item
                await self.send("response.output_item.done", response_id=response.id, output_index=open_call.index,
                                item=item)
                await self.send("conversation.item.done", item=item)

    def _conversation(self, response: Response) -> dict[str, Any]:
        return {"conversation_id": self.conversation_id if response.in_conversation else None}

    def _modalities(self, response: Response) -> dict[str, Any]:
        if self.dialect.beta:
            return {"modalities": ["audio", "text"] if response.speaks else ["text"]}
        return {"output_modalities": ["audio"] if response.speaks else ["text"]}

    async def _done(self, done: ResponseDone) -> None:
        response = await self._open(done.turn_id)  # a reply stopped before it said anything: an empty one
        status = STATUS.get(done.status, "completed")
        if response.message is not None:
            where = self._where(response)
            if response.speaks:
                await self.send("response.output_audio.done", **where)
                await self.send("response.output_audio_transcript.done", **where, transcript=done.text)
                part = {"type": "audio", "transcript": done.text}
            else:
                await self.send("response.output_text.done", **where, text=done.text)
                part = {"type": "text", "text": done.text}
            await self.send("response.content_part.done", **where, part=part)
            content = self.dialect.audio_part(done.text) if response.speaks else self.dialect.text_part(done.text)
            item = message_item(response.message["id"], "assistant",
                                "completed" if status == "completed" else "incomplete", [content])
            response.output[response.message_index] = response.message = item
            await self.send("response.output_item.done", response_id=response.id,
                            output_index=response.message_index, item=item)
            if response.in_conversation:
                self.items[item["id"]] = item
                await self.send("conversation.item.done", item=item)
        for run in done.tool_calls:  # a call the reply made, if the client was not shown it yet
            if run.get("runs_on") == "client":
                await self._function_call(done.turn_id, ToolCall(run["call_id"], run["name"], run["arguments"]))
        await self._close(response, status, done)

    async def _close(self, response: Response, status: str, done: ResponseDone | None) -> None:
        stats = done.stats if done is not None else None
        await self._end_unfinished_calls(response)
        if self.response is response:
            self.response = None
        calls = any(item["type"] == "function_call" for item in response.output)  # the client's turn to act
        if self.idle is not None and status == "completed" and not calls:  # silence counts once it has played
            sent_s = self.turn_sent.get(response.turn_id, 0) / self.output_rate - response.offset_ms / 1000
            self.idle.arm(min(self.lead_s, sent_s) if response.speaks else 0.0)
        details: dict[str, Any] | None = None
        if status == "cancelled":
            details = {"type": "cancelled", "reason": "turn_detected"}
        elif status == "failed":
            # the code alone: the record's error text (done.error) may show the server's insides
            details = {"type": "failed", "error": {"type": "server_error",
                                                   "code": error_code(done.error if done else None, "failed")}}
        prompt, completion = (stats.prompt_tokens, stats.completion_tokens) if stats else (0, 0)
        usage = {
            "total_tokens": prompt + completion, "input_tokens": prompt, "output_tokens": completion,
            "input_token_details": {"text_tokens": prompt, "audio_tokens": 0,
                                    "cached_tokens": prompt - stats.prefill_tokens if stats else 0},
            "output_token_details": {"text_tokens": completion, "audio_tokens": 0},
        }
        extras = {} if done is None else {"voice_agent": {
            "turn_id": done.turn_id, "latency_ms": done.latency_ms, "voice_to_voice_ms": done.voice_to_voice_ms,
            "deadline_missed": done.deadline_missed, "underruns": done.underruns, "preemptive": done.preemptive,
            "discarded": done.discarded, "llm": stats.as_dict() if stats else {}}}
        await self.send("response.done", response={
            "id": response.id, "object": "realtime.response", "status": status, "status_details": details,
            "output": response.output, "usage": usage, **self._conversation(response), **self._modalities(response),
            # this server's own figures, in a field OpenAI's clients ignore (docs/realtime.md)
            **extras,
        })
