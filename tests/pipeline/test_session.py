"""The session's turn-taking, barge-in and history, with fake engines (tests/pipeline/fakes.py)."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from core.clock import Clock, FakeClock
from models.llm.tool_calls import Tools
from models.protocols import Audio, ChatMessage, LLMOutput, SamplingParams, TextDelta
from pipeline.config import AsrStageConfig, ChunkerConfig, EndpointingConfig, ReplyBudgetConfig, SessionConfig
from pipeline.events import (
    AudioFrame,
    ErrorEvent,
    ReplyText,
    ResponseDone,
    SpeechStarted,
    SpeechStopped,
    TranscriptEarly,
    TranscriptFinal,
    TranscriptPartial,
)
from pipeline.session import Backends, PipelineConfig, Session
from tests.pipeline.fakes import (
    DistantClock,
    FakeConversation,
    FakeLLM,
    FakeRecognizer,
    FakeSynthesizer,
    FakeVad,
    RecordingOutbound,
)

# The fake story runs past the spoken budget; these tests are about other things, so they hear it whole
# (the budget in a session: test_a_long_reply_stops_at_its_budget_and_the_history_keeps_the_offer).
WHOLE = ReplyBudgetConfig(enabled=False)


def whole(**settings: Any) -> SessionConfig:
    """Replies heard whole, and (unless `take_back_ms` is given) never taken back."""
    return SessionConfig(reply_budget=WHOLE, **{"take_back_ms": 0, **settings})


STORY = ("Once upon a time, a little dragon lived in a cave by the sea. Every morning she flew over the "
         "waves. One day she found a lost ship and guided it home. The sailors cheered and sang for her.")


def make_session(llm: FakeLLM, finals: list[str], take_back_ms: int = 0) -> tuple[Session, RecordingOutbound]:
    """A session on fakes; `take_back_ms` 0: an interruption at a reply's start is a barge-in like any."""
    backends = Backends(FakeVad(), FakeRecognizer(finals), FakeSynthesizer(), llm)
    config = PipelineConfig(
        EndpointingConfig(min_speech_ms=64, end_silence_ms=256, prefix_padding_ms=100),
        AsrStageConfig(partials=False), ChunkerConfig(),
        whole(output_lead_ms=0, output_chunk_ms=20, take_back_ms=take_back_ms), SamplingParams(),
    )
    out = RecordingOutbound()
    return Session(backends, config, DistantClock(), out, output_rate=8000, system_prompt="Be kind."), out


def remade(session: Session, **changes: Any) -> Session:
    """The session made again with some of what it is given at its start changed (its engines, settings,
    clock, transport, tools): its parts are made with them. Its system prompt and on_turn are kept."""
    args: dict[str, Any] = {"backends": session.backends, "config": session.config, "clock": session.clock,
                            "outbound": session.outbound, "output_rate": session.output_rate,
                            "system_prompt": session.history[0].content, "on_turn": session.on_turn}
    return Session(**(args | changes))


async def speak(session: Session, seconds: float, loud: bool) -> None:
    samples = np.full(int(16000 * seconds), 0.5 if loud else 0.0, dtype=np.float32)
    for i in range(0, len(samples), 320):
        await session.audio_in.put(AudioFrame(samples[i:i + 320], 0.0))


def done_events(out: RecordingOutbound) -> list[ResponseDone]:
    return [e for e in out.events if isinstance(e, ResponseDone)]


async def test_a_turn_gets_a_reply_with_every_mark() -> None:
    llm = FakeLLM(["Sure, a table for two at eight is booked."])
    session, out = make_session(llm, ["Book a table for two at eight."])
    task = asyncio.create_task(session.run())
    await speak(session, 0.3, False)
    await speak(session, 0.5, True)
    await speak(session, 0.5, False)
    await out.wait(lambda: done_events(out))
    done = done_events(out)[0]
    assert done.status == "completed" and done.text == "Sure, a table for two at eight is booked."
    assert set(done.latency_ms) == {"speech_end", "asr_final", "llm_first_token", "first_phrase",
                                    "tts_first_audio", "first_audio_sent"}
    assert [m.role for m in session.history] == ["system", "user", "assistant"]
    assert llm.requests[0][0].content == "Be kind."
    await session.audio_in.put(None)
    await task


async def test_a_long_reply_stops_at_its_budget_and_the_history_keeps_the_offer() -> None:
    llm = FakeLLM([STORY])
    session, out = make_session(llm, ["Tell me a story."])
    config = SessionConfig(output_lead_ms=10000, output_chunk_ms=20, take_back_ms=0)
    session = remade(session, config=replace(session.config, session=config))
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    await speak(session, 0.4, False)
    await out.wait(lambda: done_events(out), timeout=10)
    done = done_events(out)[0]
    said = ("Once upon a time, a little dragon lived in a cave by the sea. Every morning she flew over the waves. "
            "One day she found a lost ship and guided it home. Shall I go on?")
    assert done.status == "completed" and done.text == said, done
    assert session.history[-1].content == said  # the caller can ask for the rest
    await session.audio_in.put(None)
    await task


async def test_barge_in_stops_audio_and_history_keeps_only_what_was_sent() -> None:
    llm = FakeLLM([STORY, "Okay, I stopped."])
    session, out = make_session(llm, ["Tell me a story.", "Stop."])
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    await speak(session, 0.4, False)
    # let about 0.6 s of the ~4 s story go out (20 ms chunks at 8 kHz = 320 bytes)
    await out.wait(lambda: sum(len(a) for a in out.audio) >= 2 * 8000 * 0.6)
    await speak(session, 0.3, True)
    await out.wait(lambda: done_events(out))
    chunks_at_interrupt = len(out.audio)
    first = done_events(out)[0]
    assert first.status == "interrupted"
    assert any(isinstance(e, SpeechStarted) and e.turn_id == 2 for e in out.events)
    # the 0.6 s or more sent, at 0.1 s per word: a prefix of the story, never the whole of it
    assert STORY.startswith(first.text) and 4 <= len(first.text.split()) < len(STORY.split()), first.text

    await speak(session, 0.4, False)
    await out.wait(lambda: len(done_events(out)) == 2)
    second = done_events(out)[1]
    assert all(turn == second.turn_id for turn in out.audio_turns[chunks_at_interrupt:]), \
        "audio of the story kept flowing after the barge-in"
    second_request = llm.requests[1]
    assert [m.role for m in second_request] == ["system", "user", "assistant", "user"]
    assert second_request[2].content == first.text  # only what was sent
    assert second_request[3].content == "Stop."
    assert any(isinstance(e, TranscriptFinal) and e.text == "Stop." for e in out.events)
    await session.audio_in.put(None)
    await task


@pytest.mark.parametrize("take_back_ms", [1000, 0])
async def test_a_reply_the_caller_talks_over_at_its_start_is_taken_back_and_the_words_answered_as_one(
        take_back_ms: int) -> None:
    """The turn was ended at a pause mid-sentence ("Book me a table for" | "two at eight."): the
    caller goes on as the reply starts. Within take_back_ms of its first audio the reply leaves the
    history and both parts are answered as one turn; with 0, it is a barge-in that keeps what was
    heard and answers the rest alone."""
    llm = FakeLLM([STORY, "Booked for two at eight."])
    session, out = make_session(llm, ["Book me a table for", "two at eight."], take_back_ms=take_back_ms)
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    await speak(session, 0.4, False)
    await out.wait(lambda: sum(len(a) for a in out.audio) >= 2 * 8000 * 0.2)  # 0.2 s of the reply went out
    await speak(session, 0.3, True)
    await out.wait(lambda: done_events(out))
    first = done_events(out)[0]
    assert first.status == "interrupted" and first.taken_back is (take_back_ms > 0)
    await speak(session, 0.4, False)
    await out.wait(lambda: len(done_events(out)) == 2)
    asked = [(m.role, m.content) for m in llm.requests[1][1:]]
    if take_back_ms:
        assert asked == [("user", "Book me a table for two at eight.")]
    else:
        assert asked == [("user", "Book me a table for"), ("assistant", first.text), ("user", "two at eight.")]
    assert [(m.role, m.content) for m in session.history[1:]] == [*asked, ("assistant", "Booked for two at eight.")]
    await session.audio_in.put(None)
    await task


async def test_noise_without_words_gets_no_reply() -> None:
    llm = FakeLLM([])
    session, out = make_session(llm, [""])
    task = asyncio.create_task(session.run())
    await speak(session, 0.3, True)
    await speak(session, 0.5, False)
    await out.wait(lambda: any(isinstance(e, TranscriptFinal) for e in out.events))
    await session.audio_in.put(None)
    await task  # every event of the call was handled: a reply would have put the words in the history
    assert len(session.history) == 1 and not llm.requests and not done_events(out)


async def test_speculation_is_capped_while_far_ahead_of_playback() -> None:
    llm = FakeLLM(["One two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen."])
    session, out = make_session(llm, ["Count to fifteen."])
    session = remade(session, config=replace(session.config, session=whole(output_lead_ms=0, output_chunk_ms=20,
                                                                   speculation_relax_s=0.8)))
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    await speak(session, 0.5, False)
    await out.wait(lambda: done_events(out), timeout=10)
    # 1.5 s of audio produced at once: capped while more than 0.8 s waited, released after
    assert llm.caps == [0, None]
    await session.audio_in.put(None)
    await task


class FailingSynthesizer(FakeSynthesizer):
    """A fake synthesizer that raises on its second phrase, mid-reply."""

    def __init__(self) -> None:
        self.calls = 0

    def synthesize(self, text: str) -> Iterator[Audio]:
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("the voice model crashed")
        yield from super().synthesize(text)


async def test_a_stage_that_raises_ends_the_turn_failed_and_the_call_goes_on() -> None:
    llm = FakeLLM([STORY, "Yes, I am still here."])
    session, out = make_session(llm, ["Tell me a story.", "Are you there?"])
    tts = FailingSynthesizer()
    session = remade(session, backends=Backends(FakeVad(), session.backends.asr, tts, llm))
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    await speak(session, 0.5, False)
    await out.wait(lambda: done_events(out), timeout=10)
    first = done_events(out)[0]
    errors = [e for e in out.events if isinstance(e, ErrorEvent)]
    assert first.status == "failed"
    assert errors and errors[0].turn_id == first.turn_id and errors[0].code == "internal_error"
    assert "the voice model crashed" in (first.error or "")  # for QA; the caller is told the code only
    assert STORY.startswith(first.text)  # what was sent of the first phrase, no more

    await speak(session, 0.5, True)
    await speak(session, 0.5, False)
    await out.wait(lambda: len(done_events(out)) == 2, timeout=10)
    second = done_events(out)[1]
    assert second.status == "completed" and second.text == "Yes, I am still here."
    await session.audio_in.put(None)
    await task


class PausingLLM(FakeLLM):
    """A fake LLM that stops for `pause` seconds after its first sentence, as a slow CPU does
    between phrases."""

    def __init__(self, first: str, second: str, pause: float) -> None:
        super().__init__([first + " " + second])
        self.first_words, self.pause = len(first.split()), pause

    def conversation(self, context_tokens: int | None = None) -> FakeConversation:
        llm = self

        class Pausing(FakeConversation):
            async def stream(self, messages: Sequence[ChatMessage], params: SamplingParams,
                             tools: Tools | None = None) -> AsyncIterator[LLMOutput]:
                i = 0
                async for out in super().stream(messages, params, tools):
                    if isinstance(out, TextDelta):
                        i += 1
                        if i == llm.first_words + 2:  # phrase 1 is out once a word follows it
                            await asyncio.sleep(llm.pause)
                    yield out

        return Pausing(self)


class TimedOutbound(RecordingOutbound):
    def __init__(self) -> None:
        super().__init__()
        self.audio_at: list[float] = []

    async def send_audio(self, pcm16: bytes, turn_id: int) -> None:
        self.audio_at.append(time.monotonic())
        await super().send_audio(pcm16, turn_id)


async def test_after_a_pause_between_phrases_audio_is_paced_not_burst() -> None:
    """Phrase 1 (0.2 s of audio) plays out; the LLM pauses 1 s; phrase 2 (0.6 s) must then go out
    at playback speed from the moment it is ready, not in a burst that makes "sent" run ahead of
    "heard" by the length of the pause."""
    llm = PausingLLM("Hello there.", "Here are six more words now.", pause=1.0)
    session, _ = make_session(llm, ["Hi."])
    out = TimedOutbound()
    session = remade(session, outbound=out)
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    await speak(session, 0.5, False)
    await out.wait(lambda: done_events(out), timeout=10)
    gaps = [b - a for a, b in itertools.pairwise(out.audio_at)]
    pause_at = max(range(len(gaps)), key=lambda i: gaps[i])  # the LLM's pause
    second = out.audio_at[pause_at + 1:]
    assert len(second) == 30  # 0.6 s in 20 ms chunks
    assert second[-1] - second[0] >= 0.5, f"phrase 2 went out in {second[-1] - second[0]:.3f} s"
    await session.audio_in.put(None)
    await task


class GatedRecognizer(FakeRecognizer):
    """A fake recognizer whose first transcript is ready only once the test opens `gate` (on the
    ASR worker thread): the test decides what happens before it, not the machine's speed."""

    def __init__(self, finals: list[str]) -> None:
        super().__init__(finals)
        self.gate = threading.Event()

    def transcribe(self, audio: Audio, beam_size: int | None = None) -> str:
        if not self.gate.wait(30):
            raise TimeoutError("the test never opened the gate")
        return super().transcribe(audio)


async def test_a_final_transcript_that_comes_while_the_caller_speaks_again_joins_the_next_turn() -> None:
    llm = FakeLLM(["A table for two, booked."])
    session, out = make_session(llm, [])
    asr = GatedRecognizer(["Book a table.", "For two, please."])
    session = remade(session, backends=Backends(FakeVad(), asr, FakeSynthesizer(), llm))
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    await speak(session, 0.3, False)  # the turn ends; its transcript is not ready ...
    await speak(session, 0.5, True)  # ... when the caller goes on
    await out.wait(lambda: any(isinstance(e, SpeechStarted) and e.turn_id == 2 for e in out.events))
    asr.gate.set()
    await speak(session, 0.5, False)
    await out.wait(lambda: done_events(out), timeout=10)
    await session.audio_in.put(None)
    await task  # every event of the call was handled
    assert [m.content for m in llm.requests[0][1:]] == ["Book a table. For two, please."]
    assert len(llm.requests) == 1 and len(done_events(out)) == 1
    assert done_events(out)[0].status == "completed"
    assert [m.role for m in session.history] == ["system", "user", "assistant"]


async def test_with_playback_reports_the_history_keeps_what_was_heard_not_what_was_sent() -> None:
    """The server sends audio up to output_lead_ms ahead; the client reports what it played. On
    barge-in the history keeps the words of the played audio (carried forward to the moment of the
    barge-in), not the words of everything sent."""
    llm = FakeLLM([STORY, "Okay."])
    session, out = make_session(llm, ["Tell me a story.", "Stop."])
    session = remade(session, config=replace(session.config, session=whole(output_lead_ms=1500, output_chunk_ms=20)))
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    await speak(session, 0.4, False)
    await out.wait(lambda: sum(len(a) for a in out.audio) >= 2 * 8000 * 1.5)  # 1.5 s sent at once
    turn = session.reply.turn.turn_id if session.reply else 1
    reported = session.clock.now()
    session.on_played(turn, 300.0)  # the client has played 0.3 s: three words at 0.1 s a word
    await speak(session, 0.3, True)  # the caller interrupts at once ("Stop.")
    await speak(session, 0.4, False)
    await out.wait(lambda: done_events(out))
    since = session.clock.now() - reported  # the most the report can have been carried forward
    first = done_events(out)[0]
    assert first.status == "interrupted"
    sent_words = len(session_ledger_sent_text(out))
    # 0.3 s reported, carried forward at playback speed (0.1 s a word) to the barge-in, before now
    assert STORY.startswith(first.text) and 3 <= len(first.text.split()) <= 4 + since / 0.1, (first.text, since)
    assert sent_words >= 12  # what was sent would have claimed four times as much
    assert session.history[2].content == first.text
    await session.audio_in.put(None)
    await task


async def test_a_stopped_playback_report_is_exact_and_a_client_cancel_keeps_it() -> None:
    """A Realtime client's truncate: it stopped playing at 0.3 s, so the history keeps exactly
    those three words however long the server takes to cancel (no carrying forward)."""
    llm = FakeLLM([STORY])
    session, out = make_session(llm, ["Tell me a story."])
    session = remade(session, config=replace(session.config, session=whole(output_lead_ms=1500, output_chunk_ms=20)))
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    await speak(session, 0.4, False)
    await out.wait(lambda: sum(len(a) for a in out.audio) >= 2 * 8000 * 1.5)
    turn = session.reply.turn.turn_id if session.reply else 1
    session.on_played(turn, 300.0, stopped=True)
    sent = sum(len(a) for a in out.audio)
    await out.wait(lambda: sum(len(a) for a in out.audio) >= sent + 2 * 8000 * 0.5)  # 0.5 s more sent, in real time
    assert await session.cancel_reply()  # carried forward, the report would be eight words by now
    first = done_events(out)[0]
    assert first.status == "interrupted" and first.text == " ".join(STORY.split()[:3]), first.text
    assert session.history[-1].content == first.text
    assert not await session.cancel_reply()  # nothing left to cancel
    await session.audio_in.put(None)
    await task


async def test_a_reply_sent_whole_is_cut_to_what_was_heard_when_the_client_says_so() -> None:
    """The server sends ahead of playback, so a reply can be sent whole while the caller still hears
    it; a client that stopped playing (a Realtime truncate) has the history cut to what was heard."""
    llm = FakeLLM([STORY])
    session, out = make_session(llm, ["Tell me a story."])
    session = remade(session, config=replace(session.config, session=whole(output_lead_ms=10000, output_chunk_ms=20)))
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    await speak(session, 0.4, False)
    await out.wait(lambda: done_events(out), timeout=10)
    assert done_events(out)[0].status == "completed" and session.history[-1].content == STORY
    assert session.cut_heard(1, 300.0) == " ".join(STORY.split()[:3])
    assert session.history[-1].content == " ".join(STORY.split()[:3])
    assert session.cut_heard(1, 0.0) == "" and session.history[-1].role == "user"  # nothing heard: nothing kept
    assert session.cut_heard(7, 300.0) is None  # no such reply
    await session.audio_in.put(None)
    await task


def session_ledger_sent_text(out: RecordingOutbound) -> list[str]:
    """The words the sent audio stands for (0.1 s a word at 8 kHz, 2 bytes a sample)."""
    seconds = sum(len(a) for a in out.audio) / 2 / 8000
    return STORY.split()[: int(seconds / 0.1)]


async def test_a_sound_without_words_over_the_bot_only_pauses_it() -> None:
    """The (fake) VAD takes a short loud sound for speech, the recognizer finds no words in it (a
    cough): the reply's audio pauses, then goes on, and the turn completes."""
    llm = FakeLLM(["One two three four five six seven eight nine ten."])
    session, out = make_session(llm, ["Count to ten.", ""])
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    await speak(session, 0.4, False)
    await out.wait(lambda: sum(len(a) for a in out.audio) >= 2 * 8000 * 0.3)
    await speak(session, 0.1, True)  # the cough
    await speak(session, 0.4, False)
    await out.wait(lambda: done_events(out), timeout=10)
    done = done_events(out)[0]
    assert done.status == "completed" and done.text == "One two three four five six seven eight nine ten."
    assert any(isinstance(e, SpeechStarted) and e.turn_id == 2 for e in out.events)  # it was heard
    assert len(llm.requests) == 1  # and got no reply of its own
    await session.audio_in.put(None)
    await task


async def test_reply_audio_waiting_to_be_sent_is_bounded_and_the_llm_waits_for_it() -> None:
    llm = FakeLLM([STORY])
    llm.token_delay = 0.0
    session, out = make_session(llm, ["Tell me a story."])
    session = remade(session, config=replace(session.config, session=whole(output_lead_ms=0, output_chunk_ms=20,
                                                                   max_playout_s=0.5)))
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    await speak(session, 0.5, False)
    most = 0
    read_all_at_sent: int | None = None  # audio sent when the LLM's whole story had gone through
    while not done_events(out):
        reply = session.reply
        if reply is not None:
            most = max(most, reply.queued_samples)
            if read_all_at_sent is None and reply.stats is not None:
                read_all_at_sent = sum(len(a) for a in out.audio) // 2
        await asyncio.sleep(0.01)
    # A phrase is at most max_words (24) words of 0.1 s: the queue never holds more than the bound
    # plus the one phrase that was queued while under it.
    longest_phrase = int(2.4 * 8000)
    assert 0 < most <= int(0.5 * 8000) + longest_phrase, most
    # ~4 s of story: the generation finished only once playback had made room, not at the start
    assert read_all_at_sent is not None and read_all_at_sent > int(1.0 * 8000), read_all_at_sent
    assert done_events(out)[0].status == "completed" and done_events(out)[0].text == STORY
    await session.audio_in.put(None)
    await task


def with_session_config(session: Session, **settings: float) -> Session:
    return remade(session, config=replace(session.config, session=whole(output_chunk_ms=20, **settings)))


async def speak_now(session: Session, seconds: float, loud: bool) -> None:
    """As speak(), with each frame stamped with the clock (as the transport does), so that the
    turn's estimated end of speech is a real clock time."""
    samples = np.full(int(16000 * seconds), 0.5 if loud else 0.0, dtype=np.float32)
    for i in range(0, len(samples), 320):
        await session.audio_in.put(AudioFrame(samples[i:i + 320], session.clock.now()))


async def one_reply(llm: FakeLLM, clock: Clock | None = None,
                    **settings: float) -> tuple[ResponseDone, Session, RecordingOutbound]:
    session, out = make_session(llm, ["Hi."])
    if clock is not None:
        session = remade(session, clock=clock)
    session = with_session_config(session, **settings)
    task = asyncio.create_task(session.run())
    await speak_now(session, 0.5, True)
    await speak_now(session, 0.5, False)
    await out.wait(lambda: done_events(out), timeout=10)
    await session.audio_in.put(None)
    await task
    return done_events(out)[0], session, out


async def test_an_underrun_is_counted_when_the_llm_pauses_mid_reply() -> None:
    """Phrase 1 (0.5 s of audio) plays out, the LLM stops for 1.5 s, then phrase 2 comes: the
    caller's playback ran dry for about a second, once. 200 ms of lead keeps event-loop jitter
    from counting."""
    done, _, _ = await one_reply(PausingLLM("Hello there my good friend.", "Here are six more words now.", 1.5),
                                 output_lead_ms=200)
    assert done.status == "completed"
    assert done.underruns == 1 and done.underrun_ms >= 500, (done.underruns, done.underrun_ms)


async def test_no_underrun_when_the_llm_keeps_up() -> None:
    done, _, _ = await one_reply(FakeLLM(["Hello there my good friend. Here are six more words now."]),
                                 output_lead_ms=200)
    assert done.status == "completed"
    assert done.underruns == 0 and done.underrun_ms == 0.0


@pytest.mark.parametrize("start", [936.235809291, 1_000_000.123456789, 0.1])
async def test_the_conversation_deadline_is_set_on_reply_start_and_cleared_after(start: float) -> None:
    """On a fake clock started at `start` (its magnitude decides how floats round: a clock at
    936.235809291 once gave deadlines ...09291 then ...0909999), so the run is the same on every machine."""
    llm = FakeLLM(["Hello there my good friend. Here are six more words now."])
    done, session, out = await one_reply(llm, FakeClock(start), output_lead_ms=200, first_audio_budget_ms=10_000)
    stopped = next(e for e in out.events if isinstance(e, SpeechStopped))
    # The reply starts at the pause, preemptively: due nowhere until the turn is over. (Whether the
    # final transcript comes before the words at the pause are weighed is up to the threads: then
    # the reply starts at the final transcript, not preemptively.) Its first audio is due
    # first_audio_budget_ms after the end of speech.
    due = llm.deadlines
    if done.preemptive:
        assert due[0] is None
        due = due[1:]
    assert due[0] == stopped.ended_at + 10.0
    # as audio plays: when the audio made so far runs out, never earlier than the one before
    playing = due[1:-1]
    assert playing and all(d is not None for d in playing)
    assert all(b >= a for a, b in itertools.pairwise(playing))  # type: ignore[operator]
    # the reply is over: nothing is due
    assert llm.deadlines[-1] is None
    conversation = session.conversation
    assert isinstance(conversation, FakeConversation) and conversation.deadline is None
    assert not done.deadline_missed  # ten seconds of budget


async def test_first_audio_after_its_budget_is_a_deadline_miss() -> None:
    done, _, _ = await one_reply(FakeLLM(["Hello there."]), output_lead_ms=200, first_audio_budget_ms=0)
    assert done.deadline_missed


def preemptive_session(llm: FakeLLM, finals: list[str]) -> tuple[Session, RecordingOutbound]:
    session, out = make_session(llm, finals)
    session = remade(session, config=replace(
        session.config,
        endpointing=EndpointingConfig(min_speech_ms=64, end_silence_ms=600, early_final_ms=192, prefix_padding_ms=100),
        session=whole(output_lead_ms=0, output_chunk_ms=20)))
    return session, out


class StampedOutbound(RecordingOutbound):
    """Records when each audio chunk and event went out."""

    def __init__(self) -> None:
        super().__init__()
        self.first_audio_at: float | None = None
        self.stopped_at: float | None = None

    async def send_event(self, event: object) -> None:
        if isinstance(event, SpeechStopped):
            self.stopped_at = time.monotonic()
        await super().send_event(event)  # type: ignore[arg-type]

    async def send_audio(self, pcm16: bytes, turn_id: int) -> None:
        if self.first_audio_at is None:
            self.first_audio_at = time.monotonic()
        await super().send_audio(pcm16, turn_id)


async def test_a_reply_starts_at_the_pause_and_its_audio_waits_for_the_end_of_the_turn() -> None:
    llm = FakeLLM(["Sure, a table for two at eight is booked."])
    session, _ = preemptive_session(llm, ["Book a table for two at eight."])
    out = StampedOutbound()
    session = remade(session, outbound=out)
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    for _ in range(40):  # 0.8 s of silence in real time: a pause at 192 ms, the end at 600 ms
        await speak(session, 0.02, False)
        await asyncio.sleep(0.02)
    await out.wait(lambda: done_events(out))
    done = done_events(out)[0]
    assert done.status == "completed" and done.preemptive and done.discarded == 0
    # the LLM answered during the silence, well before the turn was known to be over ...
    assert done.latency_ms["llm_first_token"] < -200, done.latency_ms
    # ... but nothing was sent before it was
    assert out.stopped_at is not None and out.first_audio_at is not None and out.first_audio_at >= out.stopped_at
    first_text = next(i for i, e in enumerate(out.events) if isinstance(e, ReplyText))
    assert any(isinstance(e, SpeechStopped) for e in out.events[:first_text])
    assert [m.role for m in session.history] == ["system", "user", "assistant"]
    await session.audio_in.put(None)
    await task


async def test_a_preemptive_reply_is_dropped_when_the_caller_goes_on_and_counted() -> None:
    llm = FakeLLM(["Which day would you like?", "Booked: a table for two at eight."])
    session, out = preemptive_session(llm, ["Book a table", "Book a table for two at eight."])
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    for _ in range(20):  # a 0.4 s pause mid-sentence: the first reply starts, then the caller goes on
        await speak(session, 0.02, False)
        await asyncio.sleep(0.02)
    await speak(session, 0.5, True)
    await speak(session, 0.8, False)
    await out.wait(lambda: done_events(out))
    await session.audio_in.put(None)
    await task  # every event of the call was handled
    dones = done_events(out)
    assert len(dones) == 1 and dones[0].text == "Booked: a table for two at eight."
    assert dones[0].discarded == 1 and dones[0].preemptive
    assert [r[-1].content for r in llm.requests] == ["Book a table", "Book a table for two at eight."]
    sent_text = "".join(e.text for e in out.events if isinstance(e, ReplyText))
    assert sent_text == "Booked: a table for two at eight."  # nothing of the dropped reply was sent
    assert [m.content for m in session.history if m.role == "user"] == ["Book a table for two at eight."]


async def yeah_over_the_story(session: Session, out: RecordingOutbound, llm: FakeLLM, silence_frames: int) -> None:
    """The caller asks for a story, the first turn ends after `silence_frames` 20 ms frames of silence (in
    real time), and a "yeah" (0.3 s) comes over the reply: the reply goes on to its end, and "yeah" gets no reply."""
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    for _ in range(silence_frames):
        await speak(session, 0.02, False)
        await asyncio.sleep(0.02)
    await out.wait(lambda: sum(len(a) for a in out.audio) >= 2 * 8000 * 0.3)
    await speak(session, 0.3, True)  # "yeah"
    for _ in range(100):
        await speak(session, 0.02, False)
        await asyncio.sleep(0.02)
    await out.wait(lambda: done_events(out), timeout=15)
    done = done_events(out)[0]
    assert done.status == "completed" and done.text == STORY, done
    assert len(llm.requests) == 1  # "yeah" got no reply of its own
    await session.audio_in.put(None)
    await task


async def test_a_backchannel_whose_turn_ends_late_is_let_go_at_its_pause() -> None:
    """With an end-of-turn model a "yeah" can wait a second for its turn to end, longer than the bot's
    audio is held for; its transcript at the pause already shows it is a backchannel."""
    llm = FakeLLM([STORY])
    session, out = make_session(llm, ["Tell me a story.", "yeah"])
    session = remade(session, config=replace(
        session.config,
        endpointing=EndpointingConfig(min_speech_ms=64, end_silence_ms=1600, early_final_ms=192, prefix_padding_ms=100),
        session=whole(output_lead_ms=0, output_chunk_ms=20, barge_in_max_hold_ms=900)))
    await yeah_over_the_story(session, out, llm, 90)  # the first turn ends after 1.6 s of silence
    assert any(isinstance(e, SpeechStarted) and e.turn_id == 2 for e in out.events)


class SlowRecognizer(FakeRecognizer):
    """A fake recognizer that takes `seconds` (on the ASR worker) over the transcript of `word`, as a
    busy machine does."""

    def __init__(self, finals: list[str], word: str, seconds: float) -> None:
        super().__init__(finals)
        self.word, self.seconds = word, seconds

    def transcribe(self, audio: Audio, beam_size: int | None = None) -> str:
        text = super().transcribe(audio, beam_size)
        if text == self.word:
            time.sleep(self.seconds)
        return text


async def test_a_backchannel_recognized_late_still_lets_the_reply_go_on() -> None:
    """The time a sound over the bot may last before it interrupts in any case counts speech, not the
    pause in which its words are being recognized: a "yeah" (0.3 s) whose transcript takes 1.2 s, more
    than the 0.6 s hold, lets the reply go on."""
    llm = FakeLLM([STORY])
    finals = ["Tell me a story.", "yeah"]
    session, out = make_session(llm, finals)
    slow = SlowRecognizer(finals, "yeah", 1.2)
    session = remade(session, backends=replace(session.backends, asr=slow), config=replace(
        session.config,
        endpointing=EndpointingConfig(min_speech_ms=64, end_silence_ms=3000, early_final_ms=192, prefix_padding_ms=100),
        session=whole(output_lead_ms=0, output_chunk_ms=20, barge_in_max_hold_ms=600)))
    await yeah_over_the_story(session, out, llm, 160)  # the first turn ends after 3 s of silence


class MisreadingRecognizer(FakeRecognizer):
    """A fake recognizer that reads every interim pass (beam 1) as "Thank you.", as whisper-tiny.en
    read "Okay." cut off at 300 ms; the passes on whole words (at a pause, at the end) are scripted."""

    def transcribe(self, audio: Audio, beam_size: int | None = None) -> str:
        return "Thank you." if beam_size == 1 else super().transcribe(audio, beam_size)


async def test_an_interim_transcript_over_the_bot_does_not_interrupt_it() -> None:
    """A "yeah" over the bot that the interim pass misreads as words still lets the reply go on: the
    transcript of the whole word, at the pause, decides."""
    llm = FakeLLM([STORY])
    session, out = make_session(llm, ["Tell me a story.", "yeah"])
    session = remade(session,
                     backends=replace(session.backends, asr=MisreadingRecognizer(["Tell me a story.", "yeah"])),
                     config=replace(session.config, asr=AsrStageConfig(first_partial_ms=100, interim_beam_size=1)))
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    await speak(session, 0.4, False)
    await out.wait(lambda: sum(len(a) for a in out.audio) >= 2 * 8000 * 0.3)
    await speak(session, 0.3, True)  # "yeah", long enough for an interim pass
    for _ in range(30):
        await speak(session, 0.02, False)
        await asyncio.sleep(0.02)
    await out.wait(lambda: done_events(out), timeout=15)
    done = done_events(out)[0]
    assert done.status == "completed" and done.text == STORY, done
    assert any(isinstance(e, TranscriptPartial) and e.text == "Thank you." for e in out.events)  # it was misread
    assert len(llm.requests) == 1  # "yeah" got no reply of its own
    await session.audio_in.put(None)
    await task


async def test_a_preemptive_replys_error_waits_for_the_end_of_the_turn_like_its_text() -> None:
    llm = FakeLLM(["Sure thing. One two three four five six seven. Eight nine ten eleven twelve thirteen."])
    session, out = preemptive_session(llm, ["Count for me."])
    session = remade(session,
                     backends=Backends(FakeVad(), FakeRecognizer(["Count for me."]), FailingSynthesizer(), llm))
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    for _ in range(40):  # a pause at 192 ms (the reply starts and fails), the end at 600 ms
        await speak(session, 0.02, False)
        await asyncio.sleep(0.02)
    await out.wait(lambda: done_events(out))
    done = done_events(out)[0]
    assert done.status == "failed" and done.preemptive
    stopped = next(i for i, e in enumerate(out.events) if isinstance(e, SpeechStopped))
    errors = [i for i, e in enumerate(out.events) if isinstance(e, ErrorEvent)]
    assert errors and min(errors) > stopped  # nothing about the reply before the turn was over
    await session.audio_in.put(None)
    await task


async def test_a_preemptive_reply_overtaken_by_new_speech_is_dropped_unreported() -> None:
    """The turn ended at a pause and its preemptive reply is ready, but the caller starts a new turn
    before the final transcript confirms it: nobody heard that reply, so no response.done and no
    turn record for it; it is counted as discarded with the reply that answers them."""
    llm = FakeLLM(["A reply nobody will hear, it is long enough to still be going.", "Both parts answered."])
    session, out = make_session(llm, [])
    turns: list[ResponseDone] = []
    session = remade(session, on_turn=turns.append)
    now = session.clock.now
    await session._on_input(SpeechStarted(1, now(), 0.0))
    await session._on_input(TranscriptEarly(1, "Tell me", now()))  # the pause: a preemptive reply starts
    assert session.words_task is not None
    await session.words_task  # (once the words were weighed)
    assert session.reply is not None and session.reply.preemptive
    await asyncio.sleep(0.05)  # it is being written
    await session._on_input(SpeechStopped(1, now(), 900.0, now()))
    await session._on_input(SpeechStarted(2, now(), 1000.0))  # the caller goes on, a new turn
    await asyncio.sleep(0.3)  # past any hold: what the bot would do with a reply it holds
    await session._on_input(TranscriptFinal(1, "Tell me", now()))  # joins the turn the caller went on with
    assert not done_events(out) and not turns, "an unheard preemptive reply was reported"
    await session._on_input(SpeechStopped(2, now(), 2000.0, now()))
    await session._on_input(TranscriptFinal(2, "a joke", now()))
    await out.wait(lambda: done_events(out))
    (done,) = done_events(out)
    assert done.turn_id == 2 and not done.preemptive and done.discarded == 1
    assert done.user_text == "Tell me a joke" and done.text == "Both parts answered."
    assert [r[-1].content for r in llm.requests] == ["Tell me", "Tell me a joke"]
    assert turns == [done]
    await session.close()


class BrokenSynthesizer(FakeSynthesizer):
    def synthesize(self, text: str) -> Iterator[Audio]:
        raise RuntimeError("cannot open /srv/models/voice.onnx")


async def test_a_failed_reply_tells_the_caller_its_code_not_the_exception_text() -> None:
    session, out = make_session(FakeLLM(["Hello there."]), ["Hi."])
    session.backends.tts = BrokenSynthesizer()
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    await speak(session, 0.5, False)
    await out.wait(lambda: done_events(out))
    (error,) = [e for e in out.events if isinstance(e, ErrorEvent)]
    assert error.code == "internal_error" and "/srv/models" not in error.message
    assert "/srv/models" in (done_events(out)[0].error or "")  # the call's record keeps it, for QA
    await session.audio_in.put(None)
    await task


def judged_session(llm: FakeLLM, finals: list[str]) -> tuple[Session, RecordingOutbound]:
    """No end-of-turn model: the words alone decide (weighted in, a 2 s patience without them)."""
    session, out = make_session(llm, finals)
    endpointing = EndpointingConfig(decision="rule", min_speech_ms=64, early_final_ms=192, prefix_padding_ms=100,
                                    text_weight=1.0,
                                    text_neutral=-4.0, sure_probability=0.9, doubt_probability=0.2,
                                    max_patience_ms=2000)
    session = remade(session, config=replace(session.config, endpointing=endpointing))
    return session, out


async def pause_with_words(session: Session, out: RecordingOutbound) -> SpeechStopped:
    """The caller stops: a pause (192 ms of silence), then, once its words were weighed, 3 s more."""
    await speak(session, 0.256, False)

    async def weighed() -> None:  # the pause is heard, its words transcribed and weighed
        while session.words_task is None:
            await asyncio.sleep(0.005)
        await asyncio.shield(session.words_task)

    await asyncio.wait_for(weighed(), 30)
    await speak(session, 3.0, False)
    await out.wait(lambda: any(isinstance(e, SpeechStopped) for e in out.events))
    return next(e for e in out.events if isinstance(e, SpeechStopped))


@pytest.mark.parametrize(("probability", "ends_by"), [(0.99, "words"), (1e-6, "patience")])
async def test_the_words_probability_from_the_llm_ends_the_turn_or_asks_for_patience(
        probability: float, ends_by: str) -> None:
    llm = FakeLLM(["Booked."])
    llm.end_of_turn = lambda words: probability
    session, out = judged_session(llm, ["Book a table for two."])
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    stop = await pause_with_words(session, out)
    assert llm.asked_end_of_turn == ["Book a table for two"]  # without Whisper's final mark
    if ends_by == "words":  # sure words end the turn as soon as they are known: the policy's decision
        assert stop.turn_probability is not None and stop.turn_probability > 0.9
    else:  # words that cannot end a message: the whole patience (2 s), and the silence ends it
        assert stop.turn_probability is None
    await out.wait(lambda: done_events(out))
    assert done_events(out)[0].text == "Booked."
    await session.audio_in.put(None)
    await task


async def test_a_transcript_that_repeats_itself_is_no_evidence_of_the_turn_s_end() -> None:
    """Whisper guessing at a pause ("Could you remind me too?" twice) would get 0.99 from the LLM: the
    session does not ask, and the pause is judged without words (the whole patience)."""
    llm = FakeLLM(["Sure."])
    llm.end_of_turn = lambda words: 0.99
    session, out = judged_session(llm, ["Could you remind me too? Could you remind me too?"])
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    stop = await pause_with_words(session, out)
    assert llm.asked_end_of_turn == []
    assert stop.turn_probability is None
    await session.audio_in.put(None)
    await task


async def test_typed_messages_that_stop_a_reply_follow_its_heard_words_in_the_history() -> None:
    """Two messages a client typed (the Realtime API's items) answered together while a reply is
    going: the reply is stopped first, so the history reads question, what was heard of the reply,
    then each message in its own right."""
    llm = FakeLLM([STORY, "Both answered."], token_delay=0.02)
    session, out = make_session(llm, [])
    task = asyncio.create_task(session.run())
    await session.on_text(["Tell me a story."])
    await out.wait(lambda: sum(len(a) for a in out.audio) >= 2 * 8000, timeout=10)  # a second of it sent
    session.on_played(1, 1000.0)  # and played: its first words were heard
    await session.on_text(["And one thing.", "And another."])
    await out.wait(lambda: len(done_events(out)) >= 2, timeout=10)
    first, second = done_events(out)[:2]
    assert first.status == "interrupted" and second.status == "completed"
    assert first.text and STORY.startswith(first.text) and first.text != STORY
    assert [(m.role, m.content) for m in session.history[1:]] == [
        ("user", "Tell me a story."), ("assistant", first.text), ("user", "And one thing."),
        ("user", "And another."), ("assistant", "Both answered.")]
    await session.audio_in.put(None)
    await task


@pytest.mark.parametrize("echo_found", [True, False])
async def test_the_echo_of_a_reply_that_just_ended_is_not_answered_on_a_line_with_echo(echo_found: bool) -> None:
    """A speakerphone: the bot's last words come back as the reply ends, recognized as a turn of their own. Where
    the canceller found echo on the line they are not answered; on a line without echo the same words are the
    caller's, and answered."""
    llm = FakeLLM(["The capital of France is Paris.", "Seven days.", "Seven."])
    session, out = make_session(llm, ["What is the capital of France?", "The capital of France is Paris.",
                                      "How many days are in a week?"])
    assert session.played is not None
    if echo_found:
        session.played.echo_ms = 200.0  # as cancel_echo marks a line where it found the bot in the caller's audio
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    await speak(session, 0.5, False)
    await out.wait(lambda: len(done_events(out)) == 1)
    await speak(session, 0.5, True)  # the echo of its last words, as it ended
    await speak(session, 0.5, False)
    await speak(session, 0.5, True)
    await speak(session, 0.5, False)
    await out.wait(lambda: len(done_events(out)) == (2 if echo_found else 3))
    asked = [r[-1].content for r in llm.requests]
    if echo_found:
        assert asked == ["What is the capital of France?", "How many days are in a week?"]
    else:
        assert asked[1] == "The capital of France is Paris."
    await session.audio_in.put(None)
    await task
