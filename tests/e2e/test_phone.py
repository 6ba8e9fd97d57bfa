"""Phone calls end to end: the phone simulator (tests/phone_sim.py) calls a real server (real models)
the way Twilio and Telnyx do, with signed requests, 8 kHz mu-law in real time, and a playback clock
that echoes marks once their audio has played and drops its buffer at a `clear`.

The server has no text channel to a phone, so what each turn kept (the history) is read where the
service records it: the `response.done` line it logs for every turn of a phone call (with the words in
it: server.log_caller_content "info"; by default the log keeps none, tests/e2e/test_private_logs.py)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import InvalidStatus

from pipeline.audio import resample
from pipeline.config import DEFAULT_SYSTEM_PROMPT
from pipeline.turns import MARKS
from tests.e2e.conftest import Server, start_server, stop_server
from tests.phone_sim import PhoneSim, call_records, dial, twilio_signature, twilio_webhook
from tests.speech import speech_samples, words

pytestmark = pytest.mark.slow

PUBLIC = "https://voice.example.test"  # what Twilio would call; the simulator reaches it as a proxy would
TOKEN = "e2e-twilio-auth-token"
TELNYX_TOKEN = "e2e-telnyx-stream-token"
PROMPT = DEFAULT_SYSTEM_PROMPT + " When the caller asks for a story, tell a long story of at least ten sentences."


@pytest.fixture(scope="module")
def phone_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server, proc = start_server(tmp_path_factory.mktemp("phone"), env={
        "VOICE_AGENT_TWILIO__AUTH_TOKEN": TOKEN, "VOICE_AGENT_TWILIO__PUBLIC_URL": PUBLIC,
        "VOICE_AGENT_TELNYX__STREAM_TOKEN": TELNYX_TOKEN, "VOICE_AGENT_SESSION__SYSTEM_PROMPT": PROMPT,
        "VOICE_AGENT_SERVER__LOG_CALLER_CONTENT": "info"})  # the turns are read from the log, words and all
    yield server
    stop_server(proc)


def ws_base(server: Server) -> str:
    return server.base_url.replace("http://", "ws://")


@pytest.fixture
async def call(phone_server: Server) -> AsyncIterator[PhoneSim]:
    sim = await dial(phone_server.base_url, ws_base(phone_server), PUBLIC, TOKEN)
    yield sim
    await sim.hangup()


# The question these tests ask only to see a call answered (what is said over the line is checked by the two-turn
# test): 8 kHz Whisper tiny.en hears hibari's reading differently call to call ("What is the capital and friends?",
# "How many day are you in a week?"), and the reply to a misheard question may hold no fact at all, so they ask
# for a completed reply with words, not for a right one
QUESTION = "How many days are there in a week?"


async def turn_done(server: Server, call_id: str, count: int, timeout: float = 90) -> dict[str, Any]:
    """The call's `count`-th response.done, once logged."""
    deadline = time.monotonic() + timeout
    while len(done := call_records(server.log(), call_id)) < count:
        assert time.monotonic() < deadline, f"no response.done #{count} for {call_id}:\n{server.log()[-3000:]}"
        await asyncio.sleep(0.1)
    return done[count - 1]


async def test_a_phone_call_holds_a_two_turn_conversation(phone_server: Server, call: PhoneSim,
                                                          tmp_path: Path) -> None:
    await asyncio.sleep(0.4)  # the line is open: silence
    replies = []
    # "Can you tell me what my name is?", not "What is my name?": CI's machine heard the short one as "work in my
    # name" (which the honesty gate rightly judged a request it cannot carry out, 0.88); a word misheard in the
    # longer one still leaves a request about the caller's name ("Can you tell me what my name": 0.03)
    for n, question in enumerate(("My name is Alice.", "Can you tell me what my name is?"), 1):
        spoke_until = await call.say(speech_samples(question, tmp_path, 8000))
        done = await turn_done(phone_server, call.call_sid, n)
        await call.wait_until(call.heard_everything, 30)
        first_audio = call.first_media_after(spoke_until)
        assert done["status"] == "completed" and first_audio is not None
        assert 0 < first_audio - spoke_until < 60  # a bound, not a speed: 26 s was seen with benchmarks on the cores
        replies.append(done)
    heard = call_records(phone_server.log(), call.call_sid, "caller")
    assert "alice" in words(heard[0]["text"]), heard
    assert "alice" in words(replies[1]["text"]), (heard, replies)  # what was heard, and the honesty gate's chance
    # every mark the server sent came back after its audio played; the last says the whole reply was heard
    assert call.marks and all(m.played for m in call.marks)
    assert len(call.played_audio()) == len(call.received_audio())  # all of it played
    assert list(replies[1]["latency_ms"]) == list(MARKS)  # the same latency marks as the native socket's


@pytest.fixture(scope="module")
def word_timer() -> Any:
    """Whisper with word timestamps: where each word of the reply audio ends."""
    from faster_whisper import WhisperModel

    from models.config import AsrConfig
    from models.packs.cache import resolve

    return WhisperModel(resolve(AsrConfig().model), device="cpu", compute_type="int8", cpu_threads=2)


async def test_after_a_barge_in_the_history_keeps_what_the_caller_heard(
        phone_server: Server, call: PhoneSim, tmp_path: Path, word_timer: Any) -> None:
    await asyncio.sleep(0.4)
    await call.say(speech_samples("Tell me a story about a brave little dragon.", tmp_path, 8000))
    await call.wait_until(lambda: len(call.played_audio()) >= 8000 * 1.5, 90)  # 1.5 s of the story heard
    assert not call_records(phone_server.log(), call.call_sid), "the story ended before the caller could interrupt"
    # No pause inside the interruption: at the comma of "Wait, stop please." Smart Turn gives "Wait,"
    # 0.83-0.96 (on the 0.95 threshold, by the frames it is given), so that turn ended at "Wait" in
    # some runs, and "stop please" then interrupted the reply to it: turn 2 was "interrupted".
    await call.say(speech_samples("Stop please.", tmp_path, 8000))
    await call.wait_until(lambda: bool(call.clears), 15)
    first = await turn_done(phone_server, call.call_sid, 1, 15)
    assert first["status"] == "interrupted"
    cleared = call.clears[0]
    played = call.played_audio(until=cleared)
    story = call.received_audio(until=cleared)  # what was sent of the story, heard or not

    # where each word of the story's audio ends: the words heard are those played before the clear
    audio = resample(story.astype(np.float32) / 32768, 8000, 16000)
    segments, _ = word_timer.transcribe(audio, language="en", word_timestamps=True, condition_on_previous_text=False)
    timed = [(w.word, (w.start + w.end) / 2) for s in segments for w in s.words]
    played_s = len(played) / 8000
    heard = [w for w, middle in timed if middle < played_s]
    kept = words(first["text"])
    heard_words = words(" ".join(heard))
    # the server counts the cut phrase's heard words in proportion to its letters (pipeline/turns.py
    # text_until, "to within a word": a comma's pause is not counted), and the timer drops a word half
    # played at the cut: each may be a word off, in opposite directions (9 kept against 7 timed, once, on a
    # loaded machine). A history of the whole reply is far past this; the check below looks at where the
    # two end
    assert abs(len(kept) - len(heard_words)) <= 2, (kept, heard, played_s)
    # ends where the caller stopped hearing: the two agree up to a few words (16 letters and spaces) from
    # both ends, compared letter by letter: on 8 kHz audio the timer mishears rare words ("Zephyr was born"
    # -> "suffer with bull", "named Zephyr" -> "Name, suffer"), which share no whole word with what was said
    # but some letters, or none for a word or two. A history of the whole reply ends far past that.
    said, timed_text = " ".join(kept), " ".join(heard_words)
    agree = [b for b in SequenceMatcher(a=said, b=timed_text, autojunk=False).get_matching_blocks() if b.size >= 3]
    assert agree, (kept, heard)
    last = agree[-1]
    assert len(said) - (last.a + last.size) <= 16 and len(timed_text) - (last.b + last.size) <= 16, (kept, heard)

    second = await turn_done(phone_server, call.call_sid, 2)
    assert second["status"] == "completed"


async def test_keys_reach_the_conversation_and_interrupt_the_bot(phone_server: Server, call: PhoneSim) -> None:
    await asyncio.sleep(0.4)
    for digit in "42#":
        await call.dtmf(digit)
        await asyncio.sleep(0.2)
    first = await turn_done(phone_server, call.call_sid, 1)
    callers = call_records(phone_server.log(), call.call_sid, "caller")
    assert callers[0]["text"] == "The caller pressed 4 2 # on the phone keypad.", callers
    assert first["status"] == "completed" and first["turn_id"] == callers[0]["turn_id"]
    assert first["voice_to_voice_ms"] >= 1500  # from the last key, through the inter-digit timeout
    await call.wait_until(call.heard_everything, 30)

    # a key while the bot talks interrupts it, and is then answered
    mark = len(call.received)
    await call.dtmf("9")
    await call.dtmf("9")
    await call.wait_for(lambda r: r.event["event"] == "media", 60, after=mark)
    await call.dtmf("1")
    await call.wait_until(lambda: bool(call.clears), 10)
    dones = [await turn_done(phone_server, call.call_sid, n) for n in (2, 3)]
    assert [d["status"] for d in dones] == ["interrupted", "completed"]
    assert [c["text"] for c in call_records(phone_server.log(), call.call_sid, "caller")[1:]] == [
        "The caller pressed 9 9 on the phone keypad.", "The caller pressed 1 on the phone keypad."]


async def test_a_missing_or_wrong_signature_gets_403(phone_server: Server) -> None:
    params = {"CallSid": "CA1", "From": "+15550001111", "To": "+15550002222"}
    for signature in (None, "bm90IHRoaXM=", twilio_signature("another-token", PUBLIC + "/twilio/voice", params)):
        response = await twilio_webhook(phone_server.base_url, PUBLIC, None, params, signature=signature)
        assert response.status_code == 403 and response.content == b""
    wss = PUBLIC.replace("https://", "wss://") + "/twilio/media"
    for sim in (PhoneSim(ws_base(phone_server) + "/twilio/media"),
                PhoneSim(ws_base(phone_server) + "/twilio/media", auth_token="another-token", signed_url=wss),
                PhoneSim(ws_base(phone_server) + "/twilio/media", auth_token=TOKEN),  # over the wrong (local) URL
                PhoneSim(ws_base(phone_server) + "/telnyx/media", provider="telnyx"),
                PhoneSim(ws_base(phone_server) + "/telnyx/media", provider="telnyx", stream_token="guess"),
                # the secret itself is not a token: a URL seen once would open the socket forever
                PhoneSim(ws_base(phone_server) + "/telnyx/media", provider="telnyx", stream_token=TELNYX_TOKEN)):
        with pytest.raises(InvalidStatus) as refused:
            await sim.connect()
        assert refused.value.response.status_code == 403


async def test_a_replayed_stream_is_refused_while_fresh_calls_are_answered(phone_server: Server, call: PhoneSim,
                                                                         tmp_path: Path) -> None:
    """A capture of a call's stream (its signed upgrade and its `start`, nonce and all), replayed
    after the call, opens a socket (the signature covers only the fixed URL) but starts no call."""
    await asyncio.sleep(0.4)
    await call.say(speech_samples(QUESTION, tmp_path, 8000))
    done = await turn_done(phone_server, call.call_sid, 1)
    assert done["status"] == "completed" and words(done["text"]), done
    replay = PhoneSim(call.url, auth_token=TOKEN, signed_url=call.signed_url, parameters=dict(call.parameters),
                      call_sid=call.call_sid, stream_sid=call.stream_sid)
    await replay.connect()
    await replay.wait_until(lambda: replay.closed, 10)
    assert replay.close_code == 1008
    assert "the stream did not come from this server's TwiML" in phone_server.log()
    fresh = await dial(phone_server.base_url, ws_base(phone_server), PUBLIC, TOKEN)  # a new call: answered
    await asyncio.sleep(0.4)
    await fresh.say(speech_samples(QUESTION, tmp_path, 8000))
    again = await turn_done(phone_server, fresh.call_sid, 1)
    assert again["status"] == "completed" and words(again["text"]), again
    await fresh.hangup()


async def test_malformed_frames_are_survived_and_the_call_goes_on(phone_server: Server, tmp_path: Path) -> None:
    sim = await dial(phone_server.base_url, ws_base(phone_server), PUBLIC, TOKEN, start=False)
    await sim.send({"event": "media", "streamSid": "MZ", "media": {"payload": "/////w=="}})  # before start
    await sim.begin()
    await sim.send(b"\x00\x01" * 80)  # binary
    await sim.send("{this is not json")
    await sim.send({"event": "media", "streamSid": sim.stream_sid, "media": {"payload": "not base64!"}})
    await sim.send({"event": "dance", "streamSid": sim.stream_sid})
    await sim.send(json.dumps({"event": "media", "pad": "x" * 70_000}))  # over phone.max_frame_bytes
    assert httpx.get(phone_server.base_url + "/healthz", timeout=5).status_code == 200
    spoke_until = await sim.say(speech_samples("How many days are there in a week?", tmp_path, 8000))
    done = await turn_done(phone_server, sim.call_sid, 1)
    assert done["status"] == "completed" and sim.first_media_after(spoke_until) is not None
    assert "seven" in words(done["text"]) or "7" in done["text"], done
    log = phone_server.log()
    for code in ("media_before_start", "binary_frame", "invalid_json", "invalid_audio_payload", "unknown_event",
                 "frame_too_large"):
        assert f"bad frame ({code})" in log, code
    await sim.drop()  # the connection breaks without a stop: the call ends all the same

    flood = await dial(phone_server.base_url, ws_base(phone_server), PUBLIC, TOKEN)
    for _ in range(60):
        await flood.send("nope")
    await flood.wait_until(lambda: flood.closed, 10)
    assert flood.close_code == 1008
    await flood.drop()


def transport_counts(server: Server) -> tuple[float, float]:
    """(Telnyx calls started, Telnyx calls active), from /metrics."""
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(
        httpx.get(server.base_url + "/metrics", timeout=10).text) for s in f.samples}
    label = (("transport", "telnyx"),)
    return (samples.get(("voice_agent_sessions_total", label), 0.0),
            samples.get(("voice_agent_active_sessions", label), 0.0))


async def test_a_telnyx_call_is_answered_and_calls_are_counted_by_transport(phone_server: Server,
                                                                            tmp_path: Path) -> None:
    started_before, _ = transport_counts(phone_server)
    stream = httpx.post(phone_server.base_url + "/api/phone/telnyx-stream", timeout=10).json()  # one-use token
    sim = PhoneSim(ws_base(phone_server) + "/telnyx/media", provider="telnyx", stream_token=stream["token"])
    await sim.connect()
    await asyncio.sleep(0.4)
    await sim.say(speech_samples(QUESTION, tmp_path, 8000))
    done = await turn_done(phone_server, sim.call_sid, 1)
    assert transport_counts(phone_server) == (started_before + 1, 1)  # this call, counted as Telnyx's
    await sim.wait_until(sim.heard_everything, 30)
    await sim.hangup()
    assert done["status"] == "completed" and words(done["text"]), done
    assert sim.marks and len(sim.played_audio()) > 8000 * 0.5
    deadline = time.monotonic() + 10  # its slot is given back as soon as the server reads the stop
    while transport_counts(phone_server)[1] != 0:
        assert time.monotonic() < deadline, "the Telnyx call is still counted as active after its stop"
        await asyncio.sleep(0.05)
    assert transport_counts(phone_server)[0] == started_before + 1
