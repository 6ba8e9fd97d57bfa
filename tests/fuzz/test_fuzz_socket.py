"""Fuzzing over a real socket: hostile /ws connections against a real server process
(tests/app/fake_server.py, fake engines named as fakes), including text frames that are not UTF-8,
while a well-behaved caller on another connection is answered correctly. The server stays up."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets
from hypothesis import given
from hypothesis import strategies as st

from tests.app.fake_server import REPLY
from tests.app.test_shutdown import start_fake_server
from tests.fuzz.harness import CASES, START, Loop, fuzz_settings, utterance
from tests.fuzz.strategies import binary_frames, text_frames
from tests.fuzz.test_fuzz_ws import TEMPLATES

frames = st.one_of(text_frames(TEMPLATES).map(lambda t: ("text", t)), binary_frames.map(lambda b: ("bytes", b)),
                   st.binary(min_size=1, max_size=50).map(lambda b: ("bad utf-8", b"\xff" + b)))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Loop, str, subprocess.Popen[bytes]]]:
    tmp = tmp_path_factory.mktemp("fuzz-socket")
    base, proc, _ = start_fake_server(tmp, VOICE_AGENT_SERVER__MAX_CONNECTIONS_PER_MINUTE="100000",
                                      VOICE_AGENT_SERVER__MAX_PROTOCOL_ERRORS="20", FAKE_TOKEN_DELAY_S="0.001")
    loop = Loop()
    yield loop, base, proc
    loop.close()
    proc.terminate()
    proc.wait(20)


async def hostile(base: str, messages: list[tuple[str, Any]]) -> tuple[list[dict[str, Any]], int | None]:
    """The events the server sent, and its close code."""
    got: list[dict[str, Any]] = []
    async with websockets.connect(f"ws://{base}/ws", max_size=None) as ws:
        try:
            for kind, payload in messages:
                if kind == "bad utf-8":  # the websockets client will not send such a frame through send()
                    ws.protocol.send_text(payload)
                    ws.send_data()
                else:
                    await ws.send(payload)
            if not any(kind == "bad utf-8" for kind, _ in messages):  # else the server closes it (1007)
                await ws.close()
        except (websockets.ConnectionClosed, websockets.exceptions.InvalidState):
            pass  # the server closed it first (the raw send of bad UTF-8 says so with InvalidState)
        with contextlib.suppress(websockets.ConnectionClosed):
            async for message in ws:
                if isinstance(message, str):
                    got.append(json.loads(message))
        await asyncio.wait_for(ws.wait_closed(), 5)
        received = ws.protocol.close_rcvd  # the server's close frame, when it sent one
        return got, received.code if received is not None else None


async def good_call(base: str) -> dict[str, Any]:
    async with websockets.connect(f"ws://{base}/ws") as ws:
        await ws.send(START)
        for frame in utterance():
            await ws.send(frame)
        while True:
            message = await asyncio.wait_for(ws.recv(), 10)
            if isinstance(message, str) and json.loads(message)["type"] in ("response.done", "error"):
                return dict(json.loads(message))


@given(st.lists(frames, min_size=1, max_size=6))
@fuzz_settings(150)
def test_hostile_connections_over_a_real_socket(server: tuple[Loop, str, subprocess.Popen[bytes]],
                                                messages: list[tuple[str, Any]]) -> None:
    CASES["ws socket"] += 1
    loop, base, proc = server
    events, code = loop.run(hostile(base, messages))
    for event in events:
        if event["type"] == "error":
            assert event["code"] and event["message"], event
    if any(kind == "bad utf-8" for kind, _ in messages):
        # 1007: not UTF-8 (1008: too many errors before it); none when the server's close frame was
        # lost to the connection reset by the frames sent after it
        assert code in (1000, 1007, 1008, None), code  # 1000: a session.end came first
    else:
        assert code in (1000, 1008), code
    assert proc.poll() is None


HOST_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789.-:[]_@%*LOCALHST"
hosts = st.one_of(
    st.sampled_from(["attacker.example", "attacker.example:8000", "127.0.0.1.attacker.example", "localhost.evil",
                     "127.0.0.2", "0.0.0.0", "[::2]", "::1", "localhost", "LOCALHOST:1", "a.localhost",
                     "127.0.0.1:80", "[::1]:8000", "localhost.", "evil@127.0.0.1", ""]),
    st.text(HOST_ALPHABET, max_size=30))
GUARDED_PATHS = ["/api/calls", "/v1/models", "/qa", "/metrics", "/", "/api/auth", "/docs"]


def loopback_name(host: str) -> bool:
    """The spec, written apart from app/security/access.py: by default the server answers only to the loopback
    names (a port may follow; IPv6 in brackets; a trailing dot is the same name)."""
    host = host.strip().lower()
    if host.startswith("["):
        name = host[1:host.index("]")] if "]" in host else host
    else:
        name = host.split(":")[0] if host.count(":") == 1 else host
    name = name.rstrip(".")
    return name in ("localhost", "127.0.0.1", "::1") or name.endswith(".localhost")


@given(hosts, st.sampled_from(GUARDED_PATHS))
@fuzz_settings(300)
def test_only_the_hosts_the_server_answers_to_reach_it(server: tuple[Loop, str, subprocess.Popen[bytes]],
                                                        host: str, path: str) -> None:
    """DNS rebinding: any other Host is refused with 400 before a route sees the request."""
    CASES["host"] += 1
    _, base, proc = server
    reply = httpx.get(f"http://{base}{path}", headers={"host": host}, timeout=10)
    refused = reply.status_code == 400 and reply.json()["error"]["code"] == "host_not_allowed"
    assert refused != loopback_name(host), (host, path, reply.status_code)
    assert proc.poll() is None


@pytest.mark.parametrize("host", ["attacker.example", "127.0.0.1.attacker.example", "localhost.evil"])
def test_a_rebinding_host_cannot_open_ws(server: tuple[Loop, str, subprocess.Popen[bytes]], host: str) -> None:
    loop, base, _ = server
    port = int(base.rsplit(":", 1)[1])

    async def attempt() -> int:
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(f"ws://{host}:{port}/ws", host="127.0.0.1", port=port,
                                          origin=websockets.Origin(f"http://{host}:{port}")):
                pass
        return int(refused.value.response.status_code)

    assert loop.run(attempt()) == 403
    CASES["host"] += 1


def test_a_text_frame_that_is_not_utf8_is_closed_with_1007(server: tuple[Loop, str, subprocess.Popen[bytes]]) -> None:
    loop, base, proc = server
    _, code = loop.run(hostile(base, [("text", START), ("bad utf-8", b"\xff\xfe")]))
    assert code == 1007
    assert proc.poll() is None


def test_a_good_call_is_answered_while_hostile_calls_go_on(server: tuple[Loop, str, subprocess.Popen[bytes]]) -> None:
    loop, base, proc = server
    async def both() -> dict[str, Any]:
        flood = [("text", "{")] * 30 + [("bytes", b"\x01" * 33)] * 30 + [("bad utf-8", b"\xff\xfe")]
        hostiles = [asyncio.create_task(hostile(base, flood)) for _ in range(5)]
        done = await good_call(base)
        await asyncio.gather(*hostiles)
        return done
    done = loop.run(both(), timeout=30)
    assert done["type"] == "response.done" and done["status"] == "completed" and done["text"] == REPLY, done
    assert httpx.get(f"http://{base}/healthz", timeout=5).status_code == 200
    assert proc.poll() is None
