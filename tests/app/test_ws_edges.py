"""The /ws transport's edges, with a fake socket (named as one) and fake engines: a caller who
stops reading is dropped and their slot freed, a crashed session is reported at once, and the
audio backlog is counted in samples."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from starlette.websockets import WebSocketState

from app.runtime import Runtime
from app.settings import ServerConfig, Settings
from app.transports.call import CLOSE_ERROR, CLOSE_POLICY
from app.transports.native import native_call
from core.clock import MonotonicClock
from models.protocols import Audio
from pipeline.session import Backends
from tests.pipeline.fakes import FakeLLM, FakeRecognizer, FakeSynthesizer, FakeVad, FakeVadStream

START = json.dumps({"type": "session.start", "audio": {"sample_rate": 16000}})


class FakeSocket:
    """A fake WebSocket: the test feeds what the caller sends; `reading` False makes every send
    block, as a caller who stopped reading does once the buffers are full."""

    def __init__(self, reading: bool = True) -> None:
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.sent: list[Any] = []
        self.reading = reading
        self.closed_with: int | None = None
        self.close_reason: str | None = None
        self.application_state = WebSocketState.CONNECTED

    async def receive(self) -> dict[str, Any]:
        return await self.inbox.get()

    async def _send(self, payload: Any) -> None:
        if not self.reading:
            await asyncio.Event().wait()  # never returns
        self.sent.append(payload)

    async def send_text(self, text: str) -> None:
        await self._send(text)

    async def send_bytes(self, data: bytes) -> None:
        await self._send(data)

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        self.closed_with = code
        self.close_reason = reason
        self.application_state = WebSocketState.DISCONNECTED

    def text(self, data: str) -> None:
        self.inbox.put_nowait({"type": "websocket.receive", "text": data})

    def audio(self, data: bytes) -> None:
        self.inbox.put_nowait({"type": "websocket.receive", "bytes": data})


def runtime(vad: Any = None, **server: Any) -> Runtime:
    settings = Settings(server=ServerConfig(**server))
    backends = Backends(vad or FakeVad(), FakeRecognizer([]), FakeSynthesizer(), FakeLLM([]))
    rt = Runtime(settings, MonotonicClock(), backends=backends)
    rt.ready.set()
    return rt


async def test_a_caller_who_stops_reading_is_dropped_after_the_send_timeout() -> None:
    socket = FakeSocket(reading=False)
    connection = native_call(socket, runtime(send_timeout_s=0.3))  # type: ignore[arg-type]
    socket.text(START)  # the answer (session.started) can never be written
    await asyncio.wait_for(connection.run(), 3.0)  # ends by itself: the caller sends nothing more
    assert socket.closed_with == CLOSE_POLICY
    assert connection.session is None  # the session and its slot are gone


class BrokenVad(FakeVad):
    def new_stream(self) -> FakeVadStream:
        raise RuntimeError("the VAD model failed to load")


async def test_a_crashed_session_is_reported_at_once() -> None:
    socket = FakeSocket()
    connection = native_call(socket, runtime(vad=BrokenVad()))  # type: ignore[arg-type]
    socket.text(START)  # then the caller only listens
    await asyncio.wait_for(connection.run(), 3.0)
    errors = [json.loads(m) for m in socket.sent if isinstance(m, str) and '"error"' in m]
    assert errors and "the session failed" in errors[-1]["message"]
    assert "VAD model" not in errors[-1]["message"]  # the caller gets the code; the exception's text, the log
    assert socket.closed_with == CLOSE_ERROR


class SlowVadStream(FakeVadStream):
    def probabilities(self, samples: Audio) -> list[float]:
        import time

        time.sleep(0.05)
        return super().probabilities(samples)


class SlowVad(FakeVad):
    def new_stream(self) -> FakeVadStream:
        return SlowVadStream()


@pytest.fixture
def frames() -> Iterator[bytes]:
    yield (np.zeros(8000, dtype=np.int16)).tobytes()  # 0.5 s at 16 kHz


async def test_the_audio_backlog_is_counted_in_samples(frames: bytes) -> None:
    socket = FakeSocket()
    connection = native_call(socket, runtime(vad=SlowVad(), max_audio_backlog_ms=1000))  # type: ignore[arg-type]
    runner = asyncio.create_task(connection.run())
    socket.text(START)
    for _ in range(6):  # 3 s of audio at once: over the 1 s backlog
        socket.audio(frames)
    tiny = np.zeros(1, dtype=np.int16).tobytes()
    for _ in range(50):  # tiny frames must not slip in because they are tiny
        socket.audio(tiny)
    await asyncio.sleep(0.3)
    assert any('"audio_backlog"' in m for m in socket.sent if isinstance(m, str))
    assert connection.session is not None
    assert connection.session.audio_in.backlog_samples <= 16000 * 1.5  # never far over the limit
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(runner, 5.0)
