"""The phone transport (app/transports/phone/wire.py) with a fake socket and fake engines: reply audio goes out as
20 ms mu-law frames with marks, echoed marks tell the session what was heard, a barge-in sends
`clear` after the turn is finished (so the marks `clear` returns count for nothing), bad frames are
logged and counted and the call goes on."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np
import pytest

from app.runtime import Runtime
from app.settings import PhoneConfig, ServerConfig, Settings
from app.transports.call import Call
from app.transports.phone.messages import TELNYX, TWILIO, Provider, mark_name, parse_mark
from app.transports.phone.wire import phone_call
from core.clock import MonotonicClock
from pipeline.audio import float_to_mulaw, mulaw_to_pcm16
from pipeline.config import AsrStageConfig, EndpointingConfig, SessionConfig
from pipeline.session import Backends
from tests.app.test_ws_edges import FakeSocket
from tests.pipeline.fakes import FakeLLM, FakeRecognizer, FakeSynthesizer, FakeVad
from tests.pipeline.test_session import STORY


def phone_runtime(llm: FakeLLM, finals: list[str], max_errors: int = 50, **session: Any) -> Runtime:
    settings = Settings(
        server=ServerConfig(max_protocol_errors=max_errors),
        endpointing=EndpointingConfig(min_speech_ms=64, end_silence_ms=256, prefix_padding_ms=100),
        asr_stage=AsrStageConfig(partials=False),
        session=SessionConfig(output_chunk_ms=20, **{"output_lead_ms": 0, **session}),
        phone=PhoneConfig(mark_interval_ms=200),
    )
    rt = Runtime(settings, MonotonicClock(), backends=Backends(FakeVad(), FakeRecognizer(finals), FakeSynthesizer(),
                                                               llm))
    rt.ready.set()
    return rt


class Line:
    """The provider's side of a fake socket: frames in, the server's frames out."""

    def __init__(self, provider: Provider = TWILIO) -> None:
        self.socket = FakeSocket()
        self.provider = provider
        self.key = provider.stream_key

    def send(self, event: str, **body: Any) -> None:
        self.socket.text(json.dumps({"event": event, self.key: "MZ1", **body}))

    def start(self, runtime: Runtime | None = None, nonce: str | None = None, call_sid: str = "CA1") -> None:
        """The provider's `start`. Twilio's hands back the nonce of the TwiML that made the call: one
        `runtime` mints (as the voice webhook does), or the one given."""
        if self.provider is TWILIO:
            if nonce is None and runtime is not None:
                nonce = runtime.stream_nonces.issue(call_sid)
            parameters = {"From": "+1555", **({"nonce": nonce} if nonce is not None else {})}
            self.send("start", start={"streamSid": "MZ1", "callSid": call_sid, "customParameters": parameters,
                                      "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}})
        else:
            self.send("start", start={"call_control_id": "v3:1", "custom_parameters": {},
                                      "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1}})

    def speak(self, seconds: float, loud: bool) -> None:
        """Caller audio, in 20 ms media frames (fed at once: the fake engines do not need real time)."""
        mulaw = float_to_mulaw(np.full(int(8000 * seconds), 0.5 if loud else 0.0, dtype=np.float32))
        for i in range(0, len(mulaw), 160):
            self.send("media", media={"track": "inbound", "payload": base64.b64encode(mulaw[i:i + 160]).decode()})

    def frames(self) -> list[dict[str, Any]]:
        return [json.loads(m) for m in self.socket.sent]

    def sent_ms(self) -> int:
        """Reply audio sent so far."""
        return sum(len(base64.b64decode(f["media"]["payload"])) for f in self.frames() if f["event"] == "media") // 8

    async def wait(self, predicate: Any, timeout: float = 5.0) -> None:
        async def loop() -> None:
            while not predicate():
                await asyncio.sleep(0.01)
        await asyncio.wait_for(loop(), timeout)


def session_history(call: Call) -> list[str]:
    assert call.session is not None
    return [m.content for m in call.session.history]


async def test_reply_audio_goes_out_in_20_ms_mulaw_frames_with_marks() -> None:
    llm = FakeLLM(["One two three four five."])
    line = Line()
    rt = phone_runtime(llm, ["Count to five."])
    call = phone_call(line.socket, rt, TWILIO)  # type: ignore[arg-type]
    runner = asyncio.create_task(call.run())
    line.start(rt)
    line.speak(0.5, True)
    line.speak(0.5, False)
    await line.wait(lambda: any(f["event"] == "mark" and f["mark"]["name"] == "t1:500" for f in line.frames()))
    frames = line.frames()
    media = [f for f in frames if f["event"] == "media"]
    assert all(f["streamSid"] == "MZ1" for f in frames)
    payloads = [base64.b64decode(f["media"]["payload"]) for f in media]
    assert {len(p) for p in payloads} == {160} and len(payloads) == 25  # 0.5 s of reply in 20 ms frames
    audio = np.frombuffer(mulaw_to_pcm16(b"".join(payloads)), dtype="<i2")
    assert np.abs(audio).max() > 5000  # the fake voice's tone, not silence
    # a mark after every 200 ms of the reply's audio, and one at its end
    marks = [(i, f["mark"]["name"]) for i, f in enumerate(frames) if f["event"] == "mark"]
    assert [name for _, name in marks] == ["t1:200", "t1:400", "t1:500"]
    for index, name in marks:
        before = sum(1 for f in frames[:index] if f["event"] == "media")
        assert before * 20 == parse_mark(name)[1]  # type: ignore[index]
    line.send("stop")
    await asyncio.wait_for(runner, 5)
    assert line.socket.closed_with == 1000


async def test_echoed_marks_keep_the_heard_words_and_a_barge_in_clears_the_rest() -> None:
    """1.5 s of the story is sent at once (1.5 s of lead); the phone says 400 ms of it played; the
    caller interrupts: the history keeps the words of those 400 ms (carried forward to the
    barge-in), `clear` follows the turn's end, and the marks it returns count for nothing."""
    llm = FakeLLM([STORY, "Okay."])
    line = Line()
    rt = phone_runtime(llm, ["Tell me a story.", "Stop."], output_lead_ms=1500, take_back_ms=0)  # a barge-in as such
    call = phone_call(line.socket, rt, TWILIO)  # type: ignore[arg-type]
    runner = asyncio.create_task(call.run())
    line.start(rt)
    line.speak(0.5, True)
    line.speak(0.4, False)
    await line.wait(lambda: line.sent_ms() >= 1500)
    line.send("mark", mark={"name": "t1:200"})
    line.send("mark", mark={"name": "t1:400"})
    line.speak(0.3, True)  # "Stop."
    line.speak(0.4, False)
    await line.wait(lambda: any(f["event"] == "clear" for f in line.frames()))
    frames = line.frames()
    cleared = next(i for i, f in enumerate(frames) if f["event"] == "clear")
    pending = [f["mark"]["name"] for f in frames[:cleared] if f["event"] == "mark" and
               parse_mark(f["mark"]["name"])[1] > 400]  # type: ignore[index]
    assert pending, "the marks the phone still holds"
    for name in pending:  # what Twilio does at a clear: the pending marks come back at once
        line.send("mark", mark={"name": name})
    await line.wait(lambda: len(session_history(call)) >= 5)  # the second turn's reply is in
    heard = session_history(call)[2]
    assert STORY.startswith(heard) and 3 <= len(heard.split()) <= 6, heard  # ~0.4-0.6 s at 0.1 s a word
    assert llm.requests[1][2].content == heard and llm.requests[1][3].content == "Stop."
    # after the clear only the second reply's audio: "Okay." (0.1 s, five frames) and its mark
    after = line.frames()[cleared + 1:]
    assert sum(f["event"] == "media" for f in after) == 5
    assert [f["mark"]["name"] for f in after if f["event"] == "mark"] == ["t2:100"]
    line.socket.inbox.put_nowait({"type": "websocket.disconnect"})  # hung up without stop
    await asyncio.wait_for(runner, 5)
    assert call.session is None


async def test_bad_frames_are_counted_and_the_call_goes_on_until_too_many() -> None:
    rt = phone_runtime(FakeLLM([]), [], max_errors=6)
    line = Line()
    call = phone_call(line.socket, rt, TWILIO)  # type: ignore[arg-type]
    runner = asyncio.create_task(call.run())
    line.send("media", media={"payload": "AAAA"})  # before start
    line.start(rt)
    line.socket.audio(b"\x00" * 160)  # binary
    line.socket.text("{not json")
    line.send("media", media={"payload": "%%%"})  # not base64
    line.send("dance")
    await line.wait(lambda: call.errors == 5)
    assert not runner.done()  # each logged and counted; the call goes on
    assert call.session is not None
    line.socket.text("x" * (rt.settings.phone.max_frame_bytes + 1))
    await asyncio.wait_for(runner, 5)
    assert line.socket.closed_with == 1008
    assert line.socket.close_reason and line.socket.close_reason.startswith("too_many_errors")
    value = rt.metrics.registry.get_sample_value
    for code in ("media_before_start", "binary_frame", "invalid_json", "invalid_audio_payload", "unknown_event",
                 "frame_too_large"):
        assert value("voice_agent_errors_total", {"code": code}) == 1, code
    assert value("voice_agent_sessions_total", {"transport": "twilio"}) == 1


async def test_a_telnyx_call_takes_snake_case_frames_and_its_keys() -> None:
    llm = FakeLLM(["You pressed nine."])
    line = Line(TELNYX)
    rt = phone_runtime(llm, [], dtmf_timeout_ms=200)
    call = phone_call(line.socket, rt, TELNYX)  # type: ignore[arg-type]
    runner = asyncio.create_task(call.run())
    line.start()
    line.send("media", media={"track": "outbound", "payload": "////"})  # the bot's own track: ignored
    line.send("dtmf", dtmf={"digit": "9"})
    await line.wait(lambda: any(f["event"] == "mark" for f in line.frames()))
    assert llm.requests[0][-1].content == "The caller pressed 9 on the phone keypad."
    media = next(f for f in line.frames() if f["event"] == "media")
    assert set(media) == {"event", "media"}  # Telnyx's frames name no stream
    assert call.errors == 0
    line.send("stop")
    await asyncio.wait_for(runner, 5)


@pytest.mark.parametrize("nonce", [None, "made-up", "used"])
async def test_a_twilio_stream_without_the_nonce_of_its_twiml_is_refused(nonce: str | None) -> None:
    """A replayed stream (same signature, same start parameters) hands back a used nonce; a forged
    one, none or a made-up one. Each is closed 1008 before a call begins, and takes no slot."""
    rt = phone_runtime(FakeLLM([]), [])
    if nonce == "used":
        nonce = rt.stream_nonces.issue("CA1")
        first = Line()
        first_call = phone_call(first.socket, rt, TWILIO)  # type: ignore[arg-type]
        first_runner = asyncio.create_task(first_call.run())
        first.start(nonce=nonce)
        await first.wait(lambda: first_call.session is not None)
        first.send("stop")
        await asyncio.wait_for(first_runner, 5)
    line = Line()
    call = phone_call(line.socket, rt, TWILIO)  # type: ignore[arg-type]
    runner = asyncio.create_task(call.run())
    line.start(nonce=nonce)
    await line.wait(lambda: line.socket.closed_with is not None)
    assert line.socket.closed_with == 1008 and "nonce" in (line.socket.close_reason or "")
    assert call.session is None and not rt.sessions and call.call_log is None
    line.socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(runner, 5)
    assert rt.metrics.registry.get_sample_value("voice_agent_errors_total", {"code": "bad_nonce"}) == 1


async def test_a_nonce_is_bound_to_its_call() -> None:
    rt = phone_runtime(FakeLLM([]), [])
    line = Line()
    call = phone_call(line.socket, rt, TWILIO)  # type: ignore[arg-type]
    runner = asyncio.create_task(call.run())
    line.start(nonce=rt.stream_nonces.issue("CA-another-call"))
    await line.wait(lambda: line.socket.closed_with is not None)
    assert line.socket.closed_with == 1008 and call.session is None
    line.socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(runner, 5)


async def test_a_phone_socket_takes_its_slot_at_start_and_is_closed_without_one() -> None:
    """Before `start` a media socket holds no call slot; one that never starts is closed after
    server.start_timeout_s."""
    rt = phone_runtime(FakeLLM([]), [])
    rt.settings.server.max_sessions = 1
    rt.settings.server.start_timeout_s = 0.3
    idle = Line()
    waiting = phone_call(idle.socket, rt, TWILIO)  # type: ignore[arg-type]
    idle_runner = asyncio.create_task(waiting.run())
    idle.send("connected")
    idle.send("dance")  # a bad frame after it: once it is counted, `connected` was handled
    await idle.wait(lambda: waiting.errors == 1)
    assert not rt.sessions  # connected, not started: no slot taken
    line = Line()
    call = phone_call(line.socket, rt, TWILIO)  # type: ignore[arg-type]
    runner = asyncio.create_task(call.run())
    line.start(rt)
    await line.wait(lambda: call.session is not None)
    assert list(rt.sessions) == [call.session_id]
    await asyncio.wait_for(idle_runner, 5)  # the silent socket was closed at its start timeout
    assert idle.socket.closed_with == 1008 and "start" in (idle.socket.close_reason or "")
    busy = Line()
    refused = phone_call(busy.socket, rt, TWILIO)  # type: ignore[arg-type]
    busy_runner = asyncio.create_task(refused.run())
    busy.start(rt, call_sid="CA2")  # the one slot is taken: refused at its start
    await busy.wait(lambda: busy.socket.closed_with is not None)
    assert busy.socket.closed_with == 1013 and refused.session is None
    for ln, task in ((busy, busy_runner), (line, runner)):
        ln.socket.inbox.put_nowait({"type": "websocket.disconnect"})
        await asyncio.wait_for(task, 5)


@pytest.mark.parametrize(("frame", "code"), [
    ({"event": "start", "streamSid": "MZ", "start": {"streamSid": "MZ", "callSid": "CA", "mediaFormat": {
        "encoding": "audio/x-l16", "sampleRate": 16000, "channels": 1}}}, "unsupported_media_format"),
    ({"event": "dtmf", "dtmf": {"digit": "x"}}, "invalid_dtmf"),
    ({"event": "mark", "mark": {}}, "invalid_message"),
    ([1, 2], "invalid_message"),
])
def test_frames_the_dialect_refuses_say_why(frame: Any, code: str) -> None:
    from core.errors import ProtocolError

    with pytest.raises(ProtocolError) as caught:
        TWILIO.parse(json.dumps(frame), 16000)
    assert caught.value.code == code and str(caught.value)


def test_mark_names_carry_the_turn_and_the_audio_before_them() -> None:
    assert mark_name(3, 1400) == "t3:1400"
    assert parse_mark("t3:1400") == (3, 1400)
    assert parse_mark("t3:1400x") is None and parse_mark("hello") is None and parse_mark("t:1") is None
