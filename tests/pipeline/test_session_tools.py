"""Tool calls inside a turn, with fake engines (tests/pipeline/fakes.py) and a real HTTP tool server:
dispatch, the follow-up reply, the filler, timeouts, the step limit, and the hard cases (a dropped
preemptive reply runs nothing; a barge-in during a slow tool runs it once and keeps its result)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import httpx
import pytest
from aiohttp import web

from models.llm.tool_calls import Tool, ToolCall
from pipeline.config import ToolsConfig
from pipeline.events import FunctionCallDelta, FunctionCallRequest, ResponseDone
from pipeline.session import Session
from pipeline.tools import HttpTool, ToolBox, ToolFailed
from tests.http_server import served
from tests.pipeline.fakes import DistantClock, FakeLLM, RecordingOutbound
from tests.pipeline.test_session import done_events, judged_session, make_session, pause_with_words, remade, speak

LOOKUP = {"type": "function", "name": "order_status", "description": "Look up an order.",
          "parameters": {"type": "object", "properties": {"order_number": {"type": "string"}},
                         "required": ["order_number"]}}


def call(arguments: str = '{"order_number": "4512"}', call_id: str = "call_1") -> ToolCall:
    return ToolCall(call_id, "order_status", arguments)


def with_client_tools(session: Session, config: ToolsConfig | None = None) -> Session:
    """The session made again with the client's tools (the session asks the client to run them)."""
    box = ToolBox(config or ToolsConfig(), session.clock, [], None)
    box.declare([LOOKUP])
    return remade(session, toolbox=box)


async def answer_calls(session, out: RecordingOutbound, output: str, delay: float = 0.0,  # type: ignore[no-untyped-def]
                       answered: list[str] | None = None, after: asyncio.Event | None = None) -> None:
    """The client's side: run each response.function_call (after `delay`, and once `after` is set)
    and answer it."""
    seen: set[str] = set()
    while True:
        for event in list(out.events):
            if isinstance(event, FunctionCallRequest) and event.call.call_id not in seen:
                seen.add(event.call.call_id)
                await asyncio.sleep(delay)
                if after is not None:
                    await after.wait()
                if answered is not None:
                    answered.append(event.call.call_id)
                session.on_function_output(event.call.call_id, output)
        await asyncio.sleep(0.005)


async def until(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    """Poll a condition the outbound does not see change (the history)."""
    async def loop() -> None:
        while not predicate():
            await asyncio.sleep(0.01)
    await asyncio.wait_for(loop(), timeout)


async def turn(session, out: RecordingOutbound, done: int) -> None:  # type: ignore[no-untyped-def]
    await speak(session, 0.5, True)
    await speak(session, 0.5, False)
    await out.wait(lambda: len(done_events(out)) >= done, timeout=10)


async def test_a_call_is_run_by_the_client_and_its_result_answered_in_one_follow_up() -> None:
    llm = FakeLLM([["Let me look.", call()], "It shipped on Monday."])
    session, out = make_session(llm, ["Where is my order 4512?"])
    session = with_client_tools(session)
    task = asyncio.create_task(session.run())
    client = asyncio.create_task(answer_calls(session, out, json.dumps({"status": "shipped Monday"})))
    await turn(session, out, 2)
    first, second = done_events(out)[:2]
    assert first.status == "tool_calls" and first.text == "Let me look."
    assert [c["name"] for c in first.tool_calls] == ["order_status"]
    assert second.status == "completed" and second.text == "It shipped on Monday." and not second.filler
    requests = [e for e in out.events if isinstance(e, FunctionCallRequest)]
    assert len(requests) == 1 and requests[0].call.arguments == '{"order_number": "4512"}'
    roles = [m.role for m in session.history]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert session.history[2].tool_calls == (call(),) and session.history[2].content == "Let me look."
    assert json.loads(session.history[3].content) == {"status": "shipped Monday"}
    assert llm.tools_seen[0] is not None and llm.tools_seen[0].callable  # offered on the first step
    assert [m.role for m in llm.requests[1]][-2:] == ["assistant", "tool"]
    assert "answer_first_audio_sent" in second.latency_ms and "tool_dispatched" in second.latency_ms
    client.cancel()
    await session.audio_in.put(None)
    await task


async def test_while_the_tool_runs_the_follow_up_is_prefilled_up_to_where_the_result_goes() -> None:
    llm = FakeLLM([["Let me look.", call()], "It shipped on Monday."])
    session, out = make_session(llm, ["Where is my order 4512?"])
    session = with_client_tools(session)
    task = asyncio.create_task(session.run())
    ahead = asyncio.Event()  # the client answers only once the head start was asked for
    client = asyncio.create_task(answer_calls(session, out, '{"status": "shipped"}', after=ahead))
    await speak(session, 0.5, True)
    await speak(session, 0.5, False)
    await until(lambda: any(open_last for _, open_last in llm.prepared))
    ahead.set()
    await out.wait(lambda: len(done_events(out)) >= 2, timeout=10)
    messages = next(m for m, open_last in llm.prepared if open_last)
    assert messages[:-2] == llm.requests[0]  # the calls' own prompt, then their message, then the result's head
    assert messages[-2].role == "assistant" and messages[-2].content == "Let me look."
    assert messages[-2].tool_calls == (call(),)
    assert messages[-1].role == "tool" and messages[-1].tool_call_id == "call_1"
    answer = done_events(out)[1]
    assert [step["step"] for step in answer.llm_steps] == [1, 2]  # each step's prompt cost, in the record
    client.cancel()
    await session.audio_in.put(None)
    await task


async def test_parallel_calls_run_together_and_lead_to_one_follow_up() -> None:
    llm = FakeLLM([[call(call_id="a"), call('{"order_number": "7"}', call_id="b")], "Both are on their way."])
    session, out = make_session(llm, ["Where are my orders 4512 and 7?"])
    session = with_client_tools(session)
    task = asyncio.create_task(session.run())
    client = asyncio.create_task(answer_calls(session, out, '{"status": "shipped"}', delay=0.1))
    await turn(session, out, 2)
    client.cancel()
    await session.audio_in.put(None)
    await task  # every event of the call was handled
    assert [d.status for d in done_events(out)] == ["tool_calls", "completed"]
    assert len(llm.requests) == 2  # one follow-up, not one per call
    assert [m.role for m in session.history] == ["system", "user", "assistant", "tool", "tool", "assistant"]


async def test_a_slow_tool_gets_one_filler_in_the_agents_voice() -> None:
    llm = FakeLLM([[call()], "It shipped."])
    session, out = make_session(llm, ["Where is my order?"])
    session = with_client_tools(session, ToolsConfig(filler_after_ms=100, acknowledgement=""))
    task = asyncio.create_task(session.run())
    filler_done = asyncio.Event()  # the tool answers only once the filler was said, however slow the machine
    client = asyncio.create_task(answer_calls(session, out, '{"status": "shipped"}', after=filler_done))
    await speak(session, 0.5, True)
    await speak(session, 0.5, False)
    await out.wait(lambda: len(done_events(out)) >= 2, timeout=10)
    filler_done.set()
    await out.wait(lambda: len(done_events(out)) >= 3, timeout=10)
    dones = done_events(out)
    assert [d.status for d in dones[:3]] == ["tool_calls", "completed", "completed"]
    assert dones[1].filler and dones[1].text == "One moment, let me check."
    assert dones[2].text == "It shipped."
    assert "One moment" not in " ".join(m.content for m in session.history)  # said, not part of the dialogue
    client.cancel()
    await session.audio_in.put(None)
    await task


async def test_a_tool_that_times_out_is_told_to_the_model_and_the_caller_hears_words() -> None:
    llm = FakeLLM([[call()], "Sorry, I could not check your order right now."])
    session, out = make_session(llm, ["Where is my order?"])
    session = with_client_tools(session, ToolsConfig(timeout_s=0.2, filler_after_ms=5000))
    task = asyncio.create_task(session.run())  # nobody answers the call
    await turn(session, out, 2)
    result = json.loads(session.history[3].content)
    assert "did not answer within 0.2 s" in result["error"]
    assert done_events(out)[1].text.startswith("Sorry, I could not check")
    await session.audio_in.put(None)
    await task


async def test_after_max_steps_the_model_must_answer_in_words() -> None:
    llm = FakeLLM([[call(call_id="a")], [call(call_id="b")], "I could not find it."])
    session, out = make_session(llm, ["Where is my order?"])
    session = with_client_tools(session, ToolsConfig(max_steps=2))
    task = asyncio.create_task(session.run())
    client = asyncio.create_task(answer_calls(session, out, '{"status": "unknown"}'))
    await turn(session, out, 3)
    offered = llm.tools_seen[:3]
    assert [t.callable for t in offered if t is not None] == [True, True, False]
    client.cancel()
    await session.audio_in.put(None)
    await task


async def test_a_preemptive_reply_dropped_at_the_pause_runs_no_tool() -> None:
    """The caller pauses (a preemptive reply starts and makes a call), then goes on: the call is
    never dispatched; the reply to the whole turn makes its own."""
    llm = FakeLLM([[call(call_id="early")], [call(call_id="late")], "Found it."])
    llm.stream_arguments = True
    session, out = make_session(llm, ["Where is my", "Where is my order 4512?"])
    session = with_client_tools(session)
    task = asyncio.create_task(session.run())
    answered: list[str] = []
    client = asyncio.create_task(answer_calls(session, out, '{"status": "shipped"}', answered=answered))
    await speak(session, 0.5, True)
    await speak(session, 0.2, False)  # a pause: the turn is not over
    await until(lambda: llm.requests)  # the preemptive reply asked the model (and makes its call)
    await speak(session, 0.5, True)
    await speak(session, 0.6, False)
    await out.wait(lambda: any(d.status == "completed" for d in done_events(out)), timeout=10)
    assert "early" not in answered and "late" in answered
    # the arguments' pieces as written, only for the call the caller's reply made (the dropped
    # reply's were held, never shown), and before the call itself
    pieces = [e for e in out.events if isinstance(e, FunctionCallDelta)]
    assert {e.call_id for e in pieces} == {"late"} and "".join(e.delta for e in pieces) == call().arguments
    request = next(i for i, e in enumerate(out.events) if isinstance(e, FunctionCallRequest))
    assert out.events.index(pieces[-1]) < request
    assert done_events(out)[0].discarded == 1  # the preemptive reply (whose call was made) was dropped
    assert [m.content for m in llm.requests[0]][-1] == "Where is my"
    client.cancel()
    await session.audio_in.put(None)
    await task


async def test_barge_in_during_a_slow_tool_runs_it_once_and_keeps_its_result() -> None:
    # the result may come before the second turn is confirmed (its follow-up then starts and is cut
    # short by that turn) or after (no follow-up): a reply for each, and the test holds either way
    llm = FakeLLM([[call()], "Your order shipped.", "Yes, I am here."])
    session, out = make_session(llm, ["Where is my order?", "Hello? Are you there?"])
    session = with_client_tools(session, ToolsConfig(filler_after_ms=5000))
    task = asyncio.create_task(session.run())
    answered: list[str] = []
    spoke = asyncio.Event()  # the tool answers only after the caller spoke again: it runs through the barge-in
    client = asyncio.create_task(answer_calls(session, out, '{"status": "shipped"}', answered=answered, after=spoke))
    await turn(session, out, 1)
    await speak(session, 0.5, True)  # the caller speaks while the tool runs
    await speak(session, 0.5, False)
    spoke.set()
    await out.wait(lambda: any(d.user_text == "Hello? Are you there?" and d.status == "completed"
                               for d in done_events(out)), timeout=10)
    await until(lambda: any(m.role == "tool" for m in session.history))
    assert answered == ["call_1"]  # asked once, answered once
    roles = [m.role for m in session.history]
    assert roles.count("tool") == 1 and roles.index("tool") < roles.index("user", 2)  # at its place
    assert done_events(out)[0].status == "tool_calls"
    assert len([e for e in out.events if isinstance(e, FunctionCallRequest)]) == 1
    client.cancel()
    await session.audio_in.put(None)
    await task


# -- the server's own HTTP tools ------------------------------------------------------------------
@pytest.fixture
async def tool_server() -> AsyncIterator[tuple[str, list[dict]]]:
    """A real HTTP server on a free port: POST /orders answers from its body (and so does /cancel, which
    acts), /slow never answers."""
    seen: list[dict] = []

    async def orders(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append({"body": body, "auth": request.headers.get("Authorization")})
        return web.json_response({"order_number": body["order_number"], "status": "shipped Monday"})

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/orders", orders)
    app.router.add_post("/cancel", orders)
    app.router.add_post("/slow", slow)
    async with served(app) as url:
        yield url, seen


async def test_an_http_tool_gets_the_arguments_and_a_secret_header_from_the_environment(
        tool_server: tuple[str, list[dict]], monkeypatch: pytest.MonkeyPatch) -> None:
    base, seen = tool_server
    monkeypatch.setenv("ORDERS_TOKEN", "s3cret")
    tool = Tool("order_status", "Look up an order.", LOOKUP["parameters"])  # type: ignore[arg-type]
    llm = FakeLLM([[call()], "It shipped on Monday."])
    session, out = make_session(llm, ["Where is my order 4512?"])
    async with httpx.AsyncClient() as http:
        session = remade(session, toolbox=ToolBox(ToolsConfig(), session.clock, [HttpTool(
            tool, base + "/orders", "POST", {"Authorization": "Bearer ${ORDERS_TOKEN}"})], http))
        task = asyncio.create_task(session.run())
        await turn(session, out, 2)
        await session.audio_in.put(None)
        await task
    assert seen == [{"body": {"order_number": "4512"}, "auth": "Bearer s3cret"}]
    result = json.loads(session.history[3].content)
    assert result["status"] == "shipped Monday"
    first = done_events(out)[0]
    assert first.tool_calls[0]["runs_on"] == "server" and first.tool_calls[0]["name"] == "order_status"


async def test_an_http_tool_that_hangs_times_out(tool_server: tuple[str, list[dict]]) -> None:
    base, _ = tool_server
    tool = Tool("order_status", "Look up an order.", LOOKUP["parameters"])  # type: ignore[arg-type]
    llm = FakeLLM([[call()], "Sorry, the order system is not answering."])
    session, out = make_session(llm, ["Where is my order 4512?"])
    async with httpx.AsyncClient() as http:
        session = remade(session, toolbox=ToolBox(ToolsConfig(timeout_s=0.3, filler_after_ms=5000), session.clock,
                                  [HttpTool(tool, base + "/slow")], http))
        task = asyncio.create_task(session.run())
        await turn(session, out, 2)
        await session.audio_in.put(None)
        await task
    assert "did not answer within 0.3 s" in json.loads(session.history[3].content)["error"]
    assert isinstance(done_events(out)[1], ResponseDone) and done_events(out)[1].status == "completed"


def end_call_session(grace_ms: int) -> tuple[object, RecordingOutbound, list[float]]:
    llm = FakeLLM([[ToolCall("call_end", "end_call", "{}")], "Goodbye, and have a nice day!"])
    session, out = make_session(llm, ["That is all, thank you. Bye!"])
    hung: list[float] = []
    box = ToolBox(ToolsConfig(end_call=True, goodbye_grace_ms=grace_ms), session.clock, [], None)
    session = remade(session, toolbox=box, hang_up=lambda: hung.append(session.clock.now()))
    return session, out, hung


async def test_end_call_hangs_up_once_the_goodbye_is_reported_played() -> None:
    session, out, hung = end_call_session(grace_ms=3_600_000)  # an hour: only the report can end it in the test
    assert any(t.name == "end_call" for t in session.tool_calls.toolbox.tools(1).tools)  # type: ignore[attr-defined]
    task = asyncio.create_task(session.run())  # type: ignore[attr-defined]
    await turn(session, out, 2)
    goodbye = done_events(out)[1]
    assert goodbye.text == "Goodbye, and have a nice day!"
    assert hung == []  # not before it was heard (the goodbye is awaited once its response.done is out)
    played_ms = sum(len(a) for a in out.audio) / 2 / 8000 * 1000
    session.on_played(goodbye.turn_id, played_ms / 2)  # type: ignore[attr-defined]
    assert hung == []  # half of it heard is not enough
    session.on_played(goodbye.turn_id, played_ms)  # type: ignore[attr-defined]
    assert len(hung) == 1  # all of it heard: at once
    await session.audio_in.put(None)  # type: ignore[attr-defined]
    await task


async def test_end_call_without_playback_reports_hangs_up_after_the_grace() -> None:
    session, out, hung = end_call_session(grace_ms=300)
    sent: list[float] = []  # when the goodbye's response.done left: the grace counts from there
    send_event = out.send_event

    async def stamped(event):  # type: ignore[no-untyped-def]
        if isinstance(event, ResponseDone):
            sent.append(session.clock.now())  # type: ignore[attr-defined]
        await send_event(event)

    out.send_event = stamped  # type: ignore[method-assign]
    task = asyncio.create_task(session.run())  # type: ignore[attr-defined]
    await turn(session, out, 2)
    await until(lambda: hung)
    assert hung[0] - sent[1] >= 0.299  # not before the grace was over (however late it came: no report ends it)
    await session.audio_in.put(None)  # type: ignore[attr-defined]
    await task


async def test_end_call_is_not_offered_where_the_transport_cannot_hang_up() -> None:
    box = ToolBox(ToolsConfig(end_call=True), DistantClock(), [], None)
    assert box.tools(1) is None


async def test_a_call_with_tools_is_served_by_the_tools_model_and_one_without_by_the_other() -> None:
    plain, tooled = FakeLLM(["Hi there."]), FakeLLM([[call()], "It shipped."])
    session, out = make_session(plain, ["Where is my order 4512?"])
    backends = replace(session.backends, tools_llm=tooled)
    box = ToolBox(ToolsConfig(), session.clock, [], None)
    box.declare([LOOKUP])
    with_tools = Session(backends, session.config, session.clock, out, output_rate=8000, toolbox=box)
    without = Session(backends, session.config, session.clock, out, output_rate=8000)
    assert with_tools.conversation.llm is tooled  # type: ignore[attr-defined]
    assert without.conversation.llm is plain  # type: ignore[attr-defined]
    assert with_tools.history[0].content == session.config.session.tools_prompt


async def test_a_call_repeated_in_the_same_turn_is_not_run_again_and_words_must_follow() -> None:
    """A small model asks again what it was just told: the tool does not act twice, the model gets
    the same result and must then answer in words (the step limit is not waited for)."""
    llm = FakeLLM([[call()], [call('{ "order_number":"4512" }', call_id="call_2")], "It shipped on Monday."])
    session, out = make_session(llm, ["Where is my order 4512?"])
    session = with_client_tools(session, ToolsConfig(max_steps=3))
    task = asyncio.create_task(session.run())
    answered: list[str] = []
    client = asyncio.create_task(answer_calls(session, out, '{"status": "shipped Monday"}', answered=answered))
    await turn(session, out, 3)
    assert answered == ["call_1"]  # asked once
    assert [e.call.call_id for e in out.events if isinstance(e, FunctionCallRequest)] == ["call_1"]
    offered = [t.callable for t in llm.tools_seen if t is not None]
    assert offered == [True, True, False]  # after the repeat: words only
    final = done_events(out)[2]
    assert final.text == "It shipped on Monday."
    assert [c["repeat_of"] for c in final.tool_calls] == [None, "call_1"]
    tool_results = [m.content for m in session.history if m.role == "tool"]
    assert tool_results == ['{"status": "shipped Monday"}'] * 2
    client.cancel()
    await session.audio_in.put(None)
    await task


async def test_in_a_call_served_by_the_tools_model_the_words_are_weighed_by_the_model_the_rule_was_tuned_on() -> None:
    """The end-of-turn rule was tuned on the default LLM's probabilities: a call with tools (served by
    llm.tools_model) asks that one, with the default system prompt, not the model that answers."""
    plain, tooled = FakeLLM(["unused"]), FakeLLM(["Booked."])
    plain.end_of_turn = lambda words: 0.99  # sure: the turn ends on the words
    tooled.end_of_turn = lambda words: 1e-6  # asked, it would make the call wait its whole patience
    session, out = judged_session(plain, ["Book a table for two."])
    box = ToolBox(ToolsConfig(), session.clock, [], None)
    box.declare([LOOKUP])
    session = remade(session, backends=replace(session.backends, tools_llm=tooled), toolbox=box)
    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    stop = await pause_with_words(session, out)
    assert plain.asked_end_of_turn == ["Book a table for two"] and tooled.asked_end_of_turn == []
    assert stop.turn_probability is not None and stop.turn_probability > 0.9
    await out.wait(lambda: done_events(out))
    assert done_events(out)[0].text == "Booked."  # answered by the tools model
    await session.audio_in.put(None)
    await task
    assert plain.closed == 1  # the weighing conversation was closed with the call


LOOK_UP = Tool("order_status", "Look up an order.", LOOKUP["parameters"], read_only=True)  # type: ignore[arg-type]
CANCEL = Tool("cancel_order", "Cancel an order.", LOOKUP["parameters"])  # type: ignore[arg-type]


async def pause_then_go_on(session: Session, written: Callable[[], object]) -> None:
    """The caller pauses (a preemptive reply starts on the words so far and writes its call: once
    `written()` is true), then speaks again and stops."""
    await speak(session, 0.5, True)
    await speak(session, 0.2, False)  # a pause: the turn is not over
    await until(written)
    await speak(session, 0.5, True)
    await speak(session, 0.6, False)


async def test_a_tool_that_acts_never_runs_for_a_reply_that_was_dropped(tool_server: tuple[str, list[dict]]) -> None:
    base, seen = tool_server
    cancel = '{"order_number": "4512"}'
    llm = FakeLLM([[ToolCall("early", "cancel_order", cancel)], [ToolCall("late", "cancel_order", cancel)], "Done."])
    session, out = make_session(llm, ["Cancel my order", "Cancel my order 4512 please."])
    async with httpx.AsyncClient() as http:
        session = remade(session, toolbox=ToolBox(ToolsConfig(), session.clock, [HttpTool(CANCEL, base + "/cancel")],
                                                  http))
        task = asyncio.create_task(session.run())
        await pause_then_go_on(session, lambda: llm.requests)
        await out.wait(lambda: any(d.status == "completed" for d in done_events(out)), timeout=10)
        await session.audio_in.put(None)
        await task
    assert len(seen) == 1  # the reply to the whole turn cancelled, once; the dropped one did nothing
    assert [c["call_id"] for d in done_events(out) for c in d.tool_calls] == ["late", "late"]


async def test_a_read_only_tool_runs_at_the_pause_and_its_result_is_thrown_away_when_the_words_change(
        tool_server: tuple[str, list[dict]]) -> None:
    base, seen = tool_server
    llm = FakeLLM([[call(call_id="early")], [call('{"order_number": "4513"}', call_id="late")], "Found it."])
    session, out = make_session(llm, ["Where is my order 4512", "Where is my order 4513?"])
    async with httpx.AsyncClient() as http:
        session = remade(session, toolbox=ToolBox(ToolsConfig(), session.clock, [HttpTool(LOOK_UP, base + "/orders")],
                                                  http))
        task = asyncio.create_task(session.run())
        await pause_then_go_on(session, lambda: seen)  # looked up during the pause, before the turn was over
        await out.wait(lambda: any(d.status == "completed" for d in done_events(out)), timeout=10)
        await session.audio_in.put(None)
        await task
    assert [s["body"]["order_number"] for s in seen] == ["4512", "4513"]
    results = [json.loads(m.content)["order_number"] for m in session.history if m.role == "tool"]
    assert results == ["4513"]  # the early result was thrown away with its reply
    assert [c["call_id"] for c in done_events(out)[-1].tool_calls] == ["late"]


async def test_a_read_only_tools_early_result_answers_the_turn_when_the_words_stay(
        tool_server: tuple[str, list[dict]]) -> None:
    base, seen = tool_server
    llm = FakeLLM([[call()], "It shipped on Monday."])
    session, out = make_session(llm, ["Where is my order 4512?", "Where is my order 4512?"])
    async with httpx.AsyncClient() as http:
        session = remade(session, toolbox=ToolBox(ToolsConfig(), session.clock, [HttpTool(LOOK_UP, base + "/orders")],
                                                  http))
        task = asyncio.create_task(session.run())
        await speak(session, 0.5, True)
        await speak(session, 0.2, False)
        await until(lambda: seen)  # dispatched at the pause
        await speak(session, 1.0, False)  # the pause goes on: the turn is over, with the same words
        await out.wait(lambda: any(d.status == "completed" for d in done_events(out)), timeout=10)
        await session.audio_in.put(None)
        await task
    assert len(seen) == 1  # run once, at the pause, and its result used
    calls, answer = done_events(out)[0], done_events(out)[-1]
    assert calls.status == "tool_calls" and calls.preemptive  # the reply written at the pause, confirmed
    assert answer.text == "It shipped on Monday."
    assert answer.tool_calls[0]["call_id"] == "call_1" and answer.tool_calls[0]["output"] is not None


async def test_a_call_begun_before_any_word_is_acknowledged_aloud_and_gets_no_filler_after() -> None:
    """The caller hears "One moment." while the call is written and the tool runs (a slow one too),
    not silence; the acknowledgement is the reply's words, kept with its call."""
    llm = FakeLLM([[call()], "It shipped."])
    session, out = make_session(llm, ["Where is my order?"])
    session = with_client_tools(session, ToolsConfig(filler_after_ms=50))
    task = asyncio.create_task(session.run())
    client = asyncio.create_task(answer_calls(session, out, '{"status": "shipped"}', delay=0.3))
    await turn(session, out, 2)
    calls, answer = done_events(out)[:2]
    assert calls.status == "tool_calls" and calls.text == "One moment."
    assert answer.text == "It shipped." and not answer.filler
    assert not any(d.filler for d in done_events(out))  # acknowledged once: no filler besides
    assert session.history[2].content == "One moment." and session.history[2].tool_calls == (call(),)
    client.cancel()
    await session.audio_in.put(None)
    await task


def transfer_session(targets: dict[str, str], target: str) -> tuple[Session, RecordingOutbound, list[str], list[float]]:
    llm = FakeLLM([[ToolCall("call_tr", "transfer_call", json.dumps({"target": target}))],
                   "I am putting you through to the front desk now."])
    session, out = make_session(llm, ["Can I talk to a person, please?"])
    moved: list[str] = []
    hung: list[float] = []
    box = ToolBox(ToolsConfig(transfer_targets=targets, goodbye_grace_ms=3_600_000), session.clock, [], None)
    session = remade(session, toolbox=box, hang_up=lambda: hung.append(session.clock.now()), transfer=moved.append)
    return session, out, moved, hung


async def test_transfer_call_hands_the_call_on_once_its_last_words_were_heard() -> None:
    session, out, moved, hung = transfer_session({"front desk": "sip:desk@10.0.0.5"}, "Front Desk")
    offered = next(t for t in session.tool_calls.toolbox.tools(1).tools if t.name == "transfer_call")  # type: ignore[union-attr]
    assert offered.parameters["properties"]["target"]["enum"] == ["front desk"]  # names only: never the address
    task = asyncio.create_task(session.run())
    await turn(session, out, 2)
    words = done_events(out)[1]
    assert words.text == "I am putting you through to the front desk now."
    assert moved == []  # not before they were heard
    session.on_played(words.turn_id, sum(len(a) for a in out.audio) / 2 / 8000 * 1000)
    assert moved == ["sip:desk@10.0.0.5"] and hung == []  # transferred, not hung up
    await session.audio_in.put(None)
    await task


def warm_session(answered: bool) -> tuple[Session, RecordingOutbound, list[str], list[tuple[str, str, str]]]:
    """A session whose line reaches billing warm (a fake consult): the person answers, or is busy."""
    llm = FakeLLM([[ToolCall("call_tr", "transfer_call", json.dumps({"target": "billing",
                                                                     "summary": "Jo wants a refund."}))],
                   "I am putting you through now." if answered else "Billing is busy right now."])
    session, out = make_session(llm, ["Billing, please."])
    moved: list[str] = []
    consulted: list[tuple[str, str, str]] = []

    async def consult(name: str, destination: str, summary: str) -> None:
        consulted.append((name, destination, summary))
        if not answered:
            raise ToolFailed("billing did not answer: 486 Busy Here")

    box = ToolBox(ToolsConfig(transfer_targets={"billing": "sip:billing@10.0.0.7"}, warm_transfers=["billing"],
                              goodbye_grace_ms=3_600_000), session.clock, [], None)
    box.on_consult = consult
    session = remade(session, toolbox=box, hang_up=lambda: None, transfer=moved.append)
    return session, out, moved, consulted


@pytest.mark.parametrize("answered", [True, False])
async def test_a_warm_transfer_hands_the_call_on_only_if_the_person_answered(answered: bool) -> None:
    session, out, moved, consulted = warm_session(answered)
    offered = next(t for t in session.tool_calls.toolbox.tools(1).tools if t.name == "transfer_call")  # type: ignore[union-attr]
    assert "summary" in offered.parameters["properties"]  # the model writes what the person is told
    task = asyncio.create_task(session.run())
    await turn(session, out, 2)
    words = done_events(out)[1]
    session.on_played(words.turn_id, sum(len(a) for a in out.audio) / 2 / 8000 * 1000)  # all heard
    assert consulted == [("billing", "sip:billing@10.0.0.7", "Jo wants a refund.")]
    result = json.loads(session.history[3].content)
    if answered:
        assert result["connecting_to"] == "billing" and moved == ["sip:billing@10.0.0.7"]
    else:  # the model is told why, and the words after it hand nothing on
        assert "486 Busy Here" in result["error"] and moved == []
    await session.audio_in.put(None)
    await task


async def test_transfer_call_to_a_name_not_configured_fails_and_the_model_is_told_the_targets() -> None:
    session, out, moved, _ = transfer_session({"front desk": "sip:desk@10.0.0.5"}, "sip:attacker@evil.test")
    task = asyncio.create_task(session.run())
    await turn(session, out, 2)
    await session.audio_in.put(None)
    await task
    result = json.loads(session.history[3].content)
    assert "no transfer target is called" in result["error"] and "front desk" in result["error"], result
    assert moved == []


async def test_transfer_call_is_offered_only_where_the_line_can_transfer_and_targets_are_set() -> None:
    box = ToolBox(ToolsConfig(transfer_targets={"desk": "sip:d@h"}), DistantClock(), [], None)
    assert box.tools(1) is None  # no line that transfers
    box.on_transfer = lambda name, destination: None
    assert [t.name for t in box.tools(1).tools] == ["transfer_call"]  # type: ignore[union-attr]
    box = ToolBox(ToolsConfig(), DistantClock(), [], None)
    box.on_transfer = lambda name, destination: None
    assert box.tools(1) is None  # no targets


async def test_a_first_message_is_said_as_is_and_kept_as_heard() -> None:
    llm = FakeLLM(["Sure, see you then."])
    session, out = make_session(llm, ["Yes, that works."])
    task = asyncio.create_task(session.run())
    turn_id = await session.say("Hello, this is the clinic reminding you of tomorrow's appointment.")
    await out.wait(lambda: len(done_events(out)) >= 1, timeout=10)
    said = done_events(out)[0]
    assert said.turn_id == turn_id and said.status == "completed"
    assert said.text == "Hello, this is the clinic reminding you of tomorrow's appointment."
    assert [m.role for m in session.history[1:]] == ["assistant"]
    assert llm.requests == []  # the LLM wrote none of it
    await session.audio_in.put(None)
    await task
