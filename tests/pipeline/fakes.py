"""Fakes of the model engines, for testing the session's own logic (turn-taking, barge-in,
history, latency marks) without models. Named as fakes: never used by the service."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

import numpy as np

from core.clock import MonotonicClock
from models.llm.tool_calls import ToolCall, Tools
from models.protocols import (
    Audio,
    ChatMessage,
    GenerationDone,
    GenerationStats,
    LLMOutput,
    SamplingParams,
    TextDelta,
    ToolCallDelta,
    ToolCallOutput,
)
from pipeline.events import OutEvent


class DistantClock(MonotonicClock):
    """The real clock, read as a machine up for about 12 days would read it: at this magnitude a
    float sum is off by ~1e-10 s, so code that is monotone only by luck of rounding shows it."""

    OFFSET_S = 1_000_000.123456789

    def now(self) -> float:
        return super().now() + self.OFFSET_S


class ManualClock:
    """A fake clock whose time moves only when the test moves it (`advance`): a sleep ends once the
    test has moved time past it, so a test of a timeout waits for events, never for the machine."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self._now + max(0.0, seconds), future))
        await future

    def sleeping(self) -> int:
        """Sleeps not over yet (cancelled ones excluded)."""
        return sum(not f.done() for _, f in self._sleepers)

    async def advance(self, seconds: float) -> None:
        """Move time on (once tasks just started have begun their sleeps); the sleeps it ends wake,
        and run until they next wait."""
        for _ in range(2):
            await asyncio.sleep(0)
        self._now += seconds
        woken = [f for at, f in self._sleepers if at <= self._now and not f.done()]
        self._sleepers = [(at, f) for at, f in self._sleepers if at > self._now and not f.done()]
        for future in woken:
            future.set_result(None)
        for _ in range(len(woken) + 1):
            await asyncio.sleep(0)


class FakeVadStream:
    """Speech wherever a 512-sample window's mean amplitude is over 0.1."""

    def __init__(self) -> None:
        self.pending = np.zeros(0, dtype=np.float32)

    def probabilities(self, samples: Audio) -> list[float]:
        buf = np.concatenate([self.pending, samples])
        n = len(buf) // 512
        self.pending = buf[n * 512:]
        return [1.0 if float(np.abs(buf[i * 512:(i + 1) * 512]).mean()) > 0.1 else 0.0 for i in range(n)]


class FakeVad:
    sample_rate = 16000
    window_samples = 512

    def new_stream(self) -> FakeVadStream:
        return FakeVadStream()


class FakeRecognizer:
    """Returns scripted transcripts, one per call of a final-length turn (partials get '...')."""

    sample_rate = 16000

    def __init__(self, finals: list[str]) -> None:
        self.finals = list(finals)

    def transcribe(self, audio: Audio, beam_size: int | None = None) -> str:
        return self.finals.pop(0) if self.finals else ""


class FakeSynthesizer:
    """0.1 s of a 200 Hz tone per word, at 8 kHz."""

    name = "fake"
    sample_rate = 8000

    def synthesize(self, text: str) -> Iterator[Audio]:
        n = int(0.1 * self.sample_rate) * len(text.split())
        yield (0.3 * np.sin(np.arange(n) * 2 * np.pi * 200 / self.sample_rate)).astype(np.float32)


class FakeConversation:
    def __init__(self, llm: FakeLLM) -> None:
        self.llm = llm
        self.deadline: float | None = None

    async def prepare(self, messages: Sequence[ChatMessage], tools: Tools | None = None,
                      open_last: bool = False) -> None:
        self.llm.prepared.append((list(messages), open_last))

    async def end_of_turn(self, messages: Sequence[ChatMessage], tools: Tools | None = None) -> float | None:
        """The fake LLM's `end_of_turn` answer for the words (a function of them), or None."""
        self.llm.asked_end_of_turn.append(messages[-1].content)
        return self.llm.end_of_turn(messages[-1].content) if self.llm.end_of_turn is not None else None

    async def stream(self, messages: Sequence[ChatMessage], params: SamplingParams,
                     tools: Tools | None = None) -> AsyncIterator[LLMOutput]:
        self.llm.requests.append(list(messages))
        self.llm.tools_seen.append(tools)
        reply = self.llm.replies.pop(0)
        parts = [reply] if isinstance(reply, str) else reply  # text, and tool calls (ToolCall), in order
        words = 0
        going_on = bool(messages) and messages[-1].unfinished  # from given words: a space before the first
        for part in parts:
            if isinstance(part, ToolCall):
                await asyncio.sleep(self.llm.token_delay)
                if self.llm.stream_arguments:  # in pieces as written, as the embedded engine gives them
                    for i in range(0, len(part.arguments), 4):
                        yield ToolCallDelta(part.call_id, part.name, part.arguments[i:i + 4])
                yield ToolCallOutput(part)
                continue
            for i, word in enumerate(part.split()):
                await asyncio.sleep(self.llm.token_delay)
                yield TextDelta(word if i == 0 and words == 0 and not going_on else " " + word)
                words += 1
        calls = any(isinstance(p, ToolCall) for p in parts)
        yield GenerationDone(GenerationStats(completion_tokens=words, duration_ms=1.0,
                                             finish_reason="tool_calls" if calls else "stop"))

    def set_speculation_cap(self, cap: int | None) -> None:
        self.llm.caps.append(cap)

    def set_deadline(self, at: float | None) -> None:
        self.deadline = at
        self.llm.deadlines.append(at)

    async def aclose(self) -> None:
        """A conversation's clean-up: instant, or as slow as the fake LLM is told (close_delay_s, and
        close_gate: a threading.Event that must be set first)."""
        self.llm.closing += 1
        try:
            await asyncio.sleep(self.llm.close_delay_s)
            while self.llm.close_gate is not None and not self.llm.close_gate.is_set():
                await asyncio.sleep(0.01)
        finally:
            self.llm.closed += 1


class FakeLLM:
    name = "fake"

    def __init__(self, replies: list[str] | list[str | list[str | ToolCall]], token_delay: float = 0.002) -> None:
        self.replies: list[str | list[str | ToolCall]] = list(replies)
        self.requests: list[list[ChatMessage]] = []
        self.tools_seen: list[Tools | None] = []  # what each reply was offered
        self.prepared: list[tuple[list[ChatMessage], bool]] = []  # every head start: messages, open_last
        self.stream_arguments = False  # a call's arguments also in pieces before the call (ToolCallDelta)
        self.token_delay = token_delay
        self.caps: list[int | None] = []
        self.deadlines: list[float | None] = []  # every set_deadline, in order
        self.close_delay_s = 0.0
        self.end_of_turn: Callable[[str], float] | None = None  # the words' end-of-turn probability, if any
        self.asked_end_of_turn: list[str] = []
        self.close_gate: threading.Event | None = None
        self.closing = 0  # conversations whose clean-up has begun
        self.closed = 0  # ... and ended (done, or cut short)

    @property
    def weighs_words(self) -> bool:
        return self.end_of_turn is not None

    def conversation(self, context_tokens: int | None = None) -> FakeConversation:
        return FakeConversation(self)

    async def aclose(self) -> None:
        return None


class RecordingOutbound:
    def __init__(self) -> None:
        self.events: list[OutEvent] = []
        self.audio: list[bytes] = []
        self.audio_turns: list[int] = []  # the turn of each audio chunk
        self.changed = asyncio.Event()

    async def send_event(self, event: OutEvent) -> None:
        self.events.append(event)
        self.changed.set()

    async def send_audio(self, pcm16: bytes, turn_id: int) -> None:
        self.audio.append(pcm16)
        self.audio_turns.append(turn_id)
        self.changed.set()

    async def wait(self, predicate: object, timeout: float = 5.0) -> None:
        async def loop() -> None:
            while not predicate():  # type: ignore[operator]
                self.changed.clear()
                await self.changed.wait()
        await asyncio.wait_for(loop(), timeout)
