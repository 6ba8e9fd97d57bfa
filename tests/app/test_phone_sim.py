"""The phone simulator (tests/phone_sim.py) against the app served by uvicorn on a real socket, with
fake engines (tests/pipeline/fakes.py): the signed call, real-time playback, marks echoed only once
their audio played, `clear` dropping what was not played. The real models' version of these is
tests/e2e/test_phone.py."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import numpy as np
import pytest
from websockets.exceptions import InvalidStatus

from app.main import create_app
from app.settings import PhoneConfig, ServerConfig, Settings, TwilioConfig
from pipeline.config import AsrStageConfig, EndpointingConfig, SessionConfig
from pipeline.session import Backends
from tests.app.live import serving
from tests.phone_sim import PhoneSim, call_records, dial
from tests.pipeline.fakes import FakeLLM, FakeRecognizer, FakeSynthesizer, FakeVad
from tests.pipeline.test_session import STORY

TOKEN = "sim-token"
PUBLIC = "https://voice.example.test"
LOUD = np.full(8000 * 3 // 5, 12000, dtype=np.int16)  # 0.6 s the fake VAD takes for speech


@contextlib.asynccontextmanager
async def served(llm: FakeLLM, finals: list[str], **more: object) -> AsyncIterator[str]:
    settings = Settings(  # type: ignore[arg-type]
        twilio=TwilioConfig(auth_token=TOKEN, public_url=PUBLIC),
        endpointing=EndpointingConfig(min_speech_ms=64, end_silence_ms=256, prefix_padding_ms=100),
        asr_stage=AsrStageConfig(partials=False),
        session=SessionConfig(output_chunk_ms=20, dtmf_timeout_ms=300),
        phone=PhoneConfig(mark_interval_ms=200),
        **more,
    )
    app = create_app(settings, backends=Backends(FakeVad(), FakeRecognizer(finals), FakeSynthesizer(), llm))
    async with serving(app) as host:
        yield host


async def test_a_signed_call_plays_the_reply_in_real_time_and_echoes_its_marks(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="app.transports.phone.wire")
    # the call's record is read from the log: with the content in it (server.log_caller_content "info")
    async with served(FakeLLM(["One two three four five six seven eight."]), ["Count to eight."],
                      server=ServerConfig(log_caller_content="info")) as host:
        for refused_call in (PhoneSim(f"ws://{host}/twilio/media"),  # unsigned: HTTP 403, no socket
                             PhoneSim(f"ws://{host}/telnyx/media", provider="telnyx", stream_token="guess")):
            with pytest.raises(InvalidStatus) as refused:
                await refused_call.connect()
            assert refused.value.response.status_code == 403 and not refused.value.response.body
        sim = await dial(f"http://{host}", f"ws://{host}", PUBLIC, TOKEN)
        spoke_until = await sim.say(LOUD)
        await sim.wait_until(lambda: sim.marks and sim.marks[-1].name == "t1:800", 10)
        await sim.wait_until(sim.heard_everything, 5)
        await sim.hangup()
    first = sim.first_media_after(spoke_until)
    assert first is not None and first > spoke_until
    assert len(sim.played_audio()) == len(sim.received_audio()) == 8 * 800  # 0.8 s of reply, all played
    assert [m.name for m in sim.marks] == ["t1:200", "t1:400", "t1:600", "t1:800"] and all(m.played for m in sim.marks)
    # played in real time, and each mark came back once its audio had played (however late it came),
    # not when it arrived: t1:200 no sooner than 0.2 s into playback (less one 20 ms frame), ...
    assert len(sim.playback_starts) == 1
    for i, mark in enumerate(sim.marks):
        assert mark.at - sim.playback_starts[0] >= 0.2 * (i + 1) - 0.02, (mark, sim.playback_starts)
    # the call's record, as the server logs it
    assert call_records(caplog.text, sim.call_sid, "caller") == [{"turn_id": 1, "text": "Count to eight."}]
    [done] = call_records(caplog.text, sim.call_sid)
    assert done["status"] == "completed" and done["text"] == "One two three four five six seven eight."
    assert done["latency_ms"]["first_audio_sent"] >= 0 and done["voice_to_voice_ms"] > 0


async def test_a_barge_in_clears_the_line_and_the_unplayed_marks_come_back_unplayed() -> None:
    llm = FakeLLM([STORY, "Okay."])
    async with served(llm, ["Tell me a story.", "Stop."]) as host:
        sim = await dial(f"http://{host}", f"ws://{host}", PUBLIC, TOKEN)
        await sim.say(LOUD)
        await sim.wait_until(lambda: len(sim.played_audio()) >= 8000, 10)  # a second of the story heard
        await sim.say(LOUD)  # "Stop."
        await sim.wait_until(lambda: bool(sim.clears), 5)
        await sim.wait_until(lambda: len(llm.requests) == 2, 5)
        await sim.hangup()
    cleared = sim.clears[0]
    played_ms = len(sim.played_audio(until=cleared)) / 8
    unplayed = [m for m in sim.marks if not m.played]
    assert all(m.at >= cleared for m in unplayed)
    assert all(int(m.name.split(":")[1]) > played_ms - 20 for m in unplayed)
    # the story kept in the history is what was played before the clear: 0.1 s a word, to within a word
    kept = llm.requests[1][2].content
    assert STORY.startswith(kept)
    assert abs(len(kept.split()) - played_ms / 100) <= 1.5, (kept, played_ms)


async def test_end_call_ends_the_phone_call_after_the_goodbyes_mark() -> None:
    """The model calls the built-in end_call (tools.end_call): its goodbye is spoken, and the server
    closes the media stream (which ends Twilio's <Connect>) once the goodbye's last mark came back
    played, not before."""
    from app.settings import ToolsConfig
    from models.llm.tool_calls import ToolCall

    llm = FakeLLM([[ToolCall("call_end", "end_call", "{}")], "Goodbye, and thank you for calling."])
    settings = dict(tools=ToolsConfig(end_call=True, goodbye_grace_ms=10000))
    async with served(llm, ["That is all. Bye!"], **settings) as host:
        sim = await dial(f"http://{host}", f"ws://{host}", PUBLIC, TOKEN)
        await sim.say(LOUD)
        await sim.wait_until(lambda: sim.closed, 20)
    assert llm.tools_seen[0] is not None and "end_call" in [t.name for t in llm.tools_seen[0].tools]
    assert sim.close_code == 1000
    assert sim.marks and sim.marks[-1].played  # the goodbye's end was played...
    assert sim.closed_at is not None and sim.closed_at >= sim.marks[-1].at  # ...before the line closed
    assert len(sim.played_audio()) == 8 * 100 * 6  # the goodbye, whole: 0.1 s a word from the fake voice


async def test_by_default_the_log_of_a_phone_call_holds_no_callers_words_keys_or_number(
        caplog: pytest.LogCaptureFixture) -> None:
    """server.log_caller_content "redacted" (the default): every line about the call, at every level,
    says what happened and how much; the words, the keys, the replies and the phone numbers stay out."""
    caplog.set_level(logging.DEBUG)
    llm = FakeLLM(["Rosalind, your table is booked.", "Thank you, PIN accepted."])
    async with served(llm, ["My PIN is 4719, book a table for Rosalind."]) as host:
        sim = await dial(f"http://{host}", f"ws://{host}", PUBLIC, TOKEN, caller="+15550001111",
                         callee="+15550002222")
        await sim.say(LOUD)
        await sim.wait_until(lambda: len(call_records(caplog.text, sim.call_sid)) == 1, 10)
        for key in "836":
            await sim.dtmf(key)
        await sim.wait_until(lambda: len(call_records(caplog.text, sim.call_sid)) == 2, 10)
        await sim.hangup()
    assert llm.requests[0][-1].content == "My PIN is 4719, book a table for Rosalind."  # heard, and only logged so
    assert llm.requests[1][-1].content == "The caller pressed 8 3 6 on the phone keypad."
    log = caplog.text
    for private in ("4719", "Rosalind", "table", "booked", "PIN", "8 3 6", "5550001111", "5550002222"):
        assert private not in log, private
    assert "caller: [9 words]" in log and "key pressed: [1 key]" in log and "keys [3 keys]" in log
    assert [done["text"] for done in call_records(log, sim.call_sid)] == ["[5 words]", "[4 words]"]
    assert "'From': '+1********11'" in log
