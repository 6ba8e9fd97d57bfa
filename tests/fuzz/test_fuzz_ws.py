"""Fuzzing the native /ws protocol: native.messages.parse_client_text alone, then the real native call
(app/transports/native/wire.py on the call runner; fake socket, fake engines, named as fakes) fed hostile
message sequences, frames before session.start and floods, while a well-behaved caller on the same
runtime goes on being answered correctly."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.runtime import Runtime
from app.transports.native.messages import OUTPUT_RATES, OutputAudioPlayed, SessionEnd, SessionStart, parse_client_text
from app.transports.native.wire import native_call
from core.errors import ProtocolError
from pipeline.audio import SUPPORTED_INPUT_RATES
from tests.app.test_ws_edges import FakeSocket
from tests.fuzz.harness import CASES, MAX_ERRORS, START, GoodCaller, Loop, error_codes, fake_runtime, fuzz_settings
from tests.fuzz.strategies import binary_frames, text_frames

TEMPLATES: list[dict[str, Any]] = [
    {"type": "session.start", "audio": {"sample_rate": 16000, "encoding": "pcm16"},
     "output_audio": {"sample_rate": 24000}, "instructions": "Be brief."},
    {"type": "session.end"},
    {"type": "output_audio.played", "turn_id": 1, "played_ms": 120.5},
]
frames = st.one_of(text_frames(TEMPLATES).map(lambda t: ("text", t)), binary_frames.map(lambda b: ("bytes", b)))


PARSE_CODES = {"invalid_json", "invalid_message", "unknown_type", "unsupported_sample_rate"}


@given(text_frames(TEMPLATES))
@fuzz_settings(4000)
def test_parse_client_text_accepts_or_says_what_is_wrong(text: str) -> None:
    CASES["ws parse"] += 1
    try:
        parsed = parse_client_text(text)
    except ProtocolError as exc:
        assert exc.code in PARSE_CODES and str(exc), (exc.code, str(exc), text)
        return
    except Exception as exc:  # anything else would reach the socket as a crash, not an error event
        pytest.fail(f"{type(exc).__name__}: {exc} for {text!r}")
    check_parsed(json.loads(text), parsed)


def check_parsed(raw: Any, parsed: SessionStart | SessionEnd | OutputAudioPlayed) -> None:
    """What is true of every accepted message: it is the type the input names, its fields are the
    input's (numbers as numbers: pydantic's lax mode takes 16000.0 or "16000" for 16000), and no field
    the message does not know was let through."""
    assert isinstance(raw, dict) and parsed.type == raw["type"], (raw, parsed)
    assert set(raw) <= set(type(parsed).model_fields), (raw, parsed)
    if isinstance(parsed, OutputAudioPlayed):
        assert parsed.turn_id >= 0 and float(parsed.turn_id) == float(raw["turn_id"]), (raw, parsed)
        assert 0 <= parsed.played_ms == float(raw["played_ms"]), (raw, parsed)
    elif isinstance(parsed, SessionStart):
        assert parsed.audio.sample_rate in SUPPORTED_INPUT_RATES, (raw, parsed)
        assert float(parsed.audio.sample_rate) == float(raw["audio"]["sample_rate"]), (raw, parsed)
        assert parsed.audio.encoding == raw["audio"].get("encoding", "pcm16") == "pcm16", (raw, parsed)
        assert parsed.instructions == raw.get("instructions"), (raw, parsed)
        out = raw.get("output_audio")
        if parsed.output_audio is None or parsed.output_audio.sample_rate is None:
            assert not out or out.get("sample_rate") is None, (raw, parsed)
        else:
            assert parsed.output_audio.sample_rate in OUTPUT_RATES, (raw, parsed)
            assert float(parsed.output_audio.sample_rate) == float(out["sample_rate"]), (raw, parsed)
    else:
        assert isinstance(parsed, SessionEnd) and set(raw) == {"type"}, (raw, parsed)


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
    return GoodCaller(runtime)  # built on the loop: its queues belong to it


def expected_errors(runtime: Runtime, started: bool, messages: list[tuple[str, Any]]) -> list[str]:
    """The error codes NativeWire.handle answers `messages` with, in order: one for each message that
    is bad on its own, nothing after session.end, and once server.max_protocol_errors are reached,
    `too_many_errors` and the end of the call."""
    server, codes = runtime.settings.server, []
    for kind, payload in messages:
        if kind == "bytes":
            if not started:
                codes.append("session_not_started")
            elif len(payload) > server.max_frame_bytes:
                codes.append("frame_too_large")
            elif len(payload) % 2:
                codes.append("invalid_audio_frame")
        elif len(payload.encode()) > server.max_text_bytes:
            codes.append("message_too_large")
        else:
            try:
                parsed = parse_client_text(payload)
            except ProtocolError as exc:
                codes.append(exc.code)
            else:
                if isinstance(parsed, SessionEnd):
                    break
                if isinstance(parsed, SessionStart):
                    if started:
                        codes.append("session_already_started")
                    elif len(parsed.instructions or "") > runtime.settings.session.max_instructions_chars:
                        codes.append("instructions_too_long")
                    else:
                        started = True
                elif not started:  # output_audio.played
                    codes.append("session_not_started")
        if len(codes) == server.max_protocol_errors:
            return [*codes, "too_many_errors"]
    return codes


async def hostile_call(runtime: Runtime, start_first: bool, messages: list[tuple[str, Any]]) -> list[Any]:
    socket = FakeSocket()
    connection = native_call(socket, runtime)  # type: ignore[arg-type]
    runner = asyncio.create_task(connection.run())
    if start_first:
        socket.text(START)
    for kind, payload in messages:
        socket.text(payload) if kind == "text" else socket.audio(payload)
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(runner, 8)
    return socket.sent


@given(st.booleans(), st.lists(frames, max_size=8))
@fuzz_settings(1500)
def test_the_connection_answers_every_bad_message_with_an_error(
        shared: tuple[Loop, Runtime, GoodCaller], start_first: bool, messages: list[tuple[str, Any]]) -> None:
    CASES["ws connection"] += 1
    loop, runtime, _ = shared
    sent = loop.run(hostile_call(runtime, start_first, messages))
    assert error_codes(sent) == expected_errors(runtime, start_first, messages), messages


def test_a_flood_of_bad_messages_closes_that_call_only(shared: tuple[Loop, Runtime, GoodCaller]) -> None:
    loop, runtime, _ = shared
    flood = [("text", "{not json")] * 500 + [("bytes", b"\x00")] * 500
    sent = loop.run(hostile_call(runtime, True, flood))
    codes = error_codes(sent)
    assert codes.count("invalid_json") == MAX_ERRORS and codes[-1] == "too_many_errors"
    CASES["ws flood"] += 1


def test_the_well_behaved_caller_was_answered_correctly_throughout(shared: tuple[Loop, Runtime, GoodCaller]) -> None:
    loop, _, good = shared
    loop.run(asyncio.sleep(0.5))
    good.check()
