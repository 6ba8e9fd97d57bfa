"""Tool calls end to end: real models (Qwen2.5-Coder-1.5B-Instruct, Q4_K_M, llm.tools_model's default),
real sockets, real spoken audio. A spoken booking request reaches a real HTTP tool (a small server
this test starts, declared in a tools file) with the right arguments, and the answer is spoken from
its result; a client's own tool is asked over /ws and answered with function_call.output."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from app.client import VoiceClient
from tests.e2e.conftest import Server, start_server, stop_server
from tests.speech import speech_samples

pytestmark = pytest.mark.slow
BOOKING = {"type": "object", "properties": {"party_size": {"type": "integer", "description": "how many people"},
                                            "time": {"type": "string", "description": "24-hour time, HH:MM"}},
           "required": ["party_size", "time"]}
SEEN: list[dict] = []


async def book(request: web.Request) -> web.Response:
    body = await request.json()
    SEEN.append({"body": body, "key": request.headers.get("X-Api-Key")})
    return web.json_response({"booked": True, "party_size": body["party_size"], "time": body["time"],
                              "confirmation": "B-7731"})


@pytest.fixture(scope="module")
def tool_port() -> Iterator[int]:
    """The restaurant's booking API: a real HTTP server in a thread of its own."""
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/book", book)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield port
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory: pytest.TempPathFactory, tool_port: int) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("tools")
    tools = tmp / "tools.json"
    tools.write_text(json.dumps({"tools": [{
        "name": "book_table", "description": "Book a table at the restaurant.",
        "url": f"http://127.0.0.1:{tool_port}/book", "method": "POST", "headers": {"X-Api-Key": "${BOOKING_KEY}"},
        "parameters": BOOKING}]}))
    # the defaults: llm.model (the 0.5B) for calls without tools, llm.tools_model (the 1.5B) for these
    server, proc = start_server(tmp, {"VOICE_AGENT_TOOLS__FILE": str(tools), "BOOKING_KEY": "k-123"})
    yield server
    stop_server(proc)


async def call(server: Server, question: str, tmp: Path, **start: object) -> VoiceClient:
    client = VoiceClient(server.ws_url)
    started = await client.connect(**start)
    assert started["type"] == "session.started", started
    await client.stream(speech_samples(question, tmp))
    trailing = asyncio.create_task(client.silence(40))
    try:
        await client.wait_for(lambda e: e["type"] == "response.done" and e["status"] != "tool_calls"
                              and not e.get("filler"), 120)
    finally:
        trailing.cancel()
    return client


async def test_a_spoken_booking_reaches_the_http_tool_and_the_answer_comes_from_its_result(
        tool_server: Server, tmp_path: Path) -> None:
    client = await call(tool_server, "Can you book a table for two people at seven tonight?", tmp_path)
    await client.close()
    assert len(SEEN) == 1, SEEN  # run once
    body = SEEN[0]["body"]
    assert body["party_size"] == 2 and body["time"].split(":")[0] in ("19", "7", "07"), body
    assert SEEN[0]["key"] == "k-123"  # the secret from the environment
    dones = client.events("response.done")
    assert dones[0]["status"] == "tool_calls" and dones[0]["tool_calls"][0]["name"] == "book_table"
    answer = dones[-1]
    assert answer["status"] == "completed" and answer["tool_calls"][0]["output"]
    assert "tool_dispatched" in answer["latency_ms"] and "answer_first_audio_sent" in answer["latency_ms"]
    assert client.audio_between(0)  # spoken, not only written
    for _ in range(50):  # the turn's record (and its metrics) follows its response.done
        metrics = httpx.get(tool_server.base_url + "/metrics", timeout=5).text
        if 'voice_agent_tool_call_seconds_count{tool="book_table"} 1.0' in metrics:
            break
        await asyncio.sleep(0.1)
    assert 'voice_agent_tool_call_seconds_count{tool="book_table"} 1.0' in metrics
    assert 'voice_agent_tool_call_errors_total{tool="book_table"}' not in metrics


async def test_a_clients_own_tool_is_asked_over_the_socket(tool_server: Server, tmp_path: Path) -> None:
    asked: list[tuple[str, dict]] = []

    def lookup(name: str, arguments: dict) -> dict:
        asked.append((name, arguments))
        return {"order_number": arguments.get("order_number"), "status": "shipped", "shipped_on": "Monday"}

    client = VoiceClient(tool_server.ws_url, tool_handler=lookup)
    # "required": whether the 1.5B calls on its own is bench/tool_calls.py's question; this is the protocol's
    started = await client.connect(tool_choice="required", tools=[{
        "type": "function", "name": "order_status", "description": "Look up where an order is, by its number.",
        "parameters": {"type": "object", "properties": {"order_number": {"type": "string"}},
                       "required": ["order_number"]}}])
    assert started["type"] == "session.started", started
    await client.stream(speech_samples("Where is my order number four five one two?", tmp_path))
    trailing = asyncio.create_task(client.silence(40))
    try:
        await client.wait_for(lambda e: e["type"] == "response.done" and e["status"] == "completed"
                              and not e.get("filler"), 120)
    finally:
        trailing.cancel()
    await client.close()
    said = [(e["type"], e.get("text")) for e in client.events() if e["type"] in ("transcript.final", "response.done")]
    assert [name for name, _ in asked] == ["order_status"], said
    assert asked[0][1]["order_number"].replace(" ", "") == "4512", said
    assert client.events("response.function_call")[0]["name"] == "order_status"


async def test_bad_tools_in_session_start_are_refused_with_the_reason(tool_server: Server) -> None:
    client = VoiceClient(tool_server.ws_url)
    answer = await client.connect(tools=[{"type": "function", "name": "x", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "(?=a)b"}}}}])
    assert answer["type"] == "error" and answer["code"] == "invalid_tools" and "lookarounds" in answer["message"]
    await client.close()


def test_the_server_serves_calls_with_tools_with_the_tools_model(tool_server: Server) -> None:
    models = httpx.get(tool_server.base_url + "/v1/models", timeout=5).json()["data"]
    assert [m["id"] for m in models] == ["qwen2.5-coder-0.5b-instruct-q4_k_m", "qwen2.5-coder-1.5b-instruct-q4_k_m"]
