"""With server.log_caller_content at its default ("redacted"), the session's log lines say that the
caller pressed keys, spoke over the bot or had a tool called, and how much, never what: the
conversation itself still has all of it. Fake engines (tests/pipeline/fakes.py), a real HTTP tool."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp import web

from core.private import set_caller_content
from models.llm.tool_calls import Tool, ToolCall
from pipeline.config import ToolsConfig
from pipeline.session.barge_in import BargeIn
from pipeline.tools import HttpTool, ToolBox
from tests.http_server import served
from tests.pipeline.fakes import FakeLLM
from tests.pipeline.test_dtmf import keypad_session
from tests.pipeline.test_session import done_events, make_session, remade, speak

PIN = "4719"
BOOK = Tool("book_table", "Book a table.", {"type": "object", "properties": {"name": {"type": "string"},  # type: ignore[arg-type]
                                                                             "pin": {"type": "string"}}})


@pytest.fixture(autouse=True)
def redacted(caplog: pytest.LogCaptureFixture) -> None:
    """The default mode (tests/conftest.py puts back what was before); every logger at DEBUG."""
    set_caller_content("redacted")
    caplog.set_level(logging.DEBUG)


async def test_keys_are_counted_in_the_log_and_reach_the_model(caplog: pytest.LogCaptureFixture) -> None:
    llm = FakeLLM(["Thank you, your PIN is checked."])
    session, out = keypad_session(llm, [])
    task = asyncio.create_task(session.run())
    for key in PIN:
        await session.on_dtmf(key)
    await out.wait(lambda: done_events(out))
    await session.audio_in.put(None)
    await task
    assert llm.requests[0][-1].content == "The caller pressed 4 7 1 9 on the phone keypad."
    assert "keys [4 keys]" in caplog.text
    assert "4 7 1 9" not in caplog.text and PIN not in caplog.text and "checked" not in caplog.text


def test_words_heard_over_the_bot_are_counted_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    session, _ = make_session(FakeLLM([]), [])
    barge_in = BargeIn(session.config, session.clock, asyncio.sleep)  # type: ignore[arg-type]
    barge_in.let_go_of(2, "yeah Rosalind")
    assert "turn 2: [2 words] while the bot talks" in caplog.text and "Rosalind" not in caplog.text


@pytest.fixture
async def booking_server() -> AsyncIterator[str]:
    """A real HTTP tool on a free port that refuses every booking, repeating what it was sent."""
    async def book(request: web.Request) -> web.Response:
        body = await request.json()
        return web.Response(status=404, text=f"no table for {body['name']} with PIN {body['pin']}")

    app = web.Application()
    app.router.add_post("/book", book)
    async with served(app) as url:
        yield f"{url}/book"


async def test_a_tool_calls_arguments_and_its_error_answer_are_counted_in_the_log(
        booking_server: str, caplog: pytest.LogCaptureFixture) -> None:
    arguments = json.dumps({"name": "Rosalind", "pin": PIN})
    llm = FakeLLM([[ToolCall("call_1", "book_table", arguments)], "Sorry, I could not book it."])
    session, out = make_session(llm, ["Book a table for Rosalind."])
    async with httpx.AsyncClient() as http:
        session = remade(session, toolbox=ToolBox(ToolsConfig(), session.clock, [HttpTool(BOOK, booking_server)], http))
        task = asyncio.create_task(session.run())
        await speak(session, 0.5, True)
        await speak(session, 0.5, False)
        await out.wait(lambda: len(done_events(out)) >= 2, timeout=10)
        await session.audio_in.put(None)
        await task
    told = json.loads(session.history[3].content)["error"]
    answer = "no table for Rosalind with PIN 4719"
    assert f"HTTP 404: {answer}" in told  # the model is told what the tool said
    assert f"book_table([{len(arguments)} characters])" in caplog.text
    assert f"the tool book_table failed: the tool answered HTTP 404: [{len(answer)} characters]" in caplog.text
    assert "Rosalind" not in caplog.text and PIN not in caplog.text
