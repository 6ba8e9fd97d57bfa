"""A Python client for the /ws protocol: streams audio in real time and records every event and
reply-audio frame with its arrival time. Used by `voice-agent call`, the tests and the benchmarks.

Tools the client runs itself: declare them in `connect(tools=[...], tool_choice="auto")` (OpenAI's
function shape) and give `tool_handler`, called as `handler(name, arguments)` for each
`response.function_call` the server sends (arguments parsed from their JSON string); what it returns
(awaited if it is awaitable; JSON-encoded unless it is a string) goes back as
`{"type": "function_call.output", "call_id": ..., "output": ...}`. A reply that made calls ends with a
`response.done` whose status is "tool_calls"; the reply answering from the results has its own
`response.done` (docs/websocket.md, docs/tools.md)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import time
import wave
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class Received:
    at: float  # time.monotonic() on arrival
    event: dict[str, Any] | None = None
    audio: bytes | None = None


def read_wav(path: str | Path) -> tuple[np.ndarray, int]:
    """(int16 mono samples, sample rate) of a 16-bit WAV file."""
    with wave.open(str(path)) as wav:
        if wav.getsampwidth() != 2:
            raise ValueError(f"{path}: need 16-bit PCM, got {8 * wav.getsampwidth()}-bit")
        data = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
        if wav.getnchannels() > 1:
            data = data.reshape(-1, wav.getnchannels())[:, 0]
        return data.copy(), wav.getframerate()


@dataclass
class VoiceClient:
    url: str
    sample_rate: int = 16000
    source_address: str | None = None  # the local address to call from (127.0.0.N: callers of their own)
    received: list[Received] = field(default_factory=list)
    session: dict[str, Any] = field(default_factory=dict)
    _ws: Any = None
    _reader: asyncio.Task[None] | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False
    tool_handler: Callable[[str, dict[str, Any]], Awaitable[Any] | Any] | None = None
    headers: dict[str, str] | None = None  # sent with the upgrade: `Authorization: Bearer <key>`
    _tool_tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def open(self) -> None:
        """Open the socket without starting a session."""
        import websockets

        local: dict[str, Any] = {"local_addr": (self.source_address, 0)} if self.source_address else {}
        self._ws = await websockets.connect(self.url, max_size=None, additional_headers=self.headers, **local)
        self._reader = asyncio.create_task(self._read())

    @property
    def response_headers(self) -> dict[str, str]:
        """The headers of the server's answer to the upgrade, names in lower case (a balancer's X-Served-By)."""
        response = getattr(self._ws, "response", None)
        return {name.lower(): value for name, value in response.headers.raw_items()} if response else {}

    async def wait_closed(self, timeout: float) -> int | None:
        """Wait for the server to close the socket; returns the close code."""
        if self._reader is not None:
            await asyncio.wait_for(asyncio.shield(self._reader), timeout)
        return getattr(self._ws, "close_code", None)

    async def connect(self, instructions: str | None = None, **extra: Any) -> dict[str, Any]:
        """Open the socket and start a session; returns session.started (or the error)."""
        await self.open()
        start: dict[str, Any] = {"type": "session.start", "audio": {"sample_rate": self.sample_rate,
                                                                    "encoding": "pcm16"}, **extra}
        if instructions is not None:
            start["instructions"] = instructions
        await self.send_json(start)
        self.session = await self.wait_for(lambda e: e["type"] in ("session.started", "error"), 30)
        return self.session

    async def send_json(self, data: dict[str, Any]) -> None:
        await self._ws.send(json.dumps(data))

    async def send_raw(self, data: bytes | str) -> None:
        await self._ws.send(data)

    async def stream(self, samples: np.ndarray, frame_ms: int = 20, realtime: bool = True) -> float:
        """Send int16 samples in frames, paced in real time; returns the monotonic time at which
        the last sample was sent."""
        frame = self.sample_rate * frame_ms // 1000
        start = time.monotonic()
        for i, offset in enumerate(range(0, len(samples), frame)):
            if realtime:
                delay = start + i * frame_ms / 1000 - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            await self._ws.send(samples[offset:offset + frame].astype("<i2").tobytes())
        return time.monotonic()

    async def silence(self, seconds: float, frame_ms: int = 20) -> None:
        await self.stream(np.zeros(int(self.sample_rate * seconds), dtype=np.int16), frame_ms)

    async def _read(self) -> None:
        try:
            async for message in self._ws:
                now = time.monotonic()
                if isinstance(message, bytes):
                    self.received.append(Received(now, audio=message))
                else:
                    event = json.loads(message)
                    self.received.append(Received(now, event=event))
                    if event.get("type") == "response.function_call" and self.tool_handler is not None:
                        task = asyncio.create_task(self._run_tool(event))
                        self._tool_tasks.add(task)
                        task.add_done_callback(self._tool_tasks.discard)
                self._changed.set()
        except Exception:  # the connection closed; callers see it through `closed`
            pass
        finally:
            self.closed = True
            self._changed.set()

    async def _run_tool(self, event: dict[str, Any]) -> None:
        """Run the client's tool for a response.function_call and send its output back."""
        assert self.tool_handler is not None
        try:
            result = self.tool_handler(event["name"], json.loads(event["arguments"]))
            if inspect.isawaitable(result):
                result = await result
            output = result if isinstance(result, str) else json.dumps(result)
        except Exception as exc:  # the tool's failure is the model's to hear about
            output = json.dumps({"error": f"{type(exc).__name__}: {exc}"})
        with contextlib.suppress(Exception):
            await self.send_json({"type": "function_call.output", "call_id": event["call_id"], "output": output})

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [r.event for r in self.received if r.event is not None and (kind is None or r.event["type"] == kind)]

    async def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout: float,
                       after: int = 0) -> dict[str, Any]:
        """The first event (from index `after` of `received`) that matches; TimeoutError if none comes."""
        deadline = time.monotonic() + timeout
        while True:
            for r in self.received[after:]:
                if r.event is not None and predicate(r.event):
                    return r.event
            if self.closed:
                raise ConnectionError("the server closed the connection")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no matching event in time")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    def audio_between(self, start: int, end: int | None = None) -> bytes:
        return b"".join(r.audio for r in self.received[start:end] if r.audio is not None)

    @property
    def close_reason(self) -> str | None:
        """Why the server closed the socket (a refusal's reason), once it has."""
        return getattr(self._ws, "close_reason", None)

    async def hang_up(self) -> None:
        """Close the socket at once, saying nothing first: a caller who hangs up."""
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await self._ws.close()

    async def close(self, end: bool = True) -> None:
        if self._ws is None:
            return
        with contextlib.suppress(Exception):
            if end:
                await self.send_json({"type": "session.end"})
            await asyncio.wait_for(self._reader or asyncio.sleep(0), 5)
        with contextlib.suppress(Exception):
            await self._ws.close()
