"""One API key has a cap on its calls by default (server.max_calls_per_key), below the server's call
slots (server.max_sessions): a leaked key cannot take every slot. Through a real server and client."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from app.settings import ServerConfig
from tests.app.live import fake_app, live

KEY = "k-0123456789abcdef-leaked"
OTHER = "k-another-key-of-its-own"
START = json.dumps({"type": "session.start", "audio": {"sample_rate": 16000}})


async def _started(ws: Any) -> None:
    await ws.send(START)
    event = json.loads(await asyncio.wait_for(ws.recv(), 5))
    assert event["type"] == "session.started"


async def test_one_key_gets_at_most_the_default_cap_of_calls_and_leaves_slots_for_others() -> None:
    defaults = ServerConfig()
    cap = defaults.max_calls_per_key
    assert 0 < cap < defaults.max_sessions
    with live(fake_app(api_keys=[KEY, OTHER], admission_wait_s=0)) as address:
        async with AsyncExitStack() as calls:
            for _ in range(cap):
                await _started(await calls.enter_async_context(
                    connect(f"ws://{address}/ws", additional_headers={"authorization": f"Bearer {KEY}"})))
            async with connect(f"ws://{address}/ws", additional_headers={"authorization": f"Bearer {KEY}"}) as over:
                with pytest.raises(ConnectionClosed) as closed:
                    await asyncio.wait_for(over.recv(), 5)
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 1013
            assert f"{cap} (server.max_calls_per_key)" in closed.value.rcvd.reason
            async with connect(f"ws://{address}/ws", additional_headers={"authorization": f"Bearer {OTHER}"}) as ws:
                await _started(ws)  # the server's other slots are still there for another key
