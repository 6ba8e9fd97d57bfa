"""What clients are told of a failure on the server's side (docs/security.md): a stable code and a
plain message that says what to do, never the error's own text (the LLM server's URL, model paths,
an engine's exception), which goes to the log and the call's record. The client's own mistakes (a
prompt over the context, a bad field) are still said as they are. Fake engines (named as fakes),
one of which fails on cue; the spoken path through the real transport is in tests/app/test_faults.py."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.main import create_app
from app.runtime import Runtime
from app.settings import Settings
from app.store.config import StorageConfig
from app.transports.realtime.wire import realtime_call
from core.clock import MonotonicClock
from core.errors import ContextLengthError, EngineError, LLMUnavailableError, VoiceAgentError, plain_message
from models.protocols import ChatMessage, LLMOutput, SamplingParams, TextDelta
from pipeline.session import Backends
from tests.app.test_realtime_wire import AcceptingFakeSocket, until
from tests.pipeline.fakes import FakeConversation, FakeLLM, FakeRecognizer, FakeSynthesizer, FakeVad

INSIDE_URL = "http://vllm:8000/v1"
UNREACHABLE = LLMUnavailableError(f"cannot connect to the LLM server at {INSIDE_URL} (ConnectError: [Errno 111] "
                                  "Connection refused); is it running?")
CHAT = {"messages": [{"role": "user", "content": "What is the capital of France?"}]}


class FakeFailingConversation(FakeConversation):
    """Says `llm.words` words, then raises `llm.error`."""

    llm: FakeFailingLLM

    async def stream(self, messages: Sequence[ChatMessage], params: SamplingParams,
                     tools: Any = None) -> AsyncIterator[LLMOutput]:
        self.llm.requests.append(list(messages))
        for i in range(self.llm.words):
            await asyncio.sleep(0.001)
            yield TextDelta("Well" if i == 0 else " well")
        raise self.llm.error


class FakeFailingLLM(FakeLLM):
    def __init__(self, error: VoiceAgentError, words: int = 0) -> None:
        super().__init__([])
        self.error = error
        self.words = words

    def conversation(self, context_tokens: int | None = None) -> FakeFailingConversation:
        return FakeFailingConversation(self)


def backends(llm: FakeLLM) -> Backends:
    return Backends(FakeVad(), FakeRecognizer([]), FakeSynthesizer(), llm)  # type: ignore[arg-type]


def app_with(llm: FakeLLM) -> FastAPI:
    app = create_app(Settings(storage=StorageConfig(enabled=False)), backends=backends(llm))
    app.state.runtime.ready.set()  # as the lifespan does once the models are in
    return app


def client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")


def server_log(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records)


# -- /v1 --------------------------------------------------------------------------------------------

async def test_a_v1_server_error_says_the_code_and_what_to_do_and_logs_the_detail(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    async with client(app_with(FakeFailingLLM(UNREACHABLE))) as http:
        reply = await http.post("/v1/chat/completions", json=CHAT)
    assert reply.status_code == 502, reply.text
    error = reply.json()["error"]
    assert error["code"] == "llm_unavailable" and error["type"] == "server_error"
    assert error["message"].startswith(plain_message("llm_unavailable")) and "chatcmpl-" in error["message"]
    assert INSIDE_URL not in reply.text and "Connection refused" not in reply.text and "Errno" not in reply.text
    assert INSIDE_URL in server_log(caplog) and "Connection refused" in server_log(caplog)
    request_id = error["message"].rsplit("request ", 1)[1].rstrip(")")
    assert request_id in server_log(caplog)  # the message names the log line that says more


async def test_a_v1_engine_failure_that_is_not_retryable_is_a_500_said_plainly(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    broken = EngineError("qwen2.5-7b: forward pass failed: CUDA error: an illegal memory access at /opt/models/x.gguf")
    async with client(app_with(FakeFailingLLM(broken))) as http:
        reply = await http.post("/v1/chat/completions", json=CHAT)
    assert reply.status_code == 500 and reply.json()["error"]["code"] == "engine_error"
    assert "CUDA" not in reply.text and "/opt/models" not in reply.text
    assert "/opt/models" in server_log(caplog)


async def test_a_v1_stream_that_fails_midway_ends_with_a_plain_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    async with client(app_with(FakeFailingLLM(UNREACHABLE, words=3))) as http:
        reply = await http.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert reply.status_code == 200  # the stream had begun
    chunks = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: {")]
    error = chunks[-1]["error"]
    assert error["code"] == "llm_unavailable" and error["message"].startswith(plain_message("llm_unavailable"))
    assert INSIDE_URL not in reply.text and "Connection refused" not in reply.text
    assert INSIDE_URL in server_log(caplog)


async def test_a_v1_stream_that_fails_before_its_first_token_gets_the_status_and_the_plain_message() -> None:
    async with client(app_with(FakeFailingLLM(UNREACHABLE))) as http:
        reply = await http.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert reply.status_code == 502 and reply.json()["error"]["code"] == "llm_unavailable"
    assert INSIDE_URL not in reply.text


async def test_the_client_s_own_mistakes_are_still_said_as_they_are() -> None:
    too_long = ContextLengthError("the prompt has 9000 tokens; this conversation holds 8192 (llm.api_context_tokens)")
    async with client(app_with(FakeFailingLLM(too_long))) as http:
        reply = await http.post("/v1/chat/completions", json=CHAT)
        assert reply.status_code == 400 and "9000 tokens" in reply.json()["error"]["message"]
        bad = await http.post("/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "hi"}]})
        assert bad.status_code == 400 and "messages.0.role" in bad.json()["error"]["message"]


# -- a call (/v1/realtime; the native socket in tests/app/test_faults.py) -------------------------

async def test_a_realtime_reply_that_fails_tells_the_code_and_a_plain_message(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    runtime = Runtime(Settings(storage=StorageConfig(enabled=False)), MonotonicClock(),
                      backends=backends(FakeFailingLLM(UNREACHABLE)))
    runtime.ready.set()
    socket = AcceptingFakeSocket()
    call = realtime_call(socket, runtime, False, "gpt-realtime")  # type: ignore[arg-type]
    task = asyncio.create_task(call.serve())
    socket.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Capital of France?"}]})
    socket.send(type="response.create")
    done = await until(socket, "response.done")
    error = await until(socket, "error")
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(task, 5)
    assert error["error"]["code"] == "llm_unavailable"
    assert error["error"]["message"] == f"the reply failed: {plain_message('llm_unavailable')}"
    assert done["response"]["status"] == "failed"
    assert done["response"]["status_details"]["error"] == {"type": "server_error", "code": "llm_unavailable"}
    sent = json.dumps(socket.events())
    assert INSIDE_URL not in sent and "Connection refused" not in sent
    assert INSIDE_URL in server_log(caplog)
