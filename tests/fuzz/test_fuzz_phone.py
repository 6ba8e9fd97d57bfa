"""Fuzzing the phone protocol (Twilio and Telnyx media streams): Provider.parse alone, then the real
phone_call (fake socket, fake engines, named as fakes) fed hostile frame sequences. A phone line takes
no error messages: every bad frame is logged and counted in /metrics, the call goes on until
server.max_protocol_errors, and a well-behaved /ws caller on the same runtime is still answered."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from app.runtime import Runtime
from app.transports.phone.messages import (
    DTMF_DIGITS,
    TELNYX,
    TWILIO,
    CallStart,
    Connected,
    Dtmf,
    Mark,
    Media,
    Provider,
    ProviderError,
    Stop,
)
from app.transports.phone.wire import phone_call
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


PARSE_CODES = {"invalid_json", "invalid_message", "unknown_event", "invalid_dtmf", "payload_too_large",
               "invalid_audio_payload", "unsupported_media_format"}
EVENTS: dict[type, str] = {Connected: "connected", CallStart: "start", Media: "media", Dtmf: "dtmf", Mark: "mark",
                           Stop: "stop", ProviderError: "error"}


@given(st.sampled_from(["twilio", "telnyx"]).flatmap(lambda n: st.tuples(st.just(n), text_frames(TEMPLATES[n]))))
@example(("twilio", json.dumps(TEMPLATES["twilio"][1])))  # a whole start is rare among the mutations
@example(("telnyx", json.dumps(TEMPLATES["telnyx"][0])))
@fuzz_settings(3000)
def test_parse_accepts_or_says_what_is_wrong(case: tuple[str, str]) -> None:
    CASES["phone parse"] += 1
    name, text = case
    try:
        frame = DIALECTS[name].parse(text, 4000)
    except ProtocolError as exc:
        assert exc.code in PARSE_CODES and str(exc), (exc.code, str(exc), name, text)
        return
    except Exception as exc:  # anything else would end the call with a crash, not a counted bad frame
        pytest.fail(f"{type(exc).__name__}: {exc} for {name} {text!r}")
    check_frame(name, json.loads(text), frame, 4000)


def check_frame(name: str, raw: Any, frame: Any, limit: int) -> None:
    """What is true of every accepted frame: it is the event the input names (Telnyx's `error` only
    from Telnyx), and it carries the input's fields as they were."""
    assert isinstance(raw, dict) and EVENTS[type(frame)] == raw["event"], (name, raw, frame)
    if isinstance(frame, Media):
        assert frame.payload == base64.b64decode(raw["media"]["payload"]), (name, raw, frame)
        assert len(frame.payload) <= limit + 2 and frame.track == raw["media"].get("track"), (name, raw, frame)
    elif isinstance(frame, Dtmf):
        assert frame.digit == raw["dtmf"]["digit"] and frame.digit in DTMF_DIGITS, (name, raw, frame)
    elif isinstance(frame, Mark):
        assert frame.name == raw["mark"]["name"], (name, raw, frame)
    elif isinstance(frame, CallStart):
        start = raw["start"]
        if name == "twilio":
            ids, params = (start["streamSid"], start["callSid"]), start.get("customParameters", {})
        else:
            ids, params = (raw["stream_id"], start["call_control_id"]), start.get("custom_parameters", {})
        assert (frame.stream_id, frame.call_id) == ids, (name, raw, frame)
        assert frame.parameters == {k: v if isinstance(v, str) else json.dumps(v) for k, v in params.items()}, (
            name, raw, frame)
    elif isinstance(frame, ProviderError):
        assert name == "telnyx" and frame.detail == json.dumps(raw.get("payload", raw))[:500], (name, raw, frame)


@pytest.fixture(scope="module")
def shared() -> Iterator[tuple[Loop, Runtime, GoodCaller]]:
    loop = Loop()
    runtime = fake_runtime()
    good = loop.run(_make_caller(runtime))
    talking = asyncio.run_coroutine_threadsafe(good.talk(), loop.loop)
    yield loop, runtime, good
    loop.loop.call_soon_threadsafe(good.stopped.set)
    talking.result(30)  # the call's end: at most 10 s
    loop.close()


async def _make_caller(runtime: Runtime) -> GoodCaller:
    return GoodCaller(runtime)


def errors_counted(runtime: Runtime) -> float:
    return sum(s.value for m in runtime.metrics.registry.collect() if m.name == "voice_agent_errors"
               for s in m.samples if s.name == "voice_agent_errors_total")


def with_nonces(runtime: Runtime, messages: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The messages with a nonce that the server issued (as its TwiML does) in each Twilio `start`'s
    parameters, where they have an object for them: a stream that came from this server's TwiML."""
    signed = []
    for kind, payload in messages:
        try:
            raw = json.loads(payload) if kind == "text" else None
        except ValueError:
            raw = None
        start = raw.get("start") if isinstance(raw, dict) and raw.get("event") == "start" else None
        if isinstance(start, dict) and isinstance(start.get("customParameters", {}), dict):
            owner = start.get("callSid") if isinstance(start.get("callSid"), str) else ""
            start["customParameters"] = {**start.get("customParameters", {}),
                                         "nonce": runtime.stream_nonces.issue(owner)}
            payload = json.dumps(raw)
        signed.append((kind, payload))
    return signed


def expected_errors(provider: Provider, messages: list[tuple[str, Any]], limit: int,
                    nonced: bool) -> tuple[int, bool]:
    """How many errors the call must count (voice_agent_errors_total), following PhoneWire.handle:
    each bad frame; a Twilio `start` without its TwiML's nonce (unless `nonced`), which starts no
    call; a provider's error report; and, at MAX_ERRORS bad frames, the closing too_many_errors.
    And whether a call began."""
    counted, bad, started = 0, 0, False
    for kind, payload in messages:
        if kind == "bytes":
            frame = None
        else:
            try:
                frame = provider.parse(payload, limit)
            except ProtocolError:
                frame = None
        if isinstance(frame, Stop):
            break
        if isinstance(frame, ProviderError):
            counted += 1
            continue
        if isinstance(frame, CallStart) and not started and provider.name == "twilio" and not (
                nonced and frame.parameters.get("nonce")):
            counted += 1  # refused: no nonce (the call is closed 1008; the frames after it still count)
            continue
        if frame is None or (isinstance(frame, CallStart) and started) or (
                isinstance(frame, Media | Dtmf) and not started):
            counted, bad = counted + 1, bad + 1
            if bad >= MAX_ERRORS:
                return counted + 1, started  # too_many_errors, and the call is closed
            continue
        started = started or isinstance(frame, CallStart)
    return counted, started


async def hostile_call(runtime: Runtime, provider: Provider, messages: list[tuple[str, Any]]) -> FakeSocket:
    socket = FakeSocket()
    call = phone_call(socket, runtime, provider)  # type: ignore[arg-type]
    runner = asyncio.create_task(call.run())
    for kind, payload in messages:
        socket.text(payload) if kind == "text" else socket.audio(payload)
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(runner, 8)
    return socket


@given(st.sampled_from(["twilio", "telnyx"]).flatmap(lambda n: st.tuples(st.just(n), st.lists(frames[n], max_size=8))),
       st.booleans())
@fuzz_settings(1000)
def test_every_bad_frame_is_counted_and_the_call_goes_on(
        shared: tuple[Loop, Runtime, GoodCaller], case: tuple[str, list[tuple[str, Any]]], nonced: bool) -> None:
    """Hostile provider sockets, Twilio's with and without the nonce of a TwiML answer: every
    error is counted, exactly, and a `start` without a valid nonce begins no call."""
    CASES["phone call"] += 1
    loop, runtime, _ = shared
    name, messages = case
    if nonced and name == "twilio":
        messages = with_nonces(runtime, messages)
    before = errors_counted(runtime)
    sessions_before = runtime.metrics.registry.get_sample_value("voice_agent_sessions_total",
                                                                {"transport": name}) or 0.0
    socket = loop.run(hostile_call(runtime, DIALECTS[name], messages))
    want, should_start = expected_errors(DIALECTS[name], messages, runtime.settings.phone.max_media_payload_bytes,
                                         nonced)
    assert errors_counted(runtime) - before == want, messages
    assert socket.closed_with in (None, 1000, 1008), socket.close_reason
    started = (runtime.metrics.registry.get_sample_value("voice_agent_sessions_total", {"transport": name}) or 0.0
               ) - sessions_before
    assert started == should_start, messages  # a Twilio start without its nonce begins no call


def test_the_well_behaved_caller_was_answered_correctly_throughout(shared: tuple[Loop, Runtime, GoodCaller]) -> None:
    loop, _, good = shared
    loop.run(asyncio.sleep(0.5))
    good.check()
