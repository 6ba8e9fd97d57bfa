"""The /ws transport's edges, with a fake socket (named as one) and fake engines: a caller who
stops reading is dropped and their slot freed, a crashed session is reported at once, and the
audio backlog is counted in samples."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from starlette.websockets import WebSocketState

from app.runtime import Runtime
from app.settings import ServerConfig, Settings
from app.transports.call import CLOSE_ERROR, CLOSE_POLICY
from app.transports.native.wire import native_call
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
        self.query_params: dict[str, str] = {}  # (a phone call placed out names itself in the query)

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


class GatedVadStream(FakeVadStream):
    """A fake VAD that reads nothing until the test opens its gate: the backlog can only grow."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate

    def probabilities(self, samples: Audio) -> list[float]:
        if not self.gate.wait(30):
            raise TimeoutError("the test never opened the gate")
        return super().probabilities(samples)


class GatedVad(FakeVad):
    def __init__(self) -> None:
        self.gate = threading.Event()

    def new_stream(self) -> FakeVadStream:
        return GatedVadStream(self.gate)


@pytest.fixture
def frames() -> Iterator[bytes]:
    yield (np.zeros(8000, dtype=np.int16)).tobytes()  # 0.5 s at 16 kHz


async def test_the_audio_backlog_is_counted_in_samples(frames: bytes) -> None:
    socket = FakeSocket()
    vad = GatedVad()
    connection = native_call(socket, runtime(vad=vad, max_audio_backlog_ms=1000))  # type: ignore[arg-type]
    runner = asyncio.create_task(connection.run())
    socket.text(START)
    for _ in range(6):  # 3 s of audio at once, and the VAD takes none: over the 1 s backlog
        socket.audio(frames)
    tiny = np.zeros(1, dtype=np.int16).tobytes()
    for _ in range(50):  # tiny frames must not slip in because they are tiny
        socket.audio(tiny)
    socket.text("{not json")  # after the audio: once its error is out, every frame was handled

    def errors() -> list[str]:
        return [json.loads(m)["code"] for m in socket.sent if isinstance(m, str) and '"error"' in m]

    async def handled() -> None:
        while "invalid_json" not in errors():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(handled(), 5)
    assert "audio_backlog" in errors()
    assert connection.session is not None
    assert connection.session.audio_in.backlog_samples <= 16000 * 1.5  # never far over the limit
    vad.gate.set()
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(runner, 5.0)
