"""Fault injection, shared by tests/app/test_faults.py (which checks each outcome) and
bench/faults.py (which times it). A call runs in-process through the real transport (native_call
over a fake socket), the real session, the real OpenAI-compatible LLM backend talking HTTP to a
scripted LLM server (FakeLLMServer), and the real call store (SQLite); the VAD, ASR and TTS are
fakes (named as fakes), some of which raise on cue.

Each scenario: the caller says something and the fault strikes that turn; then the caller speaks
again and must get a good reply (the fault is gone by then). Times are from the end of the
caller's speech."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from app.runtime import Runtime
from app.settings import ServerConfig, Settings
from app.store.config import StorageConfig
from app.transports.native.wire import native_call
from core.clock import MonotonicClock
from core.errors import EngineError
from models.config import LlmConfig
from models.llm.llm_openai import OpenAIChatLLM
from models.protocols import Audio
from pipeline.config import AsrStageConfig, EndpointingConfig, SessionConfig
from pipeline.session import Backends
from tests.app.fake_server import FakeEchoRecognizer
from tests.app.test_ws_edges import FakeSocket
from tests.fuzz.harness import START, utterance
from tests.models.test_llm_openai import SSE_HEAD, Exchange, FakeLLMServer, delta, http_answer

GOOD_REPLY = "Hi there. All is well."
READ_TIMEOUT_S = 1.0  # llm.read_timeout_s here: how long a silent LLM server is waited for


class FakeFlakyRecognizer(FakeEchoRecognizer):
    """Raises, as an ASR backend does at its boundary, while `failing`."""

    failing = False

    def transcribe(self, audio: Audio, beam_size: int | None = None) -> str:
        if self.failing:
            raise EngineError("the ASR model failed (injected)")
        return super().transcribe(audio, beam_size)


class FakeFlakySynthesizer:
    """0.1 s of tone per word at 8 kHz; raises while `failing`."""

    name = "fake"
    sample_rate = 8000
    failing = False

    def synthesize(self, text: str) -> Iterator[Audio]:
        from tests.pipeline.fakes import FakeSynthesizer

        if self.failing:
            raise EngineError("the TTS model failed (injected)")
        yield from FakeSynthesizer().synthesize(text)


@dataclass
class Fault:
    """What the scripted LLM server does while the fault is on (None: it answers well)."""

    name: str
    what: str
    llm: Callable[[Exchange], Awaitable[None]] | None = None
    asr_fails: bool = False
    tts_fails: bool = False
    caller: str = ""  # "vanishes" or "stops_reading" mid-reply
    expect: str = "apology"  # apology | error | slow_reply | dropped


async def good_answer(ex: Exchange) -> None:
    words = GOOD_REPLY.split(" ")
    await ex.send(SSE_HEAD, delta(role=True), *(delta(w if i == 0 else " " + w) for i, w in enumerate(words)),
                  delta(finish="stop"), b"data: [DONE]\n\n")


async def refuse(ex: Exchange) -> None:
    ex.writer.transport.abort()  # connection reset: as close to "refused" as a listening port gets


async def stall(ex: Exchange) -> None:
    await ex.stall()


async def stall_mid_reply(ex: Exchange) -> None:
    await ex.send(SSE_HEAD, delta(role=True), delta("Well, let me see."), delta(" The answer"))
    await ex.stall()


async def status_500(ex: Exchange) -> None:
    await ex.send(http_answer(500, json.dumps({"error": {"message": "internal error (injected)"}})))


async def status_429(ex: Exchange) -> None:
    await ex.send(http_answer(429, json.dumps({"error": {"message": "too many requests (injected)"}})))


async def slow_tokens(ex: Exchange) -> None:
    await ex.send(SSE_HEAD, delta(role=True))
    for i, word in enumerate(GOOD_REPLY.split(" ")):
        await asyncio.sleep(0.4)
        await ex.send(delta(word if i == 0 else " " + word))
    await ex.send(delta(finish="stop"), b"data: [DONE]\n\n")


FAULTS = [
    Fault("llm_refuses", "the LLM server resets every connection", llm=refuse),
    Fault("llm_stalls_before_first_token", "the LLM server accepts the request and sends nothing", llm=stall),
    Fault("llm_stalls_mid_reply", "the LLM server sends a sentence, then nothing", llm=stall_mid_reply,
          expect="error"),
    Fault("llm_500", "the LLM server answers 500", llm=status_500),
    Fault("llm_429", "the LLM server answers 429", llm=status_429),
    Fault("llm_slow_tokens", "the LLM server sends a word every 0.4 s", llm=slow_tokens, expect="slow_reply"),
    Fault("asr_raises", "the speech recognizer raises", asr_fails=True, expect="error"),
    Fault("tts_raises", "the synthesizer raises", tts_fails=True, expect="error"),
    Fault("client_vanishes", "the caller's socket disconnects mid-reply", caller="vanishes", expect="dropped"),
    Fault("client_stops_reading", "the caller stops reading mid-reply", caller="stops_reading", expect="dropped"),
]


@dataclass
class Outcome:
    fault: str
    error_code: str | None = None  # the error event the caller got, if any
    error_message: str | None = None  # its message (a plain one: never the engine's own text)
    error_s: float | None = None  # end of speech -> error event
    first_audio_s: float | None = None  # end of speech -> the first audio heard (the apology, or the reply)
    first_status: str | None = None  # the faulty turn's response.done status
    ended_s: float | None = None  # vanished/stopped caller: the fault -> the call ended and its slot freed
    next_good_s: float | None = None  # the fault turn's end of speech -> the next good reply's first audio
    next_reply: str | None = None
    server_up: bool = True
    attempts: int = 0  # requests the LLM server got while the fault was on
    order: list[str] = field(default_factory=list)  # the faulty turn's events and audio, in the order sent
    kept_turns: int = 0  # turns in the call store for the faulty call
    sent_turns: int = 0  # response.done events sent on it
    end_reason: str | None = None
    stored_errors: list[str] = field(default_factory=list)  # the turns' errors in the call store (the detail)
    llm_url: str = ""  # the scripted LLM server's base URL (which the caller must never be shown)
    notes: list[str] = field(default_factory=list)


class Caller:
    """The caller's side of a fake socket, with the time each event and audio arrived."""

    def __init__(self, runtime: Runtime) -> None:
        self.socket = FakeSocket()
        self.connection = native_call(self.socket, runtime)  # type: ignore[arg-type]
        self.task = asyncio.create_task(self.connection.run())
        self.seen: list[tuple[float, Any]] = []
        self.socket.text(START)

    def collect(self) -> None:
        while len(self.seen) < len(self.socket.sent):
            item = self.socket.sent[len(self.seen)]
            self.seen.append((time.monotonic(), json.loads(item) if isinstance(item, str) else item))

    def speak(self) -> float:
        for frame in utterance(0.4):
            self.socket.audio(frame)
        return time.monotonic()

    async def until(self, predicate: Callable[[Any], bool], after: int = 0, timeout: float = 15) -> tuple[float, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.collect()
            for at, item in self.seen[after:]:
                if predicate(item):
                    return at, item
            if self.task.done():
                break
            await asyncio.sleep(0.005)
        raise TimeoutError("the caller never got what it waited for")


def is_event(kind: str) -> Callable[[Any], bool]:
    return lambda item: isinstance(item, dict) and item.get("type") == kind


def is_audio(item: Any) -> bool:
    return isinstance(item, bytes)


async def run_fault(fault: Fault) -> Outcome:
    """One scenario, start to end, on a fresh runtime; never raises for the fault itself."""
    on = {"fault": True}

    async def script(ex: Exchange, n: int) -> None:
        if on["fault"] and fault.llm is not None:
            out.attempts += 1
            await fault.llm(ex)
        else:
            await good_answer(ex)

    out = Outcome(fault.name)
    async with FakeLLMServer(script).running() as llm_server:
        out.llm_url = llm_server.base_url
        with tempfile.TemporaryDirectory() as tmp:
            runtime = await make_runtime(llm_server.base_url, tmp)
            asr, tts = runtime.backends.asr, runtime.backends.tts  # type: ignore[union-attr]
            asr.failing, tts.failing = fault.asr_fails, fault.tts_fails  # type: ignore[union-attr]
            try:
                await play(fault, runtime, on, out)
            finally:
                await runtime.aclose()
    return out


async def make_runtime(base_url: str, data_dir: str) -> Runtime:
    settings = Settings(
        server=ServerConfig(send_timeout_s=1.0),
        endpointing=EndpointingConfig(min_speech_ms=64, end_silence_ms=256, prefix_padding_ms=100),
        asr_stage=AsrStageConfig(partials=False),
        session=SessionConfig(output_chunk_ms=20, output_lead_ms=0, preemptive=False),
        storage=StorageConfig(data_dir=data_dir),
    )
    llm = OpenAIChatLLM(LlmConfig(engine="openai", base_url=base_url, remote_model="m",
                                  read_timeout_s=READ_TIMEOUT_S), MonotonicClock())
    from tests.pipeline.fakes import FakeVad

    backends = Backends(FakeVad(), FakeFlakyRecognizer(), FakeFlakySynthesizer(), llm)  # type: ignore[arg-type]
    runtime = Runtime(settings, MonotonicClock(), backends=backends)
    runtime.ready.set()
    await runtime.open_store()
    return runtime


async def play(fault: Fault, runtime: Runtime, on: dict[str, bool], out: Outcome) -> None:
    caller = Caller(runtime)
    spoke = caller.speak()
    if fault.caller:
        at, _ = await caller.until(is_audio)
        if fault.caller == "vanishes":
            caller.socket.inbox.put_nowait({"type": "websocket.disconnect"})
        else:
            caller.socket.reading = False
        await asyncio.wait_for(caller.task, 10)
        out.ended_s = time.monotonic() - at
        out.end_reason = caller.connection.end_reason
        await check_records(runtime, caller, out)
        caller = Caller(runtime)  # a new caller after the one who left
        spoke = at
    else:
        await first_turn(fault, caller, spoke, out)
    on["fault"] = False
    asr, tts = runtime.backends.asr, runtime.backends.tts  # type: ignore[union-attr]
    asr.failing = tts.failing = False  # type: ignore[union-attr]
    mark = len(caller.seen)
    caller.speak()
    _, _ = await caller.until(is_audio, after=mark)
    out.next_good_s = time.monotonic() - spoke
    _, done = await caller.until(is_event("response.done"), after=mark)
    out.next_reply = done["text"]
    caller.socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(caller.task, 10)
    out.server_up = runtime.ready.is_set() and not runtime.sessions
    if not fault.caller:
        out.end_reason = caller.connection.end_reason
        await check_records(runtime, caller, out)


async def first_turn(fault: Fault, caller: Caller, spoke: float, out: Outcome) -> None:
    if fault.asr_fails:  # no transcript, so no reply: the error is all there is
        await caller.until(is_event("error"), timeout=20)
    else:
        _, done = await caller.until(is_event("response.done"), timeout=20)
        out.first_status = done["status"]
    caller.collect()
    errors = [(at, e) for at, e in caller.seen if is_event("error")(e)]
    if errors:
        out.error_s = errors[0][0] - spoke
        out.error_code = errors[0][1]["code"]
        out.error_message = errors[0][1]["message"]
    audio = [at for at, e in caller.seen if is_audio(e)]
    if audio:
        out.first_audio_s = audio[0] - spoke
    out.order = ["audio" if is_audio(e) else e.get("type", "?") if isinstance(e, dict) else "?" for _, e in caller.seen]


async def check_records(runtime: Runtime, caller: Caller, out: Outcome) -> None:
    assert runtime.store is not None
    await runtime.store.flush()
    found = await runtime.store.get_call(caller.connection.session_id)
    caller.collect()
    out.sent_turns = sum(1 for _, e in caller.seen if is_event("response.done")(e))
    if found is None:
        out.notes.append("the call is not in the store")
        return
    call, turns = found
    out.kept_turns = len(turns)
    out.stored_errors = [turn.error for turn in turns if turn.error]
    if call.end_reason != out.end_reason:
        out.notes.append(f"stored end reason {call.end_reason!r}, expected {out.end_reason!r}")
