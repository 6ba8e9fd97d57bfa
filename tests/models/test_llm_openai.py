"""The OpenAI-compatible LLM client (models/llm/llm_openai.py), over real sockets.

- Against the project's own server (`voice-agent serve`, real models; slow): a streamed reply, and
  cancellation mid-stream that the server sees as a disconnect and counts as aborted.
- Against fake servers (real asyncio HTTP servers on free ports whose answers are scripted): down,
  stalled before the first byte (retried), stalled or broken after the first token (not retried),
  HTTP errors, malformed events, and the request/usage mapping.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from core.clock import MonotonicClock
from core.errors import EngineError, LLMUnavailableError
from models.config import LlmConfig
from models.llm.llm_openai import OpenAIChatLLM
from models.protocols import ChatMessage, GenerationDone, LLMOutput, SamplingParams, TextDelta
from tests.e2e.conftest import Server, start_server, stop_server

MESSAGES = [ChatMessage("system", "You are a helpful assistant. Answer briefly."),
            ChatMessage("user", "What is the capital of France?")]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SleepLog(MonotonicClock):
    """The real clock, with every wait the client asks of it written down: a test checks the waits
    it chose (a retry's backoff), not how long the machine took."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        await super().sleep(seconds)


def make_llm(base_url: str, **settings: Any) -> OpenAIChatLLM:
    config = LlmConfig(engine="openai", base_url=base_url, **{"remote_model": "m", **settings})
    return OpenAIChatLLM(config, SleepLog())


def slept(llm: OpenAIChatLLM) -> list[float]:
    assert isinstance(llm.clock, SleepLog)
    return llm.clock.slept


async def collect(llm: OpenAIChatLLM, messages: list[ChatMessage] = MESSAGES,
                  params: SamplingParams = GREEDY, into: list[LLMOutput] | None = None) -> list[LLMOutput]:
    outputs: list[LLMOutput] = [] if into is None else into
    async for output in llm.conversation().stream(messages, params):
        outputs.append(output)
    return outputs


# -- fake servers --------------------------------------------------------------------------------------------


@dataclass
class Exchange:
    """One request to a FakeLLMServer and the means to answer it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    client_closed: bool = False

    def json(self) -> Any:
        return json.loads(self.body)

    async def send(self, *parts: bytes) -> None:
        self.writer.write(b"".join(parts))
        await self.writer.drain()

    async def stall(self) -> None:
        """Send nothing more; return when the client closes the connection."""
        while await self.reader.read(1024):
            pass
        self.client_closed = True


SSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
            b"connection: close\r\n\r\n")
DONE = b"data: [DONE]\n\n"


def event(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


def delta(content: str | None = None, finish: str | None = None, role: bool = False) -> bytes:
    d: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
    if content is not None:
        d["content"] = content
    return event({"id": "c1", "object": "chat.completion.chunk", "model": "m",
                  "choices": [{"index": 0, "delta": d, "finish_reason": finish}]})


def usage_chunk(**usage: Any) -> bytes:
    return event({"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [], "usage": usage})


def http_answer(status: int, body: str, kind: str = "application/json") -> bytes:
    data = body.encode()
    return (f"HTTP/1.1 {status} X\r\ncontent-type: {kind}\r\ncontent-length: {len(data)}\r\n"
            "connection: close\r\n\r\n").encode() + data


async def whole_reply(ex: Exchange) -> None:
    await ex.send(SSE_HEAD, delta(role=True), delta("Hi"), delta(" there."), delta(finish="stop"),
                  usage_chunk(prompt_tokens=12, completion_tokens=3, total_tokens=15), DONE)


Script = Callable[[Exchange, int], Awaitable[None]]


@dataclass
class FakeLLMServer:
    """A fake OpenAI-compatible server: a real asyncio HTTP/1.1 server on a free port; `script`
    answers each request (given its 1-based number) however a test needs: stall, break off, send
    garbage. Every exchange is kept for the test to inspect."""

    script: Script
    exchanges: list[Exchange] = field(default_factory=list)
    port: int = 0
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            request_line, *lines = head.split("\r\n")
            method, path, _ = request_line.split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines if h)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            exchange = Exchange(method, path, headers, body, reader, writer)
            self.exchanges.append(exchange)
            await self.script(exchange, len(self.exchanges))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self._tasks.discard(task)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[FakeLLMServer]:
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def posts(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.method == "POST"]


async def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(0.02)
    return condition()


# -- down, stalled, broken -----------------------------------------------------------------------------------


@pytest.mark.parametrize("remote_model", ["m", ""])
async def test_server_down_fails_fast_naming_the_url(remote_model: str) -> None:
    """Nothing listens on the port (with remote_model empty, the failing call is GET /models)."""
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    llm = make_llm(base_url, remote_model=remote_model, retry_backoff_s=0.1)
    with pytest.raises(LLMUnavailableError) as caught:
        await collect(llm)
    assert sum(slept(llm)) <= 0.1  # refused at once: one retry after its backoff at most, no timeout waited out
    assert base_url in str(caught.value) and "cannot connect" in str(caught.value)
    assert "llm.base_url" in str(caught.value) and caught.value.retryable
    await llm.aclose()


async def test_stall_after_the_first_token_raises_after_read_timeout_without_retry() -> None:
    async def script(ex: Exchange, n: int) -> None:
        await ex.send(SSE_HEAD, delta(role=True), delta("Hello"))
        await ex.stall()

    fake = FakeLLMServer(script)
    async with fake.running():
        llm = make_llm(fake.base_url, read_timeout_s=0.5, retries_before_first_token=2)
        outputs: list[LLMOutput] = []
        with pytest.raises(LLMUnavailableError) as caught:
            await asyncio.wait_for(collect(llm, into=outputs), 30)  # (a test that would hang fails instead)
        assert outputs == [TextDelta("Hello")]
        assert "stalled" in str(caught.value) and "0.5 s" in str(caught.value) and fake.base_url in str(caught.value)
        assert len(fake.posts()) == 1 and slept(llm) == []  # words were out: no retry
        assert await wait_until(lambda: fake.exchanges[0].client_closed)  # the client hung up
        await llm.aclose()


async def test_stall_before_the_first_byte_is_retried() -> None:
    async def script(ex: Exchange, n: int) -> None:
        if n == 1:
            await ex.stall()  # not even the response headers
        else:
            await whole_reply(ex)

    fake = FakeLLMServer(script)
    async with fake.running():
        llm = make_llm(fake.base_url, read_timeout_s=0.5, retries_before_first_token=1)
        outputs = await collect(llm)
        assert outputs[:-1] == [TextDelta("Hi"), TextDelta(" there.")]
        done = outputs[-1]
        assert isinstance(done, GenerationDone)
        assert done.stats.completion_tokens == 3 and done.stats.prompt_tokens == 12
        assert done.stats.time_to_first_token_ms >= 450  # the caller waited through the failed try
        assert len(fake.posts()) == 2 and fake.posts()[0].body == fake.posts()[1].body
        assert await wait_until(lambda: fake.exchanges[0].client_closed)

        # with no retries allowed, the same stall is an error
        fake.exchanges.clear()
        no_retry = make_llm(fake.base_url, read_timeout_s=0.5, retries_before_first_token=0)
        with pytest.raises(LLMUnavailableError, match="stalled"):
            await collect(no_retry)
        assert len(fake.posts()) == 1
        await llm.aclose()
        await no_retry.aclose()


@pytest.mark.parametrize("failure", ["hang up", "error event"])
async def test_failure_after_the_first_token_is_not_retried(failure: str) -> None:
    async def script(ex: Exchange, n: int) -> None:
        await ex.send(SSE_HEAD, delta(role=True), delta("Hello"))
        if failure == "error event":
            await ex.send(event({"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}))
        ex.writer.transport.abort()

    fake = FakeLLMServer(script)
    async with fake.running():
        llm = make_llm(fake.base_url, retries_before_first_token=3)
        outputs: list[LLMOutput] = []
        with pytest.raises(LLMUnavailableError) as caught:
            await collect(llm, into=outputs)
        assert outputs == [TextDelta("Hello")]
        assert len(fake.posts()) == 1
        expected = "engine died" if failure == "error event" else "ended the stream before the reply was finished"
        assert expected in str(caught.value) and fake.base_url in str(caught.value)
        await llm.aclose()


async def test_keep_alive_comments_do_not_hide_a_stall() -> None:
    """Bytes keep coming (SSE comments), but no event: a stall all the same."""
    async def script(ex: Exchange, n: int) -> None:
        await ex.send(SSE_HEAD)
        while True:
            await ex.send(b": ping\n\n")
            await asyncio.sleep(0.1)

    fake = FakeLLMServer(script)
    async with fake.running():
        llm = make_llm(fake.base_url, read_timeout_s=0.5, retries_before_first_token=0)
        with pytest.raises(LLMUnavailableError, match=r"sent no event for 0\.5 s"):
            await asyncio.wait_for(collect(llm), 30)  # comments forever: a client they fooled would hang
        await llm.aclose()


async def test_http_errors_carry_the_status_and_the_servers_message() -> None:
    async def script(ex: Exchange, n: int) -> None:
        if ex.path.endswith("/overloaded/chat/completions"):
            await ex.send(http_answer(503, json.dumps({"error": {"message": "KV cache full, try later"}})))
        else:
            await ex.send(http_answer(404, json.dumps(
                {"object": "error", "message": "The model `m` does not exist.", "type": "NotFoundError", "code": 404})))

    fake = FakeLLMServer(script)
    async with fake.running():
        overloaded = make_llm(fake.base_url + "/overloaded", retries_before_first_token=1)
        with pytest.raises(LLMUnavailableError) as caught:
            await collect(overloaded)
        assert "503" in str(caught.value) and "KV cache full, try later" in str(caught.value)
        assert len(fake.posts()) == 2  # retryable, and nothing had been said

        fake.exchanges.clear()
        missing = make_llm(fake.base_url, retries_before_first_token=1)
        with pytest.raises(EngineError) as not_found:
            await collect(missing)
        assert not isinstance(not_found.value, LLMUnavailableError) and not not_found.value.retryable
        message = str(not_found.value)
        assert "404" in message and "The model `m` does not exist." in message and "llm.remote_model" in message
        assert len(fake.posts()) == 1  # not worth a retry
        await overloaded.aclose()
        await missing.aclose()


@pytest.mark.parametrize(("answer", "expected"), [
    (SSE_HEAD + b"data: {not json\n\n", "malformed event"),
    (SSE_HEAD + b'data: ["a list"]\n\n', "malformed event"),
    (SSE_HEAD + b'data: {"choices": [{"delta": {"content": 42}}]}\n\n', "malformed event"),
    (http_answer(200, "<html>hello</html>", "text/html"), "not a stream of server-sent events"),
])
async def test_malformed_streams(answer: bytes, expected: str) -> None:
    async def script(ex: Exchange, n: int) -> None:
        await ex.send(answer)

    fake = FakeLLMServer(script)
    async with fake.running():
        llm = make_llm(fake.base_url)
        with pytest.raises(EngineError) as caught:
            await collect(llm)
        assert expected in str(caught.value) and fake.base_url in str(caught.value)
        assert "unknown" not in str(caught.value)
        await llm.aclose()


# -- what is sent and what is read --------------------------------------------------------------------------


async def test_request_body_model_lookup_and_usage_mapping() -> None:
    async def script(ex: Exchange, n: int) -> None:
        if ex.method == "GET":
            await ex.send(http_answer(200, json.dumps({"object": "list", "data": [{"id": "served-7b"}]})))
        elif len(ex.json()["messages"]) == 1:  # vLLM style: usage in a last chunk of its own
            await ex.send(SSE_HEAD, delta(role=True), delta("One"), delta(" two", finish="length"),
                          usage_chunk(prompt_tokens=40, completion_tokens=2, total_tokens=42,
                                      prompt_tokens_details={"cached_tokens": 32}), DONE)
        else:  # this project's API: usage.speculative_decoding on the finishing chunk
            spec = {"method": "ngram", "prefill_tokens": 5, "drafts": 4, "draft_tokens": 12, "accepted_tokens": 9,
                    "accepted_per_position": [4, 3, 2], "k_chosen": [3, 3, 3, 3]}
            await ex.send(SSE_HEAD, delta("Yes."), event({
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 50, "completion_tokens": 14, "speculative_decoding": spec}}), DONE)

    fake = FakeLLMServer(script)
    async with fake.running():
        llm = make_llm(fake.base_url, remote_model="", api_key="secret")
        params = SamplingParams(temperature=0.3, top_p=0.9, top_k=20, max_tokens=7, seed=11)
        first = await collect(llm, [ChatMessage("user", "Count.")], params)
        assert first[:-1] == [TextDelta("One"), TextDelta(" two")]
        stats = first[-1].stats  # type: ignore[union-attr]
        assert (stats.prompt_tokens, stats.prefill_tokens, stats.completion_tokens, stats.finish_reason) == \
            (40, 8, 2, "length")
        assert stats.time_to_first_token_ms > 0 and stats.duration_ms >= stats.time_to_first_token_ms

        second = await collect(llm, [ChatMessage("system", "Be brief."), ChatMessage("user", "OK?")])
        spec_stats = second[-1].stats  # type: ignore[union-attr]
        assert (spec_stats.method, spec_stats.drafts, spec_stats.draft_tokens, spec_stats.accepted_tokens) == \
            ("ngram", 4, 12, 9)
        assert spec_stats.accepted_per_position == [4, 3, 2] and spec_stats.prefill_tokens == 5
        assert spec_stats.acceptance_rate == pytest.approx(0.75)

        assert [e.method for e in fake.exchanges] == ["GET", "POST", "POST"]  # /models asked once
        assert fake.exchanges[0].path == "/v1/models" and llm.name == "served-7b"
        post = fake.exchanges[1]
        assert post.path == "/v1/chat/completions" and post.headers["authorization"] == "Bearer secret"
        assert post.json() == {
            "model": "served-7b", "messages": [{"role": "user", "content": "Count."}], "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0.3, "top_p": 0.9, "top_k": 20,
            "max_tokens": 7, "seed": 11,
        }
        await llm.aclose()


async def test_priority_is_sent_only_when_enabled() -> None:
    """llm.send_priority: vLLM's `priority` field is the ms until the reply is due (0 when overdue);
    without the setting no field is sent (a vLLM without priority scheduling refuses one)."""
    async def script(ex: Exchange, n: int) -> None:
        await ex.send(SSE_HEAD, delta("Hi.", finish="stop"), DONE)

    fake = FakeLLMServer(script)
    async with fake.running():
        plain = make_llm(fake.base_url)
        conversation = plain.conversation()
        conversation.set_deadline(plain.clock.now() + 5.0)
        async for _ in conversation.stream(MESSAGES, GREEDY):
            pass
        ranked = make_llm(fake.base_url, send_priority=True, api_deadline_s=2.0)
        for due in (ranked.clock.now() + 5.0, ranked.clock.now() - 1.0, None):
            conversation = ranked.conversation()
            conversation.set_deadline(due)
            async for _ in conversation.stream(MESSAGES, GREEDY):
                pass
        bodies = [ex.json() for ex in fake.exchanges]
        assert "priority" not in bodies[0]
        assert 4000 < bodies[1]["priority"] <= 5000
        assert bodies[2]["priority"] == 0  # overdue: first
        assert bodies[3]["priority"] == 2000  # no deadline (a /v1 request): llm.api_deadline_s
        await plain.aclose()
        await ranked.aclose()


def test_warm_up_only_warns_when_the_server_is_down(caplog: pytest.LogCaptureFixture) -> None:
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    llm = make_llm(base_url, remote_model="")
    with caplog.at_level(logging.WARNING, logger="models.llm.llm_openai"):
        llm.warm_up()
    assert any(base_url in r.getMessage() and "not ready" in r.getMessage() for r in caplog.records)
    assert llm.model is None  # asked again on the first turn


# -- against the project's own server (real models) --------------------------------------------------------


@pytest.fixture(scope="module")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server, proc = start_server(tmp_path_factory.mktemp("llm-server"), timeout=480)  # slow on a busy machine
    yield server
    stop_server(proc)


def api_requests(server: Server) -> dict[str, float]:
    text = httpx.get(server.base_url + "/metrics", timeout=5).text
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "voice_agent_api_requests_total":
                counts[sample.labels["outcome"]] = sample.value
    return counts


@pytest.mark.slow
async def test_streams_a_reply_from_a_real_server(real_server: Server) -> None:
    llm = make_llm(real_server.base_url + "/v1", remote_model="", read_timeout_s=60)
    outputs = await collect(llm)
    deltas, done = outputs[:-1], outputs[-1]
    assert deltas and all(isinstance(d, TextDelta) and d.text for d in deltas)
    assert isinstance(done, GenerationDone)
    text = "".join(d.text for d in deltas if isinstance(d, TextDelta))
    assert "paris" in text.lower(), text
    stats = done.stats
    assert stats.completion_tokens > 0 and stats.prompt_tokens > 0
    assert stats.time_to_first_token_ms > 0 and stats.duration_ms >= stats.time_to_first_token_ms
    assert stats.finish_reason in ("stop", "length")
    assert llm.name == "qwen2.5-coder-0.5b-instruct-q4_k_m"  # asked GET /v1/models
    await llm.aclose()


LONG = [ChatMessage("user", "Tell me a long story about a dragon who learns to bake bread.")]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["close the iterator", "cancel the task"])
async def test_stopping_mid_stream_aborts_the_generation_on_the_server(real_server: Server, how: str) -> None:
    """Barge-in: the consumer stops after the first text; the server sees the disconnect."""
    llm = make_llm(real_server.base_url + "/v1", read_timeout_s=60, remote_model="qwen2.5-coder-0.5b-instruct-q4_k_m")
    before = api_requests(real_server)
    aborted_lines = real_server.log().count("client disconnected; generation aborted")
    params = SamplingParams(temperature=0.0, max_tokens=400)
    first_text = asyncio.Event()

    async def consume() -> None:
        async for output in llm.conversation().stream(LONG, params):
            if isinstance(output, TextDelta):
                first_text.set()
        raise AssertionError("the generation was not cut short")

    if how == "close the iterator":
        stream = llm.conversation().stream(LONG, params)
        first = await anext(stream)
        assert isinstance(first, TextDelta)
        await stream.aclose()  # type: ignore[attr-defined]
    else:
        task = asyncio.create_task(consume())
        await asyncio.wait_for(first_text.wait(), 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    def aborted() -> bool:
        return api_requests(real_server).get("aborted", 0) == before.get("aborted", 0) + 1

    assert await wait_until(aborted, timeout=15), api_requests(real_server)
    assert api_requests(real_server).get("completed", 0) == before.get("completed", 0)
    assert real_server.log().count("client disconnected; generation aborted") == aborted_lines + 1
    await llm.aclose()



@pytest.mark.parametrize(("headers", "waits"), [
    ("retry-after: 0.4\r\n", 0.4),  # the server says how long: honoured
    ("", 0.2),  # it does not: the backoff (llm.retry_backoff_s)
])
async def test_a_retry_waits_as_the_server_asks_or_backs_off(headers: str, waits: float) -> None:
    async def script(ex: Exchange, n: int) -> None:
        if n == 1:
            body = json.dumps({"error": {"message": "busy"}}).encode()
            await ex.send(f"HTTP/1.1 429 X\r\ncontent-type: application/json\r\n{headers}"
                          f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body)
        else:
            await whole_reply(ex)

    fake = FakeLLMServer(script)
    async with fake.running():
        llm = make_llm(fake.base_url, retries_before_first_token=1, retry_backoff_s=0.2)
        outputs = await collect(llm)
        await llm.aclose()
    assert isinstance(outputs[-1], GenerationDone) and len(fake.posts()) == 2
    assert slept(llm) == [waits]


async def test_a_server_that_asks_for_a_long_wait_is_not_retried() -> None:
    async def script(ex: Exchange, n: int) -> None:
        body = json.dumps({"error": {"message": "overloaded"}}).encode()
        await ex.send(b"HTTP/1.1 503 X\r\ncontent-type: application/json\r\nretry-after: 30\r\n"
                      + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body)

    fake = FakeLLMServer(script)
    async with fake.running():
        llm = make_llm(fake.base_url, retries_before_first_token=2, retry_max_wait_s=1.0)
        with pytest.raises(LLMUnavailableError) as caught:
            await collect(llm)
        await llm.aclose()
    assert caught.value.retry_after == 30 and len(fake.posts()) == 1
    assert slept(llm) == []  # the caller hears the apology now, not in 30 s


async def test_tools_are_sent_and_streamed_tool_call_deltas_become_whole_calls() -> None:
    """vLLM's shape (--enable-auto-tool-choice --tool-call-parser hermes): the id and name come first,
    the arguments in pieces, two calls by index; the reply finishes with "tool_calls"."""
    from models.llm.tool_calls import ToolCall, parse_tools
    from models.protocols import ToolCallOutput

    def call_delta(index: int, **function: str) -> bytes:
        piece: dict[str, Any] = {"index": index, "function": function}
        if "name" in function:
            piece |= {"id": f"chatcmpl-tool-{index}", "type": "function"}
        return event({"choices": [{"index": 0, "delta": {"tool_calls": [piece]}, "finish_reason": None}]})

    async def script(ex: Exchange, n: int) -> None:
        await ex.send(SSE_HEAD, delta(role=True), call_delta(0, name="order_status", arguments=""),
                      call_delta(0, arguments='{"order_'), call_delta(0, arguments='number": "4512"}'),
                      call_delta(1, name="order_status", arguments='{"order_number": "7"}'),
                      event({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}), DONE)

    tools = parse_tools([{"type": "function", "name": "order_status", "parameters": {
        "type": "object", "properties": {"order_number": {"type": "string"}}, "required": ["order_number"]}}],
        {"type": "function", "name": "order_status"}, parallel=True)
    fake = FakeLLMServer(script)
    async with fake.running():
        llm = make_llm(fake.base_url)
        history = [ChatMessage("user", "Where are 4512 and 7?"),
                   ChatMessage("assistant", "", (ToolCall("c0", "order_status", '{"order_number": "1"}'),)),
                   ChatMessage("tool", '{"status": "lost"}', tool_call_id="c0")]
        outputs = [o async for o in llm.conversation().stream(history, GREEDY, tools)]
        await llm.aclose()
    calls = [o.call for o in outputs if isinstance(o, ToolCallOutput)]
    assert [(c.call_id, c.name, c.arguments) for c in calls] == [
        ("chatcmpl-tool-0", "order_status", '{"order_number": "4512"}'),
        ("chatcmpl-tool-1", "order_status", '{"order_number": "7"}')]
    assert outputs[-1].stats.finish_reason == "tool_calls"  # type: ignore[union-attr]
    body = fake.exchanges[-1].json()
    assert body["tools"][0]["function"]["name"] == "order_status" and body["parallel_tool_calls"] is True
    assert body["tool_choice"] == {"type": "function", "function": {"name": "order_status"}}
    assert body["messages"][1]["tool_calls"][0]["function"] == {"name": "order_status",
                                                                "arguments": '{"order_number": "1"}'}
    assert body["messages"][2] == {"role": "tool", "content": '{"status": "lost"}', "tool_call_id": "c0"}
