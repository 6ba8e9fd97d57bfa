"""What a session is made of: the engines it shares with other calls, its settings, its two ports
to the transport (Inbound for the caller's audio, Outbound for what goes back), its recording tap
(AudioTap), and one reply in flight (Reply)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from core.worker import ModelWorker
from models.llm.tool_calls import Tools
from models.protocols import (
    Audio,
    ChatMessage,
    GenerationStats,
    LanguageModel,
    SamplingParams,
    SpeechRecognizer,
    Synthesizer,
    TurnDetector,
    VoiceActivityDetector,
)
from pipeline.config import AsrStageConfig, ChunkerConfig, EndpointingConfig, SessionConfig
from pipeline.events import (
    AudioFrame,
    OutEvent,
    ReplyAudio,
)
from pipeline.tools import ToolRun
from pipeline.turns import PhraseLedger, Turn


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


class Taps:
    """Several taps as one: each is written in turn (a call's recording, the echo canceller's track)."""

    def __init__(self, *taps: AudioTap) -> None:
        self.taps = taps

    def bot(self, samples: Audio, rate: int, at: float) -> None:
        for tap in self.taps:
            tap.bot(samples, rate, at)

    def bot_stopped(self, at: float) -> None:
        for tap in self.taps:
            tap.bot_stopped(at)


class Outbound(Protocol):
    """The transport's side: each call returns once the message is written to the caller."""

    async def send_event(self, event: OutEvent) -> None: ...

    async def send_audio(self, pcm16: bytes, turn_id: int) -> None:
        """Reply audio at the session's output rate, of the turn `turn_id` (a phone transport marks
        how much of each turn's audio it sent, to learn how much was played)."""
        ...


class Inbound:
    """The way in for the caller's audio: frames queued for the session's input line, with the
    backlog the transport bounds (server.max_audio_backlog_ms). `put(None)`: the caller hung up.
    The way in for control (keys, playback reports, typed turns, tool results) is Session's methods."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[AudioFrame | None] = asyncio.Queue()
        self.backlog_samples = 0  # queued, not yet taken by the input line

    async def put(self, frame: AudioFrame | None) -> None:
        if frame is not None:
            self.backlog_samples += len(frame.samples)
        await self._queue.put(frame)

    async def frames(self) -> AsyncIterator[AudioFrame]:
        """The frames in order, until the caller hangs up."""
        while (frame := await self._queue.get()) is not None:
            self.backlog_samples -= len(frame.samples)
            yield frame


@dataclass
class Reply:
    turn: Turn
    ledger: PhraseLedger = field(default_factory=PhraseLedger)
    playout: asyncio.Queue[ReplyAudio | None] = field(default_factory=asyncio.Queue)
    stats: GenerationStats | None = None
    error: str | None = None
    honesty: float | None = None  # the honesty gate's chance that the caller asked for a look-up or an action
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    finished: bool = False
    queued_samples: int = 0  # produced but not yet sent (bounded by session.max_playout_s)
    room: asyncio.Event = field(default_factory=asyncio.Event)  # set while queued_samples is under the bound
    played_samples: int | None = None  # what the client says it has played (None: it has not said)
    offset_samples: int = 0  # the turn's audio sent by earlier replies to it: the client's count includes them
    played_at: float = 0.0  # clock time of that report
    playback_stopped: bool = False  # the client stopped playing there (a Realtime truncate): not carried forward
    # The player's stretch of playback (pipeline/session/playout.py): the clock time it began (its
    # first chunk went out then, after the reply's start, an underrun or a hold the caller played
    # dry) and the reply's samples sent before it. None: no audio sent yet.
    stretch_began: float | None = None
    stretch_from: int = 0
    prompt: tuple[ChatMessage, ...] = ()  # what the LLM is asked
    tools: Tools | None = None  # what it is offered (the call's tools at this step, or one response's own)
    user_text: str = ""  # the caller's words it answers
    # A preemptive reply (started at a pause) sends nothing until the turn is confirmed over.
    confirmed: asyncio.Event = field(default_factory=asyncio.Event)
    preemptive: bool = False
    unsent: list[OutEvent] = field(default_factory=list)  # text deltas and errors held until confirmed
    flushing: bool = False  # the held events are being sent: later ones queue behind them
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
    said_first: bool = False  # a fixed text said first on the call: the history keeps what was heard of it
    produced: asyncio.Event = field(default_factory=asyncio.Event)  # its generation is over
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # finished or cancelled
    status: str | None = None  # how it ended (completed, tool_calls, interrupted, failed); None while it runs
    kept_text: str | None = None  # what the history keeps of its words (set when it finishes)
    in_history: bool = True  # False: an out-of-band reply, which the history does not keep
    taken_back: bool = False  # the caller went on at its start: it left the history (session.take_back_ms)
    speaks: bool = True  # False: a text reply (the Realtime API's output_modalities ["text"]): no TTS, no audio

    def report_played(self, played: int, stopped: bool, now: float) -> None:
        """The client has played `played` samples of the turn's audio (its count includes earlier
        replies to the turn); `stopped`: it stopped there (exact, not carried forward)."""
        played -= self.offset_samples
        sent = self.ledger.sent_samples()
        if stopped:
            self.played_samples = min(sent, max(0, played))
        else:
            self.played_samples = min(sent, max(played, self.played_samples or 0))
        self.played_at = now
        self.playback_stopped = stopped

    def heard_samples(self, now: float, rate: int) -> int:
        """The client's last report, carried forward at playback speed to `now`, within what was sent
        and no further than the stretch of playback going on: audio sent after a gap (an underrun, a
        hold) began to play no earlier than it went out, so a report from before the gap is not
        carried across it."""
        assert self.played_samples is not None
        if self.playback_stopped:
            return self.played_samples
        since = max(0.0, now - self.played_at)
        heard = min(self.ledger.sent_samples(), self.played_samples + int(since * rate))
        if self.stretch_began is not None:
            playhead = self.stretch_from + int(max(0.0, now - self.stretch_began) * rate)
            heard = max(self.played_samples, min(heard, playhead))
        return heard

    def heard_text(self, status: str, now: float, rate: int) -> str:
        """The words the history keeps of it, ending with `status`: every word when it completed
        (or was text only), else the words the client says it played, else the words sent (paced to
        playback, the best estimate without reports)."""
        if status in ("completed", "tool_calls") or not self.speaks:
            return self.ledger.full_text()
        if self.played_samples is not None:
            return self.ledger.text_until(self.heard_samples(now, rate))
        return self.ledger.sent_text()

    async def confirm(self, outbound: Outbound) -> None:
        """Its turn is over with the words it answers: it may be heard. The events held until now
        go out first; events that come meanwhile wait behind them, in order."""
        self.flushing = True
        self.confirmed.set()
        try:
            while self.unsent:
                await outbound.send_event(self.unsent.pop(0))
        finally:
            self.flushing = False

    async def send(self, outbound: Outbound, event: OutEvent) -> None:
        """Send one of its events, or hold it while it is preemptive and unconfirmed: the caller
        learns nothing of a reply that may be dropped."""
        if self.confirmed.is_set() and not self.flushing:
            await outbound.send_event(event)
        else:
            self.unsent.append(event)

    async def stop(self) -> None:
        """Stop its producer and player and wait until they have stopped."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def end(self) -> None:
        self.finished = True
        self.ended.set()


@dataclass
class Goodbye:
    """The last reply of a call the agent ends: hung up once the client has played `need` samples
    of the turn's audio (or once it surely has, without reports)."""

    turn_id: int
    need: int
    played_samples: int = 0
    hung_up: bool = False
