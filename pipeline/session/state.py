"""A session's state, shared by its parts (barge_in.py, keypad.py, playout.py, replies.py,
tool_calls.py, each a mixin of Session in session.py). The methods below are the ones a part
calls in another; the part named beside each defines it."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from core.clock import Clock
from models.protocols import (
    ChatMessage,
    Conversation,
)
from models.tool_calls import ToolCall, Tools
from pipeline.events import (
    AudioFrame,
    ReplyAudio,
    ResponseDone,
)
from pipeline.session.parts import AudioTap, Backends, Goodbye, Outbound, PipelineConfig, Reply
from pipeline.tools import ToolBox
from pipeline.turn_judge import TurnJudge
from pipeline.turns import Turn


class SessionState:
    def __init__(
        self,
        backends: Backends,
        config: PipelineConfig,
        clock: Clock,
        outbound: Outbound,
        *,
        output_rate: int,
        system_prompt: str | None = None,
        on_turn: Callable[[ResponseDone], Awaitable[None] | None] | None = None,
        tap: AudioTap | None = None,
        toolbox: ToolBox | None = None,
        hang_up: Callable[[], None] | None = None,
    ) -> None:
        """`hang_up`: how the transport ends the call (it must return at once and do it in a task
        of its own); with it, the built-in end_call tool can be offered (tools.end_call)."""
        self.backends = backends
        self.toolbox = toolbox
        self.hang_up = hang_up
        if toolbox is not None and toolbox.ask_client is None:
            toolbox.ask_client = self._ask_client
        if toolbox is not None and hang_up is not None:
            toolbox.on_end_call = self._end_call
        self.ending_turn: int | None = None  # end_call was called in this turn: hang up after its goodbye
        self.goodbye: Goodbye | None = None
        self.asked: dict[str, asyncio.Future[str]] = {}  # client tool calls awaiting function_call.output
        self.tool_tasks: set[asyncio.Task[Any]] = set()  # calls and their follow-ups: not stopped by barge-in
        self.answering = 0  # the turn id of the caller's latest turn that got a reply
        self.tap = tap
        self.config = config
        self.clock = clock
        self.outbound = outbound
        self.output_rate = output_rate
        self.on_turn = on_turn
        has_tools = toolbox is not None and toolbox.tools(1) is not None
        default = config.session.tools_prompt if has_tools else config.session.system_prompt
        self.history: list[ChatMessage] = [ChatMessage("system", system_prompt or default)]
        self.said: dict[int, list[ChatMessage]] = {}  # turn id -> the messages the history keeps for it
        # the engine is chosen at the start: tools declared later (session.update) are served by it too
        self.conversation: Conversation = backends.llm_for(has_tools).conversation()
        self.audio_in: asyncio.Queue[AudioFrame | None] = asyncio.Queue()
        self.audio_in_samples = 0  # samples queued in audio_in (the transport bounds it)
        # None: every turn is answered; else the caller's words go to it, and the client asks for each
        # reply (on_text), as the Realtime API's create_response false has it
        self.on_words: Callable[[int, str], None] | None = None
        # the last replies sent whole, by turn, with the message the history keeps for each (cut_heard)
        self.finished: dict[int, tuple[Reply, ChatMessage]] = {}
        self.speech_interrupts = True  # False: the caller's speech neither pauses nor stops a reply (it waits)
        # True: a reply the caller talks over within session.take_back_ms of its start is taken back
        # (out of the history, the caller's words before and after answered as one turn)
        self.takes_back = config.session.take_back_ms > 0
        self.speaks = True  # replies are spoken; False: text only (no TTS), for the replies started from now
        self.turns: dict[int, Turn] = {}
        self.reply: Reply | None = None
        self.generation = 0  # bumped by every barge-in and every new reply
        self.preparing: asyncio.Task[None] | None = None  # the LLM's head start on the next prompt
        self.last_started = 0  # the turn id of the caller's latest speech
        # Speech while the bot talks pauses its audio until it is known to be an interruption
        # (sustained, or a real word) or not (a cough, a backchannel).
        self.reply_audio_open = asyncio.Event()
        self.reply_audio_open.set()
        self.pending_barge: int | None = None
        self.barge_began: float | None = None  # when the caller's sound that paused the reply began
        self.barge_timer: asyncio.Task[None] | None = None
        # the caller's words waiting to be answered with their next ones: final transcripts that came
        # after they went on speaking, and the words of a reply taken back (session.take_back_ms)
        self.held: list[str] = []
        self.let_go: set[int] = set()  # turns over the bot heard as backchannels, until their final transcript
        self.discarded = 0  # preemptive replies dropped since the last reply was sent
        self.discarded_words = 0
        self.turn_ids = itertools.count(1)  # speech turns (vad_stage) and keypad turns (on_dtmf) alike
        self.digits: list[str] = []  # keys pressed, not yet answered
        self.last_digit_at = 0.0
        self.dtmf_timer: asyncio.Task[None] | None = None
        self.closed = False  # the caller has gone: nothing new starts (a keypad turn in flight included)
        # the end-of-turn evidence at the caller's pauses: the sound's (the VAD stage asks), the words'
        self.judge: TurnJudge | None = None  # made by run(), with the settings the call runs with
        self.words_task: asyncio.Task[None] | None = None  # weighing the words said up to a pause

    # -- defined by the parts, called across them --------------------------------------------------
    async def _barge_in(self, why: str) -> None:
        raise NotImplementedError  # barge_in.py

    def _bot_talking(self) -> bool:
        raise NotImplementedError  # barge_in.py

    def _hold_reply(self, turn_id: int) -> None:
        raise NotImplementedError  # barge_in.py

    def _is_backchannel(self, text: str) -> bool:
        raise NotImplementedError  # barge_in.py

    def _let_go(self, turn_id: int, text: str) -> None:
        raise NotImplementedError  # barge_in.py

    def _release_reply(self) -> None:
        raise NotImplementedError  # barge_in.py

    def _replace_message(self, old: ChatMessage, new: ChatMessage | None) -> bool:
        raise NotImplementedError  # session.py

    def _heard_samples(self, reply: Reply) -> int:
        raise NotImplementedError  # playout.py

    async def _play(self, reply: Reply, generation: int) -> None:
        raise NotImplementedError  # playout.py

    async def _queue_audio(self, reply: Reply, audio: ReplyAudio) -> None:
        raise NotImplementedError  # playout.py

    async def _cancel_reply(self, status: str, send: bool = True, keep: bool = False) -> None:
        raise NotImplementedError  # replies.py

    async def _confirm(self, reply: Reply) -> None:
        raise NotImplementedError  # replies.py

    async def _discard_preemptive(self, reply: Reply, why: str) -> None:
        raise NotImplementedError  # replies.py

    async def _finish(self, reply: Reply, status: str, send: bool = True) -> None:
        raise NotImplementedError  # replies.py

    def _prepare(self, messages: tuple[ChatMessage, ...]) -> None:
        raise NotImplementedError  # replies.py

    def _prompt(self) -> tuple[ChatMessage, ...]:
        raise NotImplementedError  # replies.py

    async def _record(self, done: ResponseDone) -> None:
        raise NotImplementedError  # replies.py

    def _keep(self, turn_id: int, message: ChatMessage, at: int | None = None) -> None:
        raise NotImplementedError  # replies.py

    async def _start_reply(self, turn: Turn, text: str | None, preemptive: bool = False, step: int = 1,
                           fixed_text: str | None = None, instructions: str | None = None,
                           in_history: bool = True, context: tuple[ChatMessage, ...] | None = None,
                           tools: Tools | Literal["call"] | None = "call") -> None:
        raise NotImplementedError  # replies.py

    def _tools(self, step: int) -> Tools | None:
        raise NotImplementedError  # replies.py

    async def _dispatch(self, reply: Reply, call: ToolCall, generation: int) -> None:
        raise NotImplementedError  # tool_calls.py

    async def _hang_up_after(self, reply: Reply) -> None:
        raise NotImplementedError  # tool_calls.py

    async def _ask_client(self, call: ToolCall) -> str:
        raise NotImplementedError  # tool_calls.py

    def _end_call(self) -> None:
        raise NotImplementedError  # tool_calls.py
