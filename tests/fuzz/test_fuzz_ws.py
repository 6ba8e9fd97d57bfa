"""Fuzzing the native /ws protocol: wire.parse_client_text alone, then the real Connection (fake
socket, fake engines, named as fakes) fed hostile message sequences, frames before session.start
and floods, while a well-behaved caller on the same runtime goes on being answered correctly."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.runtime import Runtime
from app.wire import parse_client_text
from app.ws_native import Connection
from core.errors import ProtocolError
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


@given(text_frames(TEMPLATES))
@fuzz_settings(4000)
def test_parse_client_text_accepts_or_says_what_is_wrong(text: str) -> None:
    CASES["ws parse"] += 1
    try:
        parse_client_text(text)
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
    return GoodCaller(runtime)  # built on the loop: its queues belong to it


def expected_errors(started: bool, messages: list[tuple[str, Any]]) -> int:
    """How many of `messages` are bad on their own (each must get an error event)."""
    bad = 0
    for kind, payload in messages:
        if kind == "bytes":
            bad += not started or len(payload) > 32000 or len(payload) % 2 == 1
            continue
        try:
            parsed = parse_client_text(payload)
        except ProtocolError:
            bad += 1
            continue
        if parsed.type == "session.end":
            break
        if parsed.type == "session.start":
            bad += started  # a second start
            started = True
        elif parsed.type == "output_audio.played":
            bad += not started
    return bad


async def hostile_call(runtime: Runtime, start_first: bool, messages: list[tuple[str, Any]]) -> list[Any]:
    socket = FakeSocket()
    connection = Connection(socket, runtime)  # type: ignore[arg-type]
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
    codes = error_codes(sent)
    want = expected_errors(start_first, messages)
    assert len(codes) >= min(want, MAX_ERRORS), (codes, messages)


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
