"""Fuzzing the phone protocol (Twilio and Telnyx media streams): Dialect.parse alone, then the real
PhoneCall (fake socket, fake engines, named as fakes) fed hostile frame sequences. A phone line takes
no error messages: every bad frame is logged and counted in /metrics, the call goes on until
server.max_protocol_errors, and a well-behaved /ws caller on the same runtime is still answered."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.phone import PhoneCall
from app.phone_wire import TELNYX, TWILIO, CallStart, Dialect, Dtmf, Media, Stop
from app.runtime import Runtime
from core.errors import ProtocolError
from tests.app.test_ws_edges import FakeSocket
from tests.fuzz.harness import CASES, MAX_ERRORS, GoodCaller, Loop, fake_runtime, fuzz_settings
from tests.fuzz.strategies import binary_frames, text_frames

MULAW = base64.b64encode(b"\xff" * 160).decode()
TEMPLATES: dict[str, list[dict[str, Any]]] = {
    "twilio": [
        {"event": "connected", "protocol": "Call", "version": "1.0.0"},
        {"event": "start", "streamSid": "MZ1", "start": {
            "streamSid": "MZ1", "callSid": "CA1", "customParameters": {"From": "+1555"},
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}},
        {"event": "media", "streamSid": "MZ1", "media": {"track": "inbound", "payload": MULAW}},
        {"event": "mark", "streamSid": "MZ1", "mark": {"name": "t1:200"}},
        {"event": "dtmf", "streamSid": "MZ1", "dtmf": {"digit": "5"}},
        {"event": "stop", "streamSid": "MZ1"},
    ],
    "telnyx": [
        {"event": "start", "stream_id": "s1", "start": {
            "call_control_id": "v3:1", "custom_parameters": {},
            "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1}}},
        {"event": "media", "stream_id": "s1", "media": {"track": "inbound", "payload": MULAW}},
        {"event": "error", "stream_id": "s1", "payload": {"code": 100002, "title": "x"}},
        {"event": "stop", "stream_id": "s1"},
    ],
}
DIALECTS = {"twilio": TWILIO, "telnyx": TELNYX}
frames = {name: st.one_of(text_frames(t).map(lambda s: ("text", s)), binary_frames.map(lambda b: ("bytes", b)))
          for name, t in TEMPLATES.items()}


@given(st.sampled_from(["twilio", "telnyx"]).flatmap(lambda n: st.tuples(st.just(n), text_frames(TEMPLATES[n]))))
@fuzz_settings(3000)
def test_parse_accepts_or_says_what_is_wrong(case: tuple[str, str]) -> None:
    CASES["phone parse"] += 1
    name, text = case
    try:
        DIALECTS[name].parse(text, 4000)
    except ProtocolError as exc:
        assert exc.code and str(exc)


@pytest.fixture(scope="module")
def shared() -> Iterator[tuple[Loop, Runtime, GoodCaller]]:
    loop = Loop()
    runtime = fake_runtime()
    good = loop.run(_make_caller(runtime))
    talking = asyncio.run_coroutine_threadsafe(good.talk(), loop.loop)
    yield loop, runtime, good
    loop.loop.call_soon_threadsafe(good.stopped.set)
    talking.result(20)
    loop.close()


async def _make_caller(runtime: Runtime) -> GoodCaller:
    return GoodCaller(runtime)


def errors_counted(runtime: Runtime) -> float:
    return sum(s.value for m in runtime.metrics.registry.collect() if m.name == "voice_agent_errors"
               for s in m.samples if s.name == "voice_agent_errors_total")


def expected_errors(dialect: Dialect, messages: list[tuple[str, Any]], limit: int) -> int:
    """How many of `messages` are bad on their own (each must be counted)."""
    bad, started = 0, False
    for kind, payload in messages:
        if kind == "bytes":
            bad += 1
            continue
        try:
            frame = dialect.parse(payload, limit)
        except ProtocolError:
            bad += 1
            continue
        if isinstance(frame, Stop):
            break
        if isinstance(frame, CallStart):
            bad += started
            started = True
        elif isinstance(frame, Media | Dtmf):
            bad += not started
    return bad


async def hostile_call(runtime: Runtime, dialect: Dialect, messages: list[tuple[str, Any]]) -> FakeSocket:
    socket = FakeSocket()
    call = PhoneCall(socket, runtime, dialect)  # type: ignore[arg-type]
    runner = asyncio.create_task(call.run())
    for kind, payload in messages:
        socket.text(payload) if kind == "text" else socket.audio(payload)
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(runner, 8)
    return socket


@given(st.sampled_from(["twilio", "telnyx"]).flatmap(lambda n: st.tuples(st.just(n), st.lists(frames[n], max_size=8))))
@fuzz_settings(1000)
def test_every_bad_frame_is_counted_and_the_call_goes_on(
        shared: tuple[Loop, Runtime, GoodCaller], case: tuple[str, list[tuple[str, Any]]]) -> None:
    CASES["phone call"] += 1
    loop, runtime, _ = shared
    name, messages = case
    before = errors_counted(runtime)
    socket = loop.run(hostile_call(runtime, DIALECTS[name], messages))
    want = expected_errors(DIALECTS[name], messages, runtime.settings.phone.max_media_payload_bytes)
    assert errors_counted(runtime) - before >= min(want, MAX_ERRORS), messages
    assert socket.closed_with in (None, 1000, 1008), socket.close_reason


def test_the_well_behaved_caller_was_answered_correctly_throughout(shared: tuple[Loop, Runtime, GoodCaller]) -> None:
    loop, _, good = shared
    loop.run(asyncio.sleep(0.5))
    good.check()
