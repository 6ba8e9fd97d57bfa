"""The session's parts on their own, on explicit times: a reply's playback reports, the history by
turn, the barge-in's judgement of a sound."""

from __future__ import annotations

import asyncio
from typing import cast

import numpy as np
import pytest

from models.protocols import ChatMessage, Conversation, SamplingParams
from pipeline.config import AsrStageConfig, ChunkerConfig, EndpointingConfig, SessionConfig
from pipeline.events import ReplyAudio
from pipeline.session import PipelineConfig, Reply
from pipeline.session.barge_in import BargeIn
from pipeline.session.history import History
from pipeline.session.playout import Player
from pipeline.turns import Turn
from tests.pipeline.fakes import FakeLLM, ManualClock, RecordingOutbound

RATE = 8000
WORDS = "one two three four five six seven eight nine ten"


def sent_reply(seconds: float = 1.0, offset: int = 0) -> Reply:
    """A reply of ten words at 0.1 s a word, `seconds` of it sent."""
    reply = Reply(Turn(1), offset_samples=offset)
    reply.ledger.add_phrase(0, WORDS)
    reply.ledger.add_audio(0, RATE)
    reply.ledger.add_sent(0, int(RATE * seconds))
    return reply


def test_a_report_is_carried_forward_at_playback_speed_up_to_what_was_sent() -> None:
    reply = sent_reply(0.8)
    reply.report_played(int(0.3 * RATE), stopped=False, now=100.0)
    assert reply.heard_samples(100.0, RATE) == int(0.3 * RATE)
    assert reply.heard_samples(100.2, RATE) == int(0.5 * RATE)
    assert reply.heard_samples(105.0, RATE) == int(0.8 * RATE)  # never past what was sent
    assert reply.heard_text("interrupted", 100.2, RATE) == "one two three four five"


async def test_a_report_is_not_carried_across_a_gap_in_playback() -> None:
    """A phone's last mark came as the first phrase ended; the next phrase came 3 s later (the LLM
    stalled: playback ran dry) and went out up to the lead ahead of playback; a key cut it 0.1 s in.
    The caller heard 0.1 s of it, not all that was sent: the gap's time is not playback."""
    clock = ManualClock()
    player = Player(SessionConfig(output_lead_ms=300, output_chunk_ms=40), clock, RATE, RecordingOutbound(),
                    cast(Conversation, FakeLLM([]).conversation()), asyncio.Event())
    player.audio_open.set()
    reply = Reply(Turn(1))
    reply.confirmed.set()
    playing = asyncio.create_task(player.play(reply, lambda: True))
    for index, text in enumerate(("one two three four five", "six seven eight nine ten")):
        reply.ledger.add_phrase(index, text)
        reply.ledger.add_audio(index, RATE // 2)
    await reply.playout.put(ReplyAudio(1, 0, np.zeros(RATE // 2, dtype=np.float32), clock.now()))
    await clock.advance(0.5)  # the first phrase plays out
    reply.report_played(RATE // 2, stopped=False, now=clock.now())  # the mark at its end
    await clock.advance(3.0)  # the LLM stalls: playback runs dry
    await reply.playout.put(ReplyAudio(1, 1, np.zeros(RATE // 2, dtype=np.float32), clock.now()))
    await clock.advance(0.1)
    sent = reply.ledger.sent_samples()
    assert sent >= int(0.9 * RATE)  # 0.1 s of the second phrase played, 0.3 s more sent ahead
    assert abs(reply.heard_samples(clock.now(), RATE) - int(0.6 * RATE)) <= 1
    assert reply.heard_text("interrupted", clock.now(), RATE) == "one two three four five six"
    await reply.playout.put(None)
    await clock.advance(0.4)
    assert await playing
    await clock.advance(5.0)  # long after: all that was sent, no more
    assert reply.heard_samples(clock.now(), RATE) == reply.ledger.sent_samples() == RATE


def test_a_stopped_report_is_exact_however_late_it_is_read() -> None:
    reply = sent_reply(0.8)
    reply.report_played(int(0.3 * RATE), stopped=True, now=100.0)
    assert reply.heard_samples(160.0, RATE) == int(0.3 * RATE)
    assert reply.heard_text("interrupted", 160.0, RATE) == "one two three"


def test_a_report_counts_the_turns_audio_and_an_earlier_reply_to_it_is_taken_off() -> None:
    reply = sent_reply(0.8, offset=RATE)  # a filler of 1 s went out before it in the same turn
    reply.report_played(int(1.2 * RATE), stopped=True, now=0.0)
    assert reply.played_samples == int(0.2 * RATE)
    reply.report_played(int(0.5 * RATE), stopped=True, now=0.0)  # still in the filler: none of this one
    assert reply.played_samples == 0


def test_without_reports_a_cut_reply_keeps_what_was_sent_and_a_completed_one_every_word() -> None:
    reply = sent_reply(0.4)
    assert reply.heard_text("interrupted", 0.0, RATE) == "one two three four"
    assert reply.heard_text("completed", 0.0, RATE) == WORDS


def test_the_history_files_messages_by_turn_and_takes_a_turn_back_whole() -> None:
    history = History("Be kind.", SessionConfig())
    asked, answer = ChatMessage("user", "Book a table."), ChatMessage("assistant", "For how many?")
    history.keep(1, asked)
    history.keep(1, answer)
    history.keep(2, ChatMessage("user", "Two."))
    assert history.take_back(1) == ["Book a table."]
    assert [m.content for m in history.messages] == ["Be kind.", "Two."]
    assert not history.forget(1, "assistant")  # gone with its turn


def test_a_finished_reply_is_cut_to_the_words_played() -> None:
    history = History("Be kind.", SessionConfig())
    reply = sent_reply(1.0)
    message = ChatMessage("assistant", WORDS)
    history.keep(1, message)
    history.keep_finished(1, reply, message)
    assert history.cut(1, int(0.3 * RATE)) == "one two three"
    assert history.messages[-1].content == "one two three"
    assert history.cut(1, 0) == "" and len(history.messages) == 1  # nothing heard: nothing kept
    assert history.cut(1, RATE) is None  # no longer among the finished


async def test_a_sound_over_the_bot_holds_its_audio_until_judged_and_sustained_speech_interrupts() -> None:
    clock = ManualClock()
    interrupted: list[float] = []

    async def on_sustained() -> None:
        interrupted.append(clock.now())

    config = PipelineConfig(EndpointingConfig(min_speech_ms=100), AsrStageConfig(), ChunkerConfig(),
                            SessionConfig(barge_in_max_hold_ms=600), SamplingParams())
    barge = BargeIn(config, clock, on_sustained)
    start = clock.now()
    barge.hold(3)
    assert not barge.audio_open.is_set() and barge.pending == 3 and barge.began == start
    await clock.advance(0.499)
    assert not interrupted
    await clock.advance(0.001)  # 600 ms held, of which the VAD's 100 ms came before the hold
    assert len(interrupted) == 1 and interrupted[0] - start == pytest.approx(0.5)
    barge.release()
    assert barge.audio_open.is_set() and barge.pending is None
    assert barge.is_backchannel("Mm-hmm.") and barge.is_backchannel("yeah okay") and not barge.is_backchannel("Stop.")


def test_words_over_the_bot_that_are_its_own_are_its_echo() -> None:
    reply = "The capital of France is Paris. It is known for the Eiffel Tower."
    on = PipelineConfig(EndpointingConfig(), AsrStageConfig(), ChunkerConfig(), SessionConfig(), SamplingParams())
    barge = BargeIn(on, ManualClock(), lambda: asyncio.sleep(0))
    assert barge.is_own_echo("The capital of France.", reply) and barge.lets_go("the capital of four", reply)
    assert barge.is_own_echo("Eiffel-Tower", reply)  # hyphens as spaces
    assert not barge.is_own_echo("Wait, stop please.", reply) and not barge.lets_go("Wait, stop please.", reply)
    assert not barge.is_own_echo("What about Paris hotels then?", reply)  # one word in five is the bot's
    story = ("Octopuses can change colour. Scientists ask why, and something about it is still unknown: else "
             "they would know. I can tell you more about it if you ask.")
    assert not barge.is_own_echo("Sorry, wait, can I ask about something else?", story)  # its words, scattered
    assert barge.is_own_echo("I can tell you more.", story) and barge.is_own_echo("tell you about it", story)
    assert barge.is_own_echo("the cap.", "The capital of")  # cut off mid-word by the hold
    assert barge.is_own_echo("There are seven", "There are 7 days in a week.")  # a number, written or said
    assert not barge.is_own_echo("", reply) and not barge.is_own_echo("The capital.", "")
    off = PipelineConfig(EndpointingConfig(), AsrStageConfig(), ChunkerConfig(),
                         SessionConfig.model_validate({"echo": {"own_words": False}}), SamplingParams())
    assert not BargeIn(off, ManualClock(), lambda: asyncio.sleep(0)).is_own_echo("The capital of France.", reply)
