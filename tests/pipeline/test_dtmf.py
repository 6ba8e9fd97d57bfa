"""Keys pressed on the phone (DTMF) reach the conversation as a turn of their own."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from pipeline.config import SessionConfig
from pipeline.events import SpeechStarted, TranscriptFinal
from pipeline.session import Session, dtmf_text
from pipeline.session.keypad import Keypad
from tests.pipeline.fakes import FakeLLM, ManualClock, RecordingOutbound
from tests.pipeline.test_session import STORY, done_events, make_session, remade, speak


def keypad_session(llm: FakeLLM, finals: list[str], **settings: int) -> tuple[Session, RecordingOutbound]:
    session, out = make_session(llm, finals)
    session = remade(session, config=replace(session.config, session=SessionConfig(
        output_lead_ms=0, output_chunk_ms=20, dtmf_timeout_ms=300, take_back_ms=0, **settings)))
    return session, out


async def test_keys_are_collected_until_none_comes_for_the_timeout() -> None:
    """On a clock the test moves: keys 0.2 s apart against a 0.3 s timeout are one turn, answered
    exactly when 0.3 s pass after the last key, with that key's time as the caller's end."""
    clock = ManualClock()
    got: list[tuple[list[str], float]] = []

    async def on_keys(digits: list[str], last_at: float) -> None:
        got.append((digits, last_at))

    keypad = Keypad(SessionConfig(dtmf_timeout_ms=300), clock, on_keys)
    assert keypad.press("4")
    await clock.advance(0.2)
    assert keypad.press("2")
    await clock.advance(0.2)  # 0.4 s after the first key: it is the gap since the last one that counts
    last = clock.now()
    assert keypad.press("#")
    await clock.advance(0.299)
    assert not got and keypad.collecting
    await clock.advance(0.001)
    assert got == [(["4", "2", "#"], last)] and not keypad.collecting
    assert clock.sleeping() == 0


async def test_keys_become_the_callers_turn() -> None:
    llm = FakeLLM(["You entered four two."])
    session, out = keypad_session(llm, [])
    task = asyncio.create_task(session.run())
    for key in "42#":
        await session.on_dtmf(key)
    await out.wait(lambda: done_events(out))
    done = done_events(out)[0]
    asked = llm.requests[0][-1]
    assert asked.role == "user" and asked.content == "The caller pressed 4 2 # on the phone keypad."
    final = next(e for e in out.events if isinstance(e, TranscriptFinal))
    assert final.turn_id == done.turn_id and final.text == asked.content
    # the turn ends when the keys are judged complete; the caller's true end was the last key
    assert done.latency_ms["speech_end"] == 0 and done.latency_ms["asr_final"] == 0
    assert done.voice_to_voice_ms is not None and done.voice_to_voice_ms >= 300
    assert [m.content for m in session.history[1:]] == [asked.content, "You entered four two."]
    await session.audio_in.put(None)
    await task


async def test_speech_turns_and_keypad_turns_are_numbered_from_one_counter() -> None:
    llm = FakeLLM(["Hello.", "Got it.", "Bye."])
    session, out = keypad_session(llm, ["Hi.", "Goodbye."])
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    await speak(session, 0.5, False)
    await out.wait(lambda: len(done_events(out)) == 1)
    await session.on_dtmf("7")
    await out.wait(lambda: len(done_events(out)) == 2)
    await speak(session, 0.5, True)
    await speak(session, 0.5, False)
    await out.wait(lambda: len(done_events(out)) == 3)
    assert [d.turn_id for d in done_events(out)] == [1, 2, 3]
    assert [e.turn_id for e in out.events if isinstance(e, SpeechStarted)] == [1, 3]
    assert [r[-1].content for r in llm.requests] == ["Hi.", dtmf_text(["7"]), "Goodbye."]
    await session.audio_in.put(None)
    await task


async def test_a_key_while_the_bot_talks_interrupts_it() -> None:
    llm = FakeLLM([STORY, "Transferring you now."])
    session, out = keypad_session(llm, ["Tell me a story."])
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    await speak(session, 0.5, False)
    await out.wait(lambda: sum(len(a) for a in out.audio) >= 2 * 8000 * 0.5)
    await session.on_dtmf("0")
    first = done_events(out)[0]  # the key stopped the reply before on_dtmf returned
    assert first.status == "interrupted"
    sent = len(out.audio)
    assert STORY.startswith(first.text) and len(first.text.split()) < len(STORY.split())
    await out.wait(lambda: len(done_events(out)) == 2)
    second = done_events(out)[1]
    assert second.status == "completed" and second.turn_id > first.turn_id
    assert all(turn == second.turn_id for turn in out.audio_turns[sent:])  # no more audio of the story
    assert llm.requests[1][-2].content == first.text  # the history keeps what was sent of the story
    assert llm.requests[1][-1].content == dtmf_text(["0"])
    await session.audio_in.put(None)
    await task


async def test_keys_beyond_the_limit_are_dropped() -> None:
    llm = FakeLLM(["Too many digits."])
    session, out = keypad_session(llm, [], max_dtmf_digits=3)
    task = asyncio.create_task(session.run())
    for digit in "123456":
        await session.on_dtmf(digit)
    await out.wait(lambda: done_events(out))
    assert llm.requests[0][-1].content == dtmf_text(["1", "2", "3"])
    await session.audio_in.put(None)
    await task


def test_dtmf_text_reads_as_a_sentence() -> None:
    assert dtmf_text(["4", "2", "#"]) == "The caller pressed 4 2 # on the phone keypad."


class HeldOutbound(RecordingOutbound):
    """Holds the keypad turn's transcript event until told to let it go (the transport is slow)."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

        self.sender: asyncio.Task[object] | None = None  # the task that sends the held event

    async def send_event(self, event: object) -> None:
        if isinstance(event, TranscriptFinal):
            self.sender = asyncio.current_task()
            self.holding.set()
            await self.release.wait()
        await super().send_event(event)  # type: ignore[arg-type]


async def test_a_caller_who_hangs_up_while_a_keypad_turn_starts_gets_no_reply() -> None:
    llm = FakeLLM(["You pressed five."])
    session, _ = keypad_session(llm, [])
    out = HeldOutbound()
    session = remade(session, outbound=out)
    task = asyncio.create_task(session.run())
    await session.on_dtmf("5")
    await asyncio.wait_for(out.holding.wait(), 5)  # the keys were judged complete; their turn is starting
    await session.audio_in.put(None)  # the caller hangs up
    await asyncio.wait_for(task, 5)
    out.release.set()
    assert out.sender is not None
    await asyncio.wait_for(out.sender, 5)  # the keypad turn has done all it will do
    await session.on_dtmf("6")  # a key that arrives after the hang-up
    assert not llm.requests and session.reply is None and not session.keypad.collecting
