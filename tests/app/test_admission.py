"""Admission from outside, on the default limits, over a real socket (fake engines, named as fakes,
whose clean-up after a call takes 0.5 s, as the real ASR and LLM's do): callers who hang up and call
again at once are answered, whether they share one address (a call centre behind one gateway,
never more than server.max_calls_per_client open) or fill every call slot (server.max_sessions).

The server hears each hang-up 0.3 s late (`LateHangUps`, a fake of a server whose loop is busy with
the models): the real server heard the close after the caller had already redialled, and refused
the redial, while a server with nothing else to do heard it first. server.admission_wait_s lets the
redial wait for the place being given back."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import numpy as np
import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from websockets.asyncio.client import connect

from app.main import create_app
from app.settings import Settings
from app.store.config import StorageConfig
from tests.app.fake_server import REPLY, fake_backends
from tests.app.live import live

START = json.dumps({"type": "session.start", "audio": {"sample_rate": 16000}})
SPEECH = [np.full(320, 8000, dtype="<i2").tobytes()] * 25 + [np.zeros(320, dtype="<i2").tobytes()] * 40


class LateHangUps:
    """A fake of a busy server (named as a fake) around the app: each caller's hang-up reaches the app
    `delay_s` after the caller saw its socket closed."""

    def __init__(self, app: ASGIApp, delay_s: float) -> None:
        self.app = app
        self.delay_s = delay_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)

        async def late() -> Message:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                await asyncio.sleep(self.delay_s)
            return message

        await self.app(scope, late, send)


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    backends = fake_backends(0.001)
    backends.llm.close_delay_s = 0.5  # type: ignore[attr-defined]
    settings = Settings(storage=StorageConfig(enabled=False))
    defaults = settings.server
    assert (defaults.max_sessions, defaults.max_calls_per_client) == (8, 4)  # what this test is about
    with live(LateHangUps(create_app(settings, backends=backends), 0.3)) as served:
        yield served


async def one_call(address: str, source: str) -> str:
    """A short call: a question, its reply, hang up. Returns how it went."""
    async with connect(f"ws://{address}/ws", local_addr=(source, 0)) as ws:
        await ws.send(START)
        started = json.loads(await ws.recv())
        if started["type"] != "session.started":
            return f"refused: {started.get('code')}"
        for frame in SPEECH:
            await ws.send(frame)
            await asyncio.sleep(0.002)
        async with asyncio.timeout(20):
            while True:
                message = await ws.recv()
                if isinstance(message, str) and (event := json.loads(message))["type"] == "response.done":
                    return "answered" if event["status"] == "completed" and event["text"] == REPLY else str(event)


async def calls(address: str, sources: list[str], total: int) -> list[str]:
    """`total` calls, one caller per source address, each calling again as soon as its call ends."""
    left = iter(range(total))
    outcomes: list[str] = []

    async def caller(source: str) -> None:
        for _ in left:
            try:
                outcomes.append(await one_call(address, source))
            except Exception as exc:  # a close before session.started: refused by the guard
                outcomes.append(f"refused: {exc}")

    await asyncio.gather(*(caller(s) for s in sources))
    return outcomes


async def test_ten_calls_from_one_address_four_at_a_time_are_all_answered(address: str) -> None:
    outcomes = await calls(address, ["127.0.0.21"] * 4, 10)
    assert outcomes == ["answered"] * 10


async def test_twenty_calls_from_eight_addresses_eight_at_a_time_are_all_answered(address: str) -> None:
    outcomes = await calls(address, [f"127.0.0.{30 + n}" for n in range(8)], 20)
    assert outcomes == ["answered"] * 20
