"""One caller's session: the whole flow of the voice pipeline, wired in one place.

    audio in -> vad_stage -> asr_stage                         (the input line, for the whole call)
    transcript -> llm_stage -> chunk_stage -> tts_stage -> playout -> audio out   (one reply line per turn)

The input line runs for the whole call. Each final transcript starts a reply: a producer task runs
the reply line and fills a playout queue; a player task sends its audio no faster than real time
(plus a small lead), so "sent" stays close to "heard". When the caller speaks during a reply
(barge-in) the reply's generation is bumped, both tasks are cancelled, the LLM and TTS work stops,
and the history keeps only the part of the reply that was sent.

Keys pressed on a phone (DTMF, `on_dtmf`) are a turn of their own: collected until
`session.dtmf_timeout_ms` passes without one, then answered like words ("The caller pressed 4 2 #
on the phone keypad."). Speech turns and keypad turns are numbered from one counter.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from core.clock import Clock
from core.errors import VoiceAgentError
from core.worker import ModelWorker
from models.protocols import (
    Audio,
    ChatMessage,
    Conversation,
    GenerationStats,
    LanguageModel,
    SamplingParams,
    SpeechRecognizer,
    Synthesizer,
    TurnDetector,
    VoiceActivityDetector,
)
from models.tool_calls import ToolCall, Tools
from pipeline.asr_stage import asr_stage
from pipeline.audio import float_to_pcm16, resample
from pipeline.chunker import chunk_stage
from pipeline.config import AsrStageConfig, ChunkerConfig, EndpointingConfig, SessionConfig
from pipeline.endpointing import vad_stage
from pipeline.events import (
    AudioFrame,
    ErrorEvent,
    FunctionCallRequest,
    InputEvent,
    OutEvent,
    Phrase,
    ReplyAudio,
    ReplyEvent,
    ReplyFinished,
    ReplyRequest,
    ReplyText,
    ReplyToolCall,
    ResponseDone,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    TranscriptEarly,
    TranscriptFinal,
    TranscriptPartial,
)
from pipeline.history import prompt_window
from pipeline.llm_stage import llm_stage
from pipeline.tools import ToolBox, ToolRun
from pipeline.tts_stage import tts_stage
from pipeline.turn_judge import TurnJudge
from pipeline.turn_policy import TurnPolicy, bare_words
from pipeline.turns import PhraseLedger, Turn

log = logging.getLogger(__name__)


@dataclass
class Backends:
    """The loaded engines, shared by all sessions, each with its own worker thread."""

    vad: VoiceActivityDetector
    asr: SpeechRecognizer
    tts: Synthesizer
    llm: LanguageModel
    turn: TurnDetector | None = None  # the end-of-turn model (None: turns end on silence alone)
    tools_llm: LanguageModel | None = None  # llm.tools_model, for calls that have tools (None: `llm` serves them)
    vad_worker: ModelWorker = field(default_factory=lambda: ModelWorker("vad"))
    # urgent like the ASR: a caller who paused waits for its answer
    turn_worker: ModelWorker = field(default_factory=lambda: ModelWorker("turn", priority="urgent"))
    asr_worker: ModelWorker = field(default_factory=lambda: ModelWorker("asr", priority="urgent"))
    tts_worker: ModelWorker = field(default_factory=lambda: ModelWorker("tts"))

    def llm_for(self, tools: bool) -> LanguageModel:
        """The LLM of a call (or request) that has tools, or of one that has none."""
        return self.tools_llm if tools and self.tools_llm is not None else self.llm


@dataclass(frozen=True)
class PipelineConfig:
    endpointing: EndpointingConfig
    asr: AsrStageConfig
    chunker: ChunkerConfig
    session: SessionConfig
    sampling: SamplingParams


class AudioTap(Protocol):
    """Where the reply audio is also written, placed at the time it plays for the caller (a call's
    recording: app/store/recording.py). Called on the audio path: it must return at once."""

    def bot(self, samples: Audio, rate: int, at: float) -> None: ...

    def bot_stopped(self, at: float) -> None:
        """The reply was cut off at `at`: audio placed after it was never heard."""
        ...


class Outbound(Protocol):
    """The transport's side: each call returns once the message is written to the caller."""

    async def send_event(self, event: OutEvent) -> None: ...

    async def send_audio(self, pcm16: bytes, turn_id: int) -> None:
        """Reply audio at the session's output rate, of the turn `turn_id` (a phone transport marks
        how much of each turn's audio it sent, to learn how much was played)."""
        ...


@dataclass
class Reply:
    turn: Turn
    ledger: PhraseLedger = field(default_factory=PhraseLedger)
    playout: asyncio.Queue[ReplyAudio | None] = field(default_factory=asyncio.Queue)
    stats: GenerationStats | None = None
    error: str | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    finished: bool = False
    queued_samples: int = 0  # produced but not yet sent (bounded by session.max_playout_s)
    room: asyncio.Event = field(default_factory=asyncio.Event)  # set while queued_samples is under the bound
    played_samples: int | None = None  # what the client says it has played (None: it has not said)
    offset_samples: int = 0  # the turn's audio sent by earlier replies to it: the client's count includes them
    played_at: float = 0.0  # clock time of that report
    playback_stopped: bool = False  # the client stopped playing there (a Realtime truncate): not carried forward
    prompt: tuple[ChatMessage, ...] = ()  # what the LLM is asked
    user_text: str = ""  # the caller's words it answers
    # A preemptive reply (started at a pause) sends nothing until the turn is confirmed over.
    confirmed: asyncio.Event = field(default_factory=asyncio.Event)
    preemptive: bool = False
    unsent: list[OutEvent] = field(default_factory=list)  # text deltas and errors held until confirmed
    words: int = 0  # words generated so far
    first_audio_due: float | None = None  # clock time: end of speech + session.first_audio_budget_ms
    deadline_missed: bool = False  # its first audio went out after first_audio_due
    underruns: int = 0  # gaps in its audio once it started: the next chunk came after the playhead ran out
    underrun_s: float = 0.0  # their total length
    # Tool calls (pipeline/tools.py): a reply that makes calls ends with status "tool_calls"; their
    # results lead to one follow-up reply to the same turn (step + 1).
    step: int = 1
    runs: list[ToolRun] = field(default_factory=list)  # its calls, dispatched
    run_tasks: list[asyncio.Task[ToolRun]] = field(default_factory=list)
    history_at: int = 0  # where its message (text and calls) and the results go in the history
    fixed_text: str | None = None  # said as is, without the LLM (the filler while a tool runs)
    produced: asyncio.Event = field(default_factory=asyncio.Event)  # its generation is over
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # finished or cancelled
    kept_text: str | None = None  # what the history keeps of its words (set when it finishes)
    speaks: bool = True  # False: a text reply (the Realtime API's output_modalities ["text"]): no TTS, no audio


@dataclass
class Goodbye:
    """The last reply of a call the agent ends: hung up once the client has played `need` samples
    of the turn's audio (or once it surely has, without reports)."""

    turn_id: int
    need: int
    played_samples: int = 0


async def _one(item: ReplyRequest) -> AsyncIterator[ReplyRequest]:
    yield item


async def _said(turn_id: int, text: str, clock: Clock) -> AsyncGenerator[ReplyEvent, None]:
    """A fixed sentence as if the LLM had written it (the filler)."""
    yield ReplyText(turn_id, text, clock.now())
    yield ReplyFinished(turn_id, None, clock.now())


def dtmf_text(digits: list[str]) -> str:
    """Keys pressed on the phone, as the caller's words for the LLM."""
    return f"The caller pressed {' '.join(digits)} on the phone keypad."


def _plain_words(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum() or ch == " ")


@functools.cache
def _backchannel_forms(backchannels: tuple[str, ...]) -> tuple[frozenset[str], frozenset[str]]:
    """The configured backchannels as whole phrases without spaces ("mmhmm", "gotit") and as
    single words."""
    return (frozenset(_plain_words(p.replace("-", "")).replace(" ", "") for p in backchannels),
            frozenset(w for p in backchannels for w in _plain_words(p.replace("-", "")).split()))


class Session:
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
        # the engine is chosen at the start: tools declared later (session.update) are served by it too
        self.conversation: Conversation = backends.llm_for(has_tools).conversation()
        self.audio_in: asyncio.Queue[AudioFrame | None] = asyncio.Queue()
        self.audio_in_samples = 0  # samples queued in audio_in (the transport bounds it)
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
        self.barge_timer: asyncio.Task[None] | None = None
        self.held: list[str] = []  # final transcripts that came after the caller went on speaking
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

    # -- the input line --------------------------------------------------------------------------
    async def run(self) -> None:
        """Run until `audio_in` yields None (the caller hung up), then stop any reply."""
        self._prepare(tuple(self.history))
        b = self.backends
        words = self.config.endpointing.text_signal and b.llm.weighs_words
        self.judge = TurnJudge(TurnPolicy(self.config.endpointing, words), b.turn, b.turn_worker, words)
        vad_stream = b.vad.new_stream()
        speech = vad_stage(self._frames(), vad_stream, b.vad_worker, self.config.endpointing, self.clock,
                           b.vad.sample_rate, b.vad.window_samples, self.judge, self.turn_ids)
        events = asr_stage(speech, self.backends.asr, self.backends.asr_worker, self.config.asr, self.clock,
                           self._bot_talking)
        try:
            async with contextlib.aclosing(events):
                async for event in events:
                    await self._on_input(event)
        finally:
            self.closed = True
            self._release_reply()
            if self.preparing is not None:
                self.preparing.cancel()
            if self.dtmf_timer is not None:
                self.dtmf_timer.cancel()
            if self.words_task is not None:
                self.words_task.cancel()
            for task in self.tool_tasks:
                task.cancel()
            for future in self.asked.values():
                future.cancel()
            # the caller is gone: a reply they heard part of is still kept (on_turn), not sent
            await self._cancel_reply("interrupted", send=False, keep=True)
            await self.conversation.aclose()

    async def _frames(self) -> AsyncIterator[AudioFrame]:
        while (frame := await self.audio_in.get()) is not None:
            self.audio_in_samples -= len(frame.samples)
            yield frame

    async def _on_input(self, event: InputEvent) -> None:
        if isinstance(event, SpeechStarted):
            self.last_started = max(self.last_started, event.turn_id)
            await self.outbound.send_event(event)
            reply = self.reply
            if reply is not None and reply.preemptive and not reply.confirmed.is_set():
                # a new turn before the last one's reply was confirmed: that reply answers words the
                # caller has since added to (they join this turn), and nobody heard it
                await self._discard_preemptive(reply, "the caller spoke again")
            elif reply is not None:
                self._hold_reply(event.turn_id)
            return
        if isinstance(event, SpeechStopped):
            if self.pending_barge == event.turn_id and self.barge_timer is not None:
                self.barge_timer.cancel()  # short: its words (or none) decide
            turn = self.turns.setdefault(event.turn_id, Turn(event.turn_id))
            turn.mark("speech_end", event.at)
            turn.ended_at = event.ended_at
            await self.outbound.send_event(event)
            return
        if isinstance(event, SpeechResumed):
            reply = self.reply
            if reply is not None and reply.preemptive and not reply.confirmed.is_set():
                await self._discard_preemptive(reply, "the caller went on")
            elif reply is not None and event.turn_id in self.let_go:
                # after a backchannel the caller goes on: over the bot again, so hold it again
                self.let_go.discard(event.turn_id)
                self._hold_reply(event.turn_id)
            return
        if isinstance(event, TranscriptEarly):
            if self.pending_barge == event.turn_id:
                # the caller spoke over the bot and paused: what they said so far decides at once
                # (the end of their turn can be a second away when it does not sound finished)
                if self._is_backchannel(event.text):
                    self._let_go(event.turn_id, event.text)
                    self.let_go.add(event.turn_id)  # until its final transcript, or until it goes on
                else:
                    await self._barge_in("a word")
            elif (self.reply is None and self.pending_barge is None and event.turn_id == self.last_started
                    and event.text.strip()):
                if self.words_task is not None:
                    self.words_task.cancel()  # an earlier pause's, still weighing
                words = " ".join([*self.held, event.text.strip()]).strip()
                self.words_task = asyncio.create_task(self._weigh_words(event.turn_id, words))
            return
        if isinstance(event, TranscriptFinal) and event.turn_id in self.let_go:
            self.let_go.discard(event.turn_id)
            if self._is_backchannel(event.text):  # the backchannel let go at its pause, as it ended
                await self.outbound.send_event(event)
                self.turns.pop(event.turn_id, None)
                return
        await self.outbound.send_event(event)
        # An interim transcript over the bot does not decide: Whisper reads a word cut off mid-way as
        # another (whisper-tiny.en heard "Okay." cut at 300 ms as "Thank you."). The caller's first
        # pause (whole words, TranscriptEarly), the end of the speech, or its length decides.
        if isinstance(event, TranscriptFinal) and self.pending_barge == event.turn_id:
            if self._is_backchannel(event.text):
                self._let_go(event.turn_id, event.text)
                self.turns.pop(event.turn_id, None)
                return
            await self._barge_in("a word")
        if isinstance(event, TranscriptPartial) and self.reply is None and event.text.strip():
            self._prepare((*self._prompt(), ChatMessage("user", event.text.strip())))
        if isinstance(event, TranscriptFinal):
            turn = self.turns.setdefault(event.turn_id, Turn(event.turn_id))
            turn.mark("asr_final", event.at)
            text = event.text.strip()
            if self.last_started > event.turn_id:
                # The caller started talking again before this transcript was ready: never answer
                # over them. What they said joins the turn they went on with.
                if text:
                    log.info("turn %d: final transcript after the caller went on; joins turn %d",
                             event.turn_id, self.last_started)
                    self.held.append(text)
                self.turns.pop(event.turn_id, None)
            elif text or self.held:
                text = " ".join([*self.held, text]).strip()
                self.held.clear()
                reply = self.reply
                if reply is not None and reply.preemptive and not reply.confirmed.is_set():
                    if reply.turn.turn_id == event.turn_id and reply.user_text == text:
                        await self._confirm(reply)
                        return
                    await self._discard_preemptive(reply, "the final transcript differs")
                await self._start_reply(turn, text)
            else:
                self.turns.pop(event.turn_id, None)

    async def _weigh_words(self, turn_id: int, words: str) -> None:
        """The caller paused, and their words so far are transcribed: the language model's
        probability that their sentence ends there goes to the end-of-turn judge; then the reply
        starts preemptively on those words (from the cache that computation left: one prefill)."""
        probability, judge = None, self.judge
        if judge is not None and judge.expects_words:
            try:
                asked = (*self._prompt(), ChatMessage("user", bare_words(words)))
                probability = await self.conversation.end_of_turn(asked, self._tools(1))
            except Exception as exc:  # the words are evidence; without them the sound decides
                log.warning("turn %d: the LLM's end-of-turn probability failed: %s", turn_id, exc)
            if probability is not None:
                log.debug("turn %d: P(end of sentence | %r) = %.3f", turn_id, words, probability)
            judge.words(turn_id, probability)
        turn = self.turns.get(turn_id) or Turn(turn_id)
        if (self.config.session.preemptive and self.reply is None and self.pending_barge is None
                and turn_id == self.last_started and not self.closed and "asr_final" not in turn.marks):
            self.turns[turn_id] = turn
            await self._start_reply(turn, words, preemptive=True)

    def _let_go(self, turn_id: int, text: str) -> None:
        """What the caller said over the bot was only a backchannel: the reply goes on."""
        log.info("turn %d: %r while the bot talks: not an interruption", turn_id, text)
        self._release_reply()

    def _bot_talking(self) -> bool:
        reply = self.reply
        return reply is not None and reply.confirmed.is_set()

    def _is_backchannel(self, text: str) -> bool:
        """Nothing recognized, or only backchannel words ("mm-hmm", "yeah", "okay"...)."""
        phrases, singles = _backchannel_forms(tuple(self.config.session.backchannels))
        said = _plain_words(text.replace("-", ""))
        return not said.split() or said.replace(" ", "") in phrases or all(w in singles for w in said.split())

    def _hold_reply(self, turn_id: int) -> None:
        """The caller makes a sound while the bot talks: pause the reply's audio until its words
        decide (a word that is not a backchannel interrupts; nothing or a backchannel lets the
        reply go on), or until it has lasted barge_in_max_hold_ms, which interrupts in any case."""
        self.reply_audio_open.clear()
        self.pending_barge = turn_id
        if self.barge_timer is not None:
            self.barge_timer.cancel()
        cfg = self.config
        wait = max(0, cfg.session.barge_in_max_hold_ms - cfg.endpointing.min_speech_ms) / 1000
        self.barge_timer = asyncio.create_task(self._barge_after(wait, turn_id))

    async def _barge_after(self, wait: float, turn_id: int) -> None:
        await self.clock.sleep(wait)
        if self.pending_barge == turn_id:
            await self._barge_in("sustained speech")

    async def _barge_in(self, why: str) -> None:
        reply = self.reply
        self._release_reply()
        if reply is not None:
            log.info("turn %d: barge-in (%s)", reply.turn.turn_id, why)
            await self._cancel_reply("interrupted")

    def _release_reply(self) -> None:
        self.pending_barge = None
        timer, self.barge_timer = self.barge_timer, None
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()
        self.reply_audio_open.set()

    def on_played(self, turn_id: int, played_ms: float, stopped: bool = False) -> None:
        """The client's playback clock (native `output_audio.played`, phone marks): how much of the
        turn's reply audio it has played. On barge-in the history keeps those words. `stopped`: the
        client stopped playing there (the Realtime API's truncate), so the report is exact rather
        than carried forward at playback speed."""
        played = int(played_ms * self.output_rate / 1000)
        turn = self.turns.get(turn_id)
        if turn is not None:
            turn.played_samples = max(turn.played_samples, played)
        if self.goodbye is not None and self.goodbye.turn_id == turn_id:
            self.goodbye.played_samples = max(self.goodbye.played_samples, played)
        reply = self.reply
        if reply is None or reply.turn.turn_id != turn_id:
            return
        played -= reply.offset_samples
        if stopped:
            reply.played_samples = min(reply.ledger.sent_samples(), max(0, played))
        else:
            reply.played_samples = min(reply.ledger.sent_samples(), max(played, reply.played_samples or 0))
        reply.played_at = self.clock.now()
        reply.playback_stopped = stopped

    def _heard_samples(self, reply: Reply) -> int:
        """The client's last report, carried forward at playback speed to now, within what was sent."""
        assert reply.played_samples is not None
        if reply.playback_stopped:
            return reply.played_samples
        since = max(0.0, self.clock.now() - reply.played_at)
        return min(reply.ledger.sent_samples(), reply.played_samples + int(since * self.output_rate))

    async def on_dtmf(self, digit: str) -> None:
        """A key pressed on the caller's phone. Keys interrupt the bot like words; they are collected
        until none comes for `session.dtmf_timeout_ms`, then answered as the caller's turn."""
        cfg = self.config.session
        if self.closed:
            return
        if len(self.digits) >= cfg.max_dtmf_digits:
            log.warning("more than %d keys in one turn; %r dropped", cfg.max_dtmf_digits, digit)
            return
        self.digits.append(digit)
        self.last_digit_at = self.clock.now()
        if self.dtmf_timer is not None:
            self.dtmf_timer.cancel()
        self.dtmf_timer = asyncio.create_task(self._digits_after(cfg.dtmf_timeout_ms / 1000))
        if self._bot_talking() or self.pending_barge is not None:
            await self._barge_in("a key press")

    async def _digits_after(self, wait: float) -> None:
        await self.clock.sleep(wait)
        digits, self.digits = self.digits, []
        self.dtmf_timer = None
        if not digits:
            return
        # A turn like a spoken one: it ends (speech_end) when the keys are judged complete, and its
        # "transcript" is ready at once; the caller's true end is the last key press.
        turn = Turn(next(self.turn_ids))
        self.last_started = max(self.last_started, turn.turn_id)
        now = self.clock.now()
        turn.mark("speech_end", now)
        turn.mark("asr_final", now)
        turn.ended_at = self.last_digit_at
        turn.dtmf = " ".join(digits)
        self.turns[turn.turn_id] = turn
        text = dtmf_text(digits)
        log.info("turn %d: keys %s", turn.turn_id, " ".join(digits))
        reply = self.reply
        if reply is not None and reply.preemptive and not reply.confirmed.is_set():
            await self._discard_preemptive(reply, "the caller pressed keys")  # nobody heard it
        await self.outbound.send_event(TranscriptFinal(turn.turn_id, text, now))
        await self._start_reply(turn, text)  # not if the caller hung up meanwhile (_start_reply checks)

    # -- turns a client asks for (the Realtime API's conversation.item.create and response.create) --
    def set_instructions(self, text: str) -> None:
        """The system prompt of the replies from now on."""
        self.history[0] = ChatMessage("system", text)

    async def on_text(self, text: str | None) -> int:
        """A turn the client typed, or (None) a reply to the conversation as it stands: answered like
        a spoken turn whose transcript is ready at once (its `speech_end` is now). It stops the
        reply in progress. Returns the turn's id (0: the caller has gone)."""
        if self.closed:
            return 0
        turn = Turn(next(self.turn_ids))
        self.last_started = max(self.last_started, turn.turn_id)
        now = self.clock.now()
        turn.mark("speech_end", now)
        turn.mark("asr_final", now)
        turn.ended_at = now
        self.turns[turn.turn_id] = turn
        reply = self.reply
        if reply is not None and reply.preemptive and not reply.confirmed.is_set():
            await self._discard_preemptive(reply, "the client asked for a reply")  # nobody heard it
        await self._start_reply(turn, text)
        return turn.turn_id

    async def cancel_reply(self) -> bool:
        """The client stops the reply in progress (it ends `interrupted`, keeping what was heard);
        False when none is in progress."""
        if self.reply is None or not self.reply.confirmed.is_set():
            return False
        await self._barge_in("the client cancelled it")
        return True

    def _tools(self, step: int) -> Tools | None:
        return self.toolbox.tools(step) if self.toolbox is not None else None

    def _prepare(self, messages: tuple[ChatMessage, ...]) -> None:
        """Give the LLM a head start: prefill the conversation so far (and the caller's words while
        they speak), so that at the final transcript only what changed is computed. Only between
        replies: a reply's generation owns the conversation's cache while it runs."""
        if self.preparing is not None and not self.preparing.done():
            self.preparing.cancel()
        self.preparing = asyncio.create_task(self._prepare_quietly(messages))

    async def _prepare_quietly(self, messages: tuple[ChatMessage, ...]) -> None:
        try:
            await self.conversation.prepare(messages, self._tools(1))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a head start that fails costs nothing but the head start
            log.warning("LLM head start failed: %s", exc)

    # -- the reply line --------------------------------------------------------------------------
    async def _start_reply(self, turn: Turn, text: str | None, preemptive: bool = False, step: int = 1,
                           fixed_text: str | None = None) -> None:
        """Start the reply line for the caller's words. A preemptive reply (at a pause, on the early
        transcript) runs the LLM and TTS at once but sends nothing until `_confirm`; its words join
        the history only then. `text` None: a reply to the same turn (a follow-up to tool results,
        step > 1, or the `fixed_text` filler)."""
        if self.closed:
            log.info("turn %d: not answered: the caller has gone", turn.turn_id)
            return
        self._release_reply()
        await self._cancel_reply("interrupted")
        user = ChatMessage("user", text or "")
        if text is not None and not preemptive:
            self.history.append(user)
        if text is not None:
            self.answering = turn.turn_id
        self.generation += 1
        reply = Reply(turn, prompt=(*self._prompt(), user) if preemptive else self._prompt(), user_text=text or "",
                      preemptive=preemptive, step=step, fixed_text=fixed_text, offset_samples=turn.sent_samples,
                      speaks=self.speaks)
        if not preemptive:
            reply.confirmed.set()
        self.reply = reply
        generation = self.generation
        # The LLM serves the call whose audio is due soonest: first, this reply's first audio. A
        # preemptive reply is due nowhere until its turn is confirmed over (`_confirm`), so calls
        # with audio due go first.
        if preemptive:
            self.conversation.set_deadline(None)
        else:
            self._first_audio_due(reply)
        reply.tasks = [
            asyncio.create_task(self._produce(reply, generation)),
            asyncio.create_task(self._play(reply, generation)),
        ]

    async def _confirm(self, reply: Reply) -> None:
        """The turn a preemptive reply answers is over, with the same words: it joins the history
        and sends what it has (held text at once, audio paced as usual)."""
        log.info("turn %d: preemptive reply confirmed (%d words ready)", reply.turn.turn_id, reply.words)
        self.history.append(ChatMessage("user", reply.user_text))
        self._first_audio_due(reply)
        reply.confirmed.set()
        held, reply.unsent = reply.unsent, []
        for event in held:
            await self.outbound.send_event(event)

    def _first_audio_due(self, reply: Reply) -> None:
        """The reply's first audio is due first_audio_budget_ms after the caller's end of speech;
        the LLM serves the call whose audio is due soonest."""
        turn = reply.turn
        ended = turn.ended_at if turn.ended_at is not None else turn.marks.get("speech_end", self.clock.now())
        reply.first_audio_due = ended + self.config.session.first_audio_budget_ms / 1000
        self.conversation.set_deadline(reply.first_audio_due)

    async def _send_for(self, reply: Reply, event: OutEvent) -> None:
        """Send a reply's event, or hold it while the reply is preemptive and unconfirmed: the
        caller learns nothing of a reply that may be dropped."""
        if reply.confirmed.is_set():
            await self.outbound.send_event(event)
        else:
            reply.unsent.append(event)

    async def _discard_preemptive(self, reply: Reply, why: str) -> None:
        """Drop a preemptive reply nobody heard. The LLM's cache keeps the prompt, so a reply to the
        longer turn recomputes only what changed."""
        log.info("turn %d: preemptive reply dropped (%s) after %d words", reply.turn.turn_id, why, reply.words)
        await self._cancel_reply("interrupted", send=False)

    def _prompt(self) -> tuple[ChatMessage, ...]:
        cfg = self.config.session
        return prompt_window(self.history, cfg.max_history_messages,
                             min(cfg.history_drop_block, cfg.max_history_messages))

    async def _produce(self, reply: Reply, generation: int) -> None:
        """Run LLM -> chunker -> TTS for the turn and fill the playout queue; whatever happens, end
        the queue, so the turn ends (failed, with an error event, if a stage raised)."""
        cfg = self.config
        turn = reply.turn
        request = ReplyRequest(turn.turn_id, reply.prompt, self.clock.now(), self._tools(reply.step))
        text = (llm_stage(_one(request), self.conversation, cfg.sampling, self.clock) if reply.fixed_text is None
                else _said(turn.turn_id, reply.fixed_text, self.clock))
        phrases = chunk_stage(text, cfg.chunker, self.clock)
        audio = (tts_stage(phrases, self.backends.tts, self.backends.tts_worker, self.output_rate, self.clock)
                 if reply.speaks else phrases)
        try:
            async with contextlib.aclosing(audio):
                async for event in audio:
                    if generation != self.generation:
                        return
                    if isinstance(event, ReplyText):
                        turn.mark("llm_first_token", event.at)
                        reply.words += len(event.text.split())
                        await self._send_for(reply, event)
                    elif isinstance(event, Phrase):
                        turn.mark("first_phrase", event.at)
                        reply.ledger.add_phrase(event.index, event.text)
                    elif isinstance(event, ReplyAudio):
                        turn.mark("tts_first_audio", event.at)
                        reply.ledger.add_audio(event.phrase_index, len(event.samples))
                        await self._queue_audio(reply, event)
                    elif isinstance(event, ReplyToolCall):
                        await self._dispatch(reply, event.call, generation)
                    elif isinstance(event, ReplyFinished):
                        reply.stats = event.stats
                        if event.error:
                            reply.error = event.error
                            await self._apologize(reply)
        except Exception as exc:  # a stage failed mid-reply: the turn ends "failed", the call goes on
            if generation == self.generation:
                code = exc.code if isinstance(exc, VoiceAgentError) else "internal_error"
                detail = f"{type(exc).__name__}: {exc}"
                log.error("turn %d: the reply failed: %s", turn.turn_id, detail, exc_info=exc)
                reply.error = f"{code}: {detail}"  # the call's record keeps the detail; the caller gets
                told = str(exc) if isinstance(exc, VoiceAgentError) else "an unexpected error (in the server log)"
                await self._send_for(reply, ErrorEvent(code, f"the reply failed: {told}", turn.turn_id))
        finally:
            reply.produced.set()
            reply.playout.put_nowait(None)  # the player always learns that nothing more is coming
            # Close the line from its end back to the LLM, so an abandoned generation stops now.
            for stage in (audio, phrases, text):
                await stage.aclose()

    async def _apologize(self, reply: Reply) -> None:
        """The LLM failed: say a short apology, unless reply audio was already queued (never fall
        back once the turn has sent audio)."""
        code = (reply.error or "engine_error").split(":", 1)[0]
        await self._send_for(reply, ErrorEvent(code, f"the reply failed: {reply.error}", reply.turn.turn_id))
        if reply.ledger.produced or not reply.speaks:
            return
        tts = self.backends.tts
        chunks = await self.backends.tts_worker.run(lambda: list(tts.synthesize(self.config.session.apology)))
        for chunk in chunks:
            audio = resample(np.asarray(chunk, dtype=np.float32), tts.sample_rate, self.output_rate)
            reply.turn.mark("tts_first_audio", self.clock.now())
            await self._queue_audio(reply, ReplyAudio(reply.turn.turn_id, -1, audio, self.clock.now()))

    async def _queue_audio(self, reply: Reply, audio: ReplyAudio) -> None:
        """Queue audio for the player, first waiting while max_playout_s of it waits to be sent: the
        LLM and the TTS pause with it, instead of filling memory far ahead of the caller's ears."""
        bound = int(self.config.session.max_playout_s * self.output_rate)
        while reply.queued_samples >= bound:
            reply.room.clear()
            await reply.room.wait()
        reply.queued_samples += len(audio.samples)
        await reply.playout.put(audio)

    async def _play(self, reply: Reply, generation: int) -> None:
        """Send the playout queue's audio in fixed chunks, paced by a virtual playhead: where the
        caller's playback will be once everything sent so far has played. A chunk starts playing at
        max(playhead, now) (after a gap in the reply, playback starts again from now) and is sent
        no earlier than `output_lead_ms` before it starts, so "sent" never runs more than the lead
        (and a chunk) ahead of "heard", also after the pauses a slow LLM leaves between phrases."""
        cfg = self.config.session
        rate = self.output_rate
        lead = cfg.output_lead_ms / 1000
        chunk = max(1, rate * cfg.output_chunk_ms // 1000)
        bound = int(cfg.max_playout_s * rate)
        # The playhead is `anchor + placed / rate`: the clock time a stretch of playback began and
        # the samples placed in it since, counted exactly (no float sums that drift with the clock's
        # magnitude). A new stretch begins when playback ran dry.
        anchor: float | None = None
        placed = 0
        due: float | None = None  # the LLM's deadline for this reply's next tokens, never moved earlier
        relaxed = False
        tolerance = 0.02  # a later chunk than this, once the playhead ran out, is an underrun
        while (item := await reply.playout.get()) is not None:
            for start in range(0, len(item.samples), chunk):
                piece = item.samples[start:start + chunk]
                if not reply.confirmed.is_set():  # a preemptive reply waits for the end of the turn
                    await reply.confirmed.wait()
                held = not self.reply_audio_open.is_set()
                if held:  # the caller makes a sound: hold until it is known what (a pause, not an underrun)
                    await self.reply_audio_open.wait()
                now = self.clock.now()
                first = anchor is None
                gap = 0.0
                if anchor is None or anchor + placed / rate < now:  # the first chunk, or playback ran dry
                    if anchor is not None and not held:
                        gap = now - (anchor + placed / rate)
                    anchor, placed = now, 0
                begins = anchor + placed / rate
                if begins - lead > now:
                    await self.clock.sleep(begins - lead - now)
                if generation != self.generation:
                    return
                await self.outbound.send_audio(float_to_pcm16(piece), reply.turn.turn_id)
                if self.tap is not None:
                    self.tap.bot(piece, rate, begins)
                if first:
                    sent = self.clock.now()
                    reply.turn.mark("first_audio_sent", sent)
                    if reply.step > 1 and reply.fixed_text is None:
                        reply.turn.mark("answer_first_audio_sent", sent)
                    reply.deadline_missed = reply.first_audio_due is not None and sent > reply.first_audio_due
                if gap > tolerance:  # the caller's playback ran dry before this chunk was ready
                    reply.underruns += 1
                    reply.underrun_s += gap
                placed += len(piece)
                reply.ledger.add_sent(item.phrase_index, len(piece))
                reply.turn.sent_samples += len(piece)
                reply.queued_samples -= len(piece)
                if reply.queued_samples < bound:
                    reply.room.set()
                # The token-rate budget: the audio made so far runs out at `dry`; the LLM's next
                # tokens are due earlier by the time the next phrase takes to write and synthesize
                # (other calls' first, if theirs are due sooner). Audio only ever adds to what is
                # left to play, so the deadline only moves later: kept so by max(), not by rounding.
                dry = anchor + (placed + reply.queued_samples) / rate
                if generation == self.generation and (due is None or dry - cfg.refill_ms / 1000 > due):
                    due = dry - cfg.refill_ms / 1000
                    self.conversation.set_deadline(due)
                # ... and far ahead of playback, speculation buys nothing.
                ahead = dry - self.clock.now()
                if (ahead > cfg.speculation_relax_s) != relaxed:
                    relaxed = not relaxed
                    self.conversation.set_speculation_cap(0 if relaxed else None)
        if relaxed:
            self.conversation.set_speculation_cap(None)
        if generation == self.generation:
            await self._finish(reply, "failed" if reply.error else "tool_calls" if reply.runs else "completed")

    async def _finish(self, reply: Reply, status: str, send: bool = True) -> None:
        if reply.finished:
            return
        reply.finished = True
        reply.ended.set()
        if self.reply is reply:
            self.reply = None
        if self.reply is None:  # no reply runs: the LLM owes this call nothing
            self.conversation.set_deadline(None)
        if status in ("completed", "tool_calls") or not reply.speaks:  # a text reply: every word was sent
            text = reply.ledger.full_text()
        elif reply.played_samples is not None:  # what the client says it played
            text = reply.ledger.text_until(self._heard_samples(reply))
        else:  # no word from the client: what was sent, paced to playback, is the best estimate
            text = reply.ledger.sent_text()
        reply.kept_text = text
        if text and not reply.runs and reply.fixed_text is None:  # calls' replies: see _after_tools
            self.history.append(ChatMessage("assistant", text))
        if not reply.runs:
            self.turns.pop(reply.turn.turn_id, None)
        done = ResponseDone(
            reply.turn.turn_id, text, status, reply.turn.latency_ms(), reply.turn.voice_to_voice_ms(), reply.stats,
            reply.deadline_missed, reply.underruns, round(reply.underrun_s * 1000, 1),
            preemptive=reply.preemptive, discarded=self.discarded, discarded_words=self.discarded_words,
            user_text=reply.user_text, generated_text=reply.ledger.full_text(), sent_text=reply.ledger.sent_text(),
            error=reply.error, dtmf=reply.turn.dtmf, speech_end_at=reply.turn.marks.get("speech_end"),
            tool_calls=tuple(r.as_dict(reply.turn.marks.get("speech_end"))
                             for r in (reply.runs if reply.runs else reply.turn.tool_runs if reply.step > 1 else [])),
            filler=reply.fixed_text is not None,
        )
        self.discarded = self.discarded_words = 0
        log.info("turn %d %s: %s%s%s", done.turn_id, status, done.latency_ms,
                 " (first audio late)" if done.deadline_missed else "",
                 f" ({done.underruns} underruns, {done.underrun_ms:.0f} ms)" if done.underruns else "")
        if send:
            await self.outbound.send_event(done)
        if (status == "completed" and self.ending_turn == reply.turn.turn_id and reply.step > 1
                and reply.fixed_text is None and self.hang_up is not None):
            task = asyncio.create_task(self._hang_up_after(reply))
            self.tool_tasks.add(task)
            task.add_done_callback(self.tool_tasks.discard)
        # One record per turn: the reply that answers it (with every call the turn made); a reply
        # that made calls is recorded only if no answer follows (_after_tools), a filler never.
        if reply.runs:
            reply.turn.held_record = done
        elif reply.fixed_text is None:
            await self._record(done)

    async def _record(self, done: ResponseDone) -> None:
        if self.on_turn is not None:
            result = self.on_turn(done)
            if result is not None:
                await result

    async def _cancel_reply(self, status: str, send: bool = True, keep: bool = False) -> None:
        """Stop the reply in progress. `send`: tell the caller (response.done); `keep`: without
        telling, still hand the turn to on_turn (its record) when some of its audio was sent. A
        preemptive reply not yet confirmed was never heard, whoever stops it (the caller went on,
        spoke again, pressed keys, hung up): it is only counted as discarded, never reported."""
        reply = self.reply
        if reply is None:
            return
        if not reply.confirmed.is_set():
            self.discarded += 1
            self.discarded_words += reply.words
            send = keep = False
        self.generation += 1
        self.reply = None
        for task in reply.tasks:
            task.cancel()
        await asyncio.gather(*reply.tasks, return_exceptions=True)
        # A cap set while the reply ran far ahead of playback must not outlive the reply.
        self.conversation.set_speculation_cap(None)
        if self.tap is not None and reply.ledger.sent_samples():
            self.tap.bot_stopped(self.clock.now())  # sent ahead of playback, then cut: never heard
        if send or (keep and reply.ledger.sent_samples()):
            await self._finish(reply, status, send=send)
        else:
            reply.finished = True
            reply.ended.set()

    # -- tool calls ------------------------------------------------------------------------------
    async def _dispatch(self, reply: Reply, call: ToolCall, generation: int) -> None:
        """Run a call the reply made, once the reply is known to be heard: a preemptive reply holds
        its calls until its turn is confirmed, and one dropped meanwhile runs none (this task is
        cancelled with it). Once dispatched a call runs to its end whatever the caller does."""
        if not reply.confirmed.is_set():
            await reply.confirmed.wait()
        if generation != self.generation or self.toolbox is None:
            return
        now = self.clock.now()
        if not reply.runs:
            reply.history_at = len(self.history)
            reply.turn.mark("tool_dispatched", now)
        run = ToolRun(call, self.toolbox.runs_on(call.name), now)
        earlier = next((r for r in reply.turn.tool_runs if r.output is not None and r.same_call(call)), None)
        reply.runs.append(run)
        reply.turn.tool_runs.append(run)
        if earlier is not None:  # asked again what it was told this turn: not run twice (it would act twice)
            run.output, run.finished_at, run.repeat_of = earlier.output, now, earlier.call.call_id
            log.info("turn %d: tool call %s repeats %s: its result is given again, not run", reply.turn.turn_id,
                     call.call_id, earlier.call.call_id)
            task = asyncio.create_task(asyncio.sleep(0, run))
        else:
            log.info("turn %d: tool call %s %s(%s) (%s)", reply.turn.turn_id, call.call_id, call.name,
                     call.arguments, run.runs_on)
            task = asyncio.create_task(self.toolbox.run(run))
        reply.run_tasks.append(task)
        self.tool_tasks.add(task)
        task.add_done_callback(self.tool_tasks.discard)
        if len(reply.runs) == 1:
            follow = asyncio.create_task(self._after_tools(reply))
            self.tool_tasks.add(follow)
            follow.add_done_callback(self.tool_tasks.discard)

    async def _after_tools(self, reply: Reply) -> None:
        """Wait for every call of the reply, with one spoken filler if they are slow; then put the
        reply's words and calls and the results in the history, and answer from them (unless the
        caller has moved on to another turn: the results stay in the history all the same)."""
        assert self.toolbox is not None
        cfg, turn = self.toolbox.config, reply.turn
        await reply.produced.wait()
        runs = list(reply.run_tasks)
        _, slow = await asyncio.wait(runs, timeout=cfg.filler_after_ms / 1000)
        filler: Reply | None = None
        if slow and cfg.filler and "filler" not in turn.marks and self.answering == turn.turn_id:
            await reply.ended.wait()  # after the reply's own words, if it had some
            if self.reply is None and self.answering == turn.turn_id and not all(t.done() for t in slow):
                turn.mark("filler", self.clock.now())
                await self._start_reply(turn, None, step=reply.step, fixed_text=cfg.filler)
                filler = self.reply
        await asyncio.gather(*runs)
        turn.mark("tools_done", self.clock.now())
        await reply.ended.wait()
        messages = [ChatMessage("assistant", reply.kept_text or "", tuple(r.call for r in reply.runs)),
                    *(ChatMessage("tool", r.output or "", tool_call_id=r.call.call_id) for r in reply.runs)]
        self.history[reply.history_at:reply.history_at] = messages
        if filler is not None:
            await filler.ended.wait()
            heard = bool(filler.kept_text)
            for run in reply.runs:
                run.filler_heard = heard
        if self.answering != turn.turn_id or self.closed or self.reply is not None:
            log.info("turn %d: tool results kept; no follow-up (the caller went on)", turn.turn_id)
            self.turns.pop(turn.turn_id, None)
            if turn.held_record is not None:  # the turn's record: the calls' reply, with their results
                since = turn.marks.get("speech_end")
                kept = tuple(r.as_dict(since) for r in turn.tool_runs)
                await self._record(replace(turn.held_record, tool_calls=kept))
            return
        step = reply.step + 1
        if all(r.repeat_of for r in reply.runs):  # the model goes round in circles: it must answer in words
            step = max(step, cfg.max_steps + 1)
        await self._start_reply(turn, None, step=step)

    async def _ask_client(self, call: ToolCall) -> str:
        """A client tool: the client runs it and answers with function_call.output."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.asked[call.call_id] = future
        try:
            await self.outbound.send_event(FunctionCallRequest(self.answering, call))
            return await future
        finally:
            self.asked.pop(call.call_id, None)

    def on_function_output(self, call_id: str, output: str) -> bool:
        """The client's answer to a call it was asked to run; False if no such call is waiting."""
        future = self.asked.get(call_id)
        if future is None or future.done():
            return False
        future.set_result(output)
        return True

    def _end_call(self) -> None:
        """The model called end_call: the call ends once this turn's goodbye has been heard."""
        self.ending_turn = self.answering
        log.info("turn %d: end_call: hanging up after the goodbye", self.answering)

    async def _hang_up_after(self, reply: Reply) -> None:
        """Hang up once the goodbye was heard: the client's playback reports (the browser's, a phone
        line's marks) cover its audio, or, without reports, once it surely has played (it is sent
        at most session.output_lead_ms ahead of playback) plus tools.goodbye_grace_ms."""
        assert self.hang_up is not None
        turn = reply.turn
        need = reply.offset_samples + reply.ledger.sent_samples()
        goodbye = Goodbye(turn.turn_id, need, turn.played_samples)
        self.goodbye = goodbye
        grace = (self.toolbox.config.goodbye_grace_ms if self.toolbox is not None else 2000) / 1000
        deadline = self.clock.now() + self.config.session.output_lead_ms / 1000 + grace
        while goodbye.played_samples < need and self.clock.now() < deadline:
            await self.clock.sleep(0.05)
        heard = goodbye.played_samples >= need
        log.info("turn %d: the goodbye was %s; hanging up", turn.turn_id,
                 "heard" if heard else "not reported as heard in time")
        self.hang_up()
