"""What the fuzz tests share: a runtime over fake engines (named as fakes), an event loop in a
thread that the Hypothesis examples drive, a well-behaved caller that keeps talking on the same
runtime meanwhile (it must still be answered correctly), and the case counter.

Hypothesis runs the examples in the test's thread; each example's coroutine runs on the shared
loop (`Loop.run`), where the well-behaved call runs concurrently."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import numpy as np
from hypothesis import HealthCheck, settings

from app.runtime import Runtime
from app.settings import ServerConfig, Settings
from app.transports.native.wire import native_call
from core.clock import MonotonicClock
from pipeline.config import AsrStageConfig, EndpointingConfig, SessionConfig
from tests.app.fake_server import REPLY, fake_backends
from tests.app.test_ws_edges import FakeSocket

T = TypeVar("T")
CASES: Counter[str] = Counter()  # fuzz cases run, by test
START = json.dumps({"type": "session.start", "audio": {"sample_rate": 16000}})
MAX_ERRORS = 20  # server.max_protocol_errors in the fuzzed runtime


def fuzz_settings(examples: int) -> settings:
    """A fixed number of examples, each within a deadline; no example database on disk."""
    return settings(max_examples=examples, deadline=2000, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def fake_runtime() -> Runtime:
    settings_ = Settings(
        # the per-address limits are tested on their own; here every case comes from one address
        server=ServerConfig(max_protocol_errors=MAX_ERRORS, max_frame_bytes=32000,
                            max_api_requests_per_minute=10**6, max_connections_per_minute=10**6),
        endpointing=EndpointingConfig(min_speech_ms=64, end_silence_ms=256, prefix_padding_ms=100),
        asr_stage=AsrStageConfig(partials=False),
        session=SessionConfig(output_chunk_ms=20, output_lead_ms=0),
    )
    runtime = Runtime(settings_, MonotonicClock(), backends=fake_backends(token_delay=0.001))
    runtime.ready.set()
    return runtime


class Loop:
    """An event loop in its own thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fuzz-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def utterance(seconds: float = 0.5) -> list[bytes]:
    """Speech to the fake VAD (loud noise, broadband as speech is) then silence, as 20 ms PCM16 frames at 16 kHz.
    Not a tone: against the fake reply's 200 Hz tone, a pure tone arriving in bursts led the echo canceller's
    delay search (pipeline/echo.py) to find the reply in it and gate a whole turn away, and the turn was never
    answered (offline: false finds in 13 of 60 jittered bursts with a 300 Hz tone, none in 180 with noise)."""
    noise = np.random.default_rng(300).uniform(-0.5, 0.5, int(seconds * 16000))
    audio = np.concatenate([(noise * 32767).astype(np.int16), np.zeros(int(0.6 * 16000), dtype=np.int16)])
    return [audio[i:i + 320].tobytes() for i in range(0, len(audio), 320)]


UNANSWERED_S = 15.0  # once stopped, the reply in flight must come within this (a fake reply takes well under 1 s)


class GoodCaller:
    """A well-behaved /ws caller on the fuzzed runtime: says something in real time, waits for the whole
    reply, again and again until stopped. Every reply must be complete and right, nothing an error, and
    the reply in flight when it is stopped must still come."""

    def __init__(self, runtime: Runtime) -> None:
        self.socket = FakeSocket()
        self.connection = native_call(self.socket, runtime)  # type: ignore[arg-type]
        self.replies: list[dict[str, Any]] = []
        self.stopped = asyncio.Event()
        self.unanswered = False  # the last utterance's reply did not come within UNANSWERED_S of the stop

    def events(self) -> Iterator[dict[str, Any]]:
        return (json.loads(m) for m in list(self.socket.sent) if isinstance(m, str))

    async def say(self, frames: list[bytes]) -> None:
        """One 20 ms frame every 20 ms, as a caller's microphone sends them."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i, frame in enumerate(frames):
            self.socket.audio(frame)
            await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - loop.time()))

    async def talk(self) -> None:
        loop = asyncio.get_running_loop()
        runner = asyncio.create_task(self.connection.run())
        self.socket.text(START)
        while not self.stopped.is_set():
            await self.say(utterance())
            want = len(self.replies) + 1
            give_up: float | None = None  # once stopped: the reply in flight gets UNANSWERED_S
            while len(self.replies) < want and not runner.done():
                if self.stopped.is_set():
                    give_up = give_up or loop.time() + UNANSWERED_S
                    if loop.time() > give_up:
                        self.unanswered = True
                        break
                await asyncio.sleep(0.02)
                self.replies = [e for e in self.events() if e["type"] == "response.done"]
        self.socket.inbox.put_nowait({"type": "websocket.disconnect"})
        await asyncio.wait_for(runner, 10)

    def check(self) -> None:
        errors = [e for e in self.events() if e["type"] == "error"]
        assert not errors, errors
        assert self.replies, "the well-behaved caller got no reply"
        assert not self.unanswered, f"the last utterance got no reply within {UNANSWERED_S:g} s of the fuzzing's end"
        for reply in self.replies:
            assert reply["status"] == "completed" and reply["text"] == REPLY, reply


def error_codes(sent: list[Any]) -> list[str]:
    """The codes of the `error` events among what a fake socket was sent (each must have one)."""
    codes = []
    for message in sent:
        if isinstance(message, str):
            event = json.loads(message)
            assert isinstance(event.get("type"), str), event
            if event["type"] == "error":
                assert isinstance(event.get("code"), str) and event["code"], event
                assert isinstance(event.get("message"), str) and event["message"], event
                codes.append(event["code"])
    return codes
