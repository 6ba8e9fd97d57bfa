"""/v1/realtime's wire on the call runner, with a fake socket and fake engines (named as fakes):
the events a spoken turn and a typed one produce, in order and in both dialects (GA, beta), the
audio formats, and the errors for bad or unsupported client events. The official SDKs drive the
real server in tests/e2e/test_realtime.py."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np
import pytest

from app.runtime import Runtime
from app.settings import Settings
from app.transports.call import Call
from app.transports.realtime.wire import realtime_call
from core.clock import MonotonicClock
from models.llm.tool_calls import ToolCall
from pipeline.config import ReplyBudgetConfig, SessionConfig
from pipeline.session import Backends
from tests.app.test_ws_edges import FakeSocket
from tests.pipeline.fakes import FakeLLM, FakeRecognizer, FakeSynthesizer, FakeVad

REPLY = "Rome is the capital of Italy."


class AcceptingFakeSocket(FakeSocket):
    """The fake socket, accepted as a route accepts a real one."""

    async def accept(self, subprotocol: str | None = None) -> None:
        return None

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(m) for m in self.sent if isinstance(m, str)]

    def send(self, **event: Any) -> None:
        self.text(json.dumps(event))


def make_call(beta: bool = False, finals: list[str] | None = None,
              replies: list[str | list[str | ToolCall]] | None = None,
              settings: Settings | None = None) -> tuple[Call, AcceptingFakeSocket, FakeLLM]:
    llm = FakeLLM(replies or [REPLY, REPLY])
    backends = Backends(FakeVad(), FakeRecognizer(finals or ["What is the capital of Italy?"]), FakeSynthesizer(), llm)
    runtime = Runtime(settings or Settings(), MonotonicClock(), backends=backends)
    runtime.ready.set()
    socket = AcceptingFakeSocket()
    return realtime_call(socket, runtime, beta, "gpt-realtime"), socket, llm  # type: ignore[arg-type]


async def until(socket: AcceptingFakeSocket, kind: str, timeout: float = 10.0) -> dict[str, Any]:
    async def look() -> dict[str, Any]:
        while True:
            for event in socket.events():
                if event["type"] == kind:
                    return event
            await asyncio.sleep(0.01)

    return await asyncio.wait_for(look(), timeout)


async def commit_and_answer(socket: AcceptingFakeSocket) -> None:
    """The question as a committed buffer (turn_detection off), heard, and the response the client
    then asks for, completed."""
    for chunk in speech(24000):
        socket.send(type="input_audio_buffer.append", audio=chunk)
    socket.send(type="input_audio_buffer.commit")
    transcript = await until(socket, "conversation.item.input_audio_transcription.completed")
    assert transcript["transcript"] == "What is the capital of Italy?"
    socket.send(type="response.create")
    assert (await until(socket, "response.done"))["response"]["status"] == "completed"


def speech(rate: int, fmt: str = "pcm") -> list[str]:
    """0.5 s of a loud tone (speech to the fake VAD), then 1.5 s of silence, in 100 ms appends."""
    t = np.arange(int(rate * 0.5)) / rate
    loud = (0.5 * np.sin(2 * np.pi * 300 * t) * 32767).astype("<i2")
    pcm = np.concatenate([loud, np.zeros(int(rate * 1.5), dtype="<i2")]).tobytes()
    if fmt == "pcmu":
        from pipeline.audio import pcm16_to_mulaw

        pcm = pcm16_to_mulaw(pcm)
    step = rate // 10 * (2 if fmt == "pcm" else 1)
    return [base64.b64encode(pcm[i:i + step]).decode() for i in range(0, len(pcm), step)]


async def test_a_spoken_turn_makes_openais_events_in_order() -> None:
    call, socket, _ = make_call()
    task = asyncio.create_task(call.serve())
    socket.send(type="session.update", session={"type": "realtime", "instructions": "Be brief.", "audio": {
        "input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": {"type": "server_vad"}}}})
    await until(socket, "session.updated")
    for chunk in speech(24000):
        socket.send(type="input_audio_buffer.append", audio=chunk)
    done = await until(socket, "response.done")
    events = socket.events()
    kinds = [e["type"] for e in events if e["type"] != "response.output_audio.delta"]
    assert kinds[:2] == ["session.created", "session.updated"]
    assert events[0]["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert kinds[2:7] == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                          "input_audio_buffer.committed", "conversation.item.added",
                          "conversation.item.input_audio_transcription.completed"], kinds
    transcript = next(e for e in events if e["type"].endswith("input_audio_transcription.completed"))
    assert transcript["transcript"] == "What is the capital of Italy?" and transcript["usage"]["type"] == "duration"
    start = kinds.index("response.created")
    assert kinds[start:start + 4] == ["response.created", "response.output_item.added", "conversation.item.added",
                                      "response.content_part.added"]
    assert kinds[-6:] == ["response.output_audio.done", "response.output_audio_transcript.done",
                          "response.content_part.done", "response.output_item.done", "conversation.item.done",
                          "response.done"]
    assert all(e["event_id"] for e in events)
    response = done["response"]
    assert response["status"] == "completed" and response["object"] == "realtime.response"
    assert response["output"][0]["content"] == [{"type": "output_audio", "transcript": REPLY}]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
    assert deltas.strip() == REPLY
    audio = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
    assert len(audio) > 0 and len(audio) % 2 == 0
    assert set(response["voice_agent"]) >= {"latency_ms", "voice_to_voice_ms", "llm"}
    # every event of the response names it, and its item
    ids = {(e.get("response_id"), e.get("item_id")) for e in events if e["type"].startswith("response.output_audio")}
    assert ids == {(response["id"], response["output"][0]["id"])}
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(task, 5)


async def test_the_beta_dialect_gets_beta_names_and_g711_audio() -> None:
    call, socket, _ = make_call(beta=True)
    task = asyncio.create_task(call.serve())
    socket.send(type="session.update", session={"modalities": ["audio", "text"], "input_audio_format": "g711_ulaw",
                                                "output_audio_format": "g711_alaw"})
    updated = await until(socket, "session.updated")
    assert updated["session"]["input_audio_format"] == "g711_ulaw"
    assert updated["session"]["output_audio_format"] == "g711_alaw"
    for chunk in speech(8000, "pcmu"):
        socket.send(type="input_audio_buffer.append", audio=chunk)
    await until(socket, "response.done")
    kinds = {e["type"] for e in socket.events()}
    assert {"response.audio.delta", "response.audio.done", "response.audio_transcript.delta",
            "conversation.item.created"} <= kinds
    assert not {"response.output_audio.delta", "conversation.item.added", "conversation.item.done"} & kinds
    item = next(e for e in socket.events() if e["type"] == "response.output_item.done")["item"]
    assert item["content"][0]["type"] == "audio"
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(task, 5)


async def test_with_turn_detection_null_the_client_commits_its_turn_and_asks_for_the_reply() -> None:
    call, socket, llm = make_call(finals=["What is the capital of Italy?"])
    task = asyncio.create_task(call.serve())
    socket.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
    assert (await until(socket, "session.updated"))["session"]["audio"]["input"]["turn_detection"] is None
    for chunk in speech(24000)[:3]:  # some audio, then thrown away
        socket.send(type="input_audio_buffer.append", audio=chunk)
    socket.send(type="input_audio_buffer.clear")
    await until(socket, "input_audio_buffer.cleared")
    socket.send(type="input_audio_buffer.commit", event_id="evt_empty")
    assert (await until(socket, "error"))["error"]["code"] == "input_audio_buffer_commit_empty"
    await commit_and_answer(socket)
    # no reply until the client asked: one request, one response (a reply of the server's own would
    # have been cut by the client's, and asked the LLM too)
    assert [m.content for m in llm.requests[0][1:]] == ["What is the capital of Italy?"] and len(llm.requests) == 1
    assert len([e for e in socket.events() if e["type"] == "response.done"]) == 1
    assert not [e for e in socket.events() if e["type"].startswith("input_audio_buffer.speech")]  # no server VAD
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(task, 5)


async def test_with_create_response_false_the_server_detects_the_turn_and_the_client_asks_for_the_reply() -> None:
    call, socket, llm = make_call(finals=["What is the capital of Italy?"])
    task = asyncio.create_task(call.serve())
    socket.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": {
        "type": "server_vad", "create_response": False}}}})
    updated = await until(socket, "session.updated")
    assert updated["session"]["audio"]["input"]["turn_detection"]["create_response"] is False
    for chunk in speech(24000):
        socket.send(type="input_audio_buffer.append", audio=chunk)
    await until(socket, "conversation.item.input_audio_transcription.completed")
    socket.send(type="response.create")
    done = await until(socket, "response.done")
    assert done["response"]["status"] == "completed"
    # the turn was detected, and answered only when the client asked: one request, one response
    assert llm.requests[0][-1].content == "What is the capital of Italy?" and len(llm.requests) == 1
    assert len([e for e in socket.events() if e["type"] == "response.done"]) == 1
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(task, 5)


class PeekingRecognizer(FakeRecognizer):
    """A fake recognizer whose interim passes (beam 1, made while the bot talks) read the next final
    transcript without using it up."""

    def transcribe(self, audio: Any, beam_size: int | None = None) -> str:
        if beam_size == 1:
            return self.finals[0] if self.finals else ""
        return super().transcribe(audio, beam_size)


async def test_with_interrupt_response_false_speech_over_a_reply_waits_for_it_to_end() -> None:
    story = " ".join(["Once upon a time a dragon flew over the sea."] * 6)
    whole = Settings(session=SessionConfig(reply_budget=ReplyBudgetConfig(enabled=False)))  # not cut at 3 sentences
    call, socket, llm = make_call(replies=[story, REPLY], settings=whole)
    assert call.runtime.backends is not None
    call.runtime.backends.asr = PeekingRecognizer(["Tell me a story.", "And then?"])
    task = asyncio.create_task(call.serve())
    socket.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": {
        "type": "server_vad", "interrupt_response": False}}}})
    updated = await until(socket, "session.updated")
    assert updated["session"]["audio"]["input"]["turn_detection"]["interrupt_response"] is False
    for chunk in speech(24000):
        socket.send(type="input_audio_buffer.append", audio=chunk)
    await until(socket, "response.output_audio.delta")
    mark = len(socket.events())
    for chunk in speech(24000):  # the caller speaks over the reply
        socket.send(type="input_audio_buffer.append", audio=chunk)
    await until(socket, "input_audio_buffer.speech_stopped")

    async def both_done() -> list[dict[str, Any]]:
        while len(done := [e for e in socket.events() if e["type"] == "response.done"]) < 2:
            for chunk in speech(24000)[-3:]:  # silence
                socket.send(type="input_audio_buffer.append", audio=chunk)
            await asyncio.sleep(0.1)
        return done

    done = await asyncio.wait_for(both_done(), 60)  # the story plays in real time, about 6 s
    assert done[0]["response"]["status"] == "completed", done[0]["response"]["status_details"]
    assert done[0]["response"]["output"][0]["content"][0]["transcript"] == story  # heard to its end
    assert done[1]["response"]["output"][0]["content"][0]["transcript"] == REPLY  # then the caller's turn
    assert llm.requests[1][-1].content == "And then?"
    assert [e for e in socket.events()[mark:] if e["type"] == "input_audio_buffer.speech_started"]
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(task, 5)


async def test_an_audio_message_item_is_transcribed_and_answered() -> None:
    call, socket, llm = make_call(finals=["What is the capital of Italy?"])
    task = asyncio.create_task(call.serve())
    audio = base64.b64encode(b"".join(base64.b64decode(c) for c in speech(24000))).decode()
    socket.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_audio", "audio": audio}]})
    added = await until(socket, "conversation.item.added")
    assert added["item"]["content"] == [{"type": "input_audio", "transcript": "What is the capital of Italy?"}]
    socket.send(type="response.create")
    await until(socket, "response.done")
    assert llm.requests[0][-1].content == "What is the capital of Italy?"
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(task, 5)


class FakeBrokenRecognizer(FakeRecognizer):
    """A fake recognizer that fails the first `failures` times, with an exception that is not one of
    the project's (a library's own error), then hears its scripted transcripts."""

    def __init__(self, finals: list[str], failures: int) -> None:
        super().__init__(finals)
        self.failures = failures

    def transcribe(self, audio: Any, beam_size: int | None = None) -> str:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("CUDA failed with error out of memory at /models/whisper/model.bin")
        return super().transcribe(audio, beam_size)


def with_broken_recognizer(call: Call, failures: int) -> None:
    backends = call.runtime.backends
    assert backends is not None
    backends.asr = FakeBrokenRecognizer(["What is the capital of Italy?"], failures)


async def test_a_recognizer_failure_on_a_committed_buffer_ends_that_turn_with_an_error_and_the_call_goes_on() -> None:
    call, socket, llm = make_call()
    with_broken_recognizer(call, 1)
    task = asyncio.create_task(call.serve())
    socket.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
    await until(socket, "session.updated")
    for chunk in speech(24000):
        socket.send(type="input_audio_buffer.append", audio=chunk)
    socket.send(type="input_audio_buffer.commit", event_id="evt_commit")
    failed = await until(socket, "conversation.item.input_audio_transcription.failed")
    assert failed["error"]["code"] == "transcription_failed"
    error = (await until(socket, "error"))["error"]
    assert (error["type"], error["code"], error["event_id"]) == ("server_error", "transcription_failed", "evt_commit")
    assert "CUDA" not in error["message"] and "/models" not in error["message"]  # the detail stays in the log
    assert not task.done()  # the call goes on: the same turn again is heard and answered
    await commit_and_answer(socket)
    assert [m.content for m in llm.requests[0][1:]] == ["What is the capital of Italy?"]
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(task, 5)
    assert call.errors == 0  # the server's failure is not counted against the client


async def test_a_recognizer_failure_on_an_audio_message_is_an_error_event_and_the_call_goes_on() -> None:
    call, socket, _llm = make_call()
    with_broken_recognizer(call, 1)
    task = asyncio.create_task(call.serve())
    audio = base64.b64encode(b"".join(base64.b64decode(c) for c in speech(24000))).decode()
    item = {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": audio}]}
    socket.send(type="conversation.item.create", event_id="evt_item", item=item)
    error = (await until(socket, "error"))["error"]
    assert (error["type"], error["code"], error["param"]) == ("server_error", "transcription_failed",
                                                              "item.content.audio")
    socket.send(type="conversation.item.create", item=item)
    added = await until(socket, "conversation.item.added")
    assert added["item"]["content"] == [{"type": "input_audio", "transcript": "What is the capital of Italy?"}]
    socket.send(type="response.create")
    assert (await until(socket, "response.done"))["response"]["status"] == "completed"
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(task, 5)


async def test_a_typed_message_and_response_create_get_a_spoken_reply() -> None:
    call, socket, llm = make_call()
    task = asyncio.create_task(call.serve())
    socket.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Capital of Italy?"}]})
    socket.send(type="response.create", event_id="evt_make")
    done = await until(socket, "response.done")
    assert done["response"]["status"] == "completed"
    assert llm.requests[0][-1].content == "Capital of Italy?"
    added = [e for e in socket.events() if e["type"] == "conversation.item.added"]
    assert added[0]["item"]["content"] == [{"type": "input_text", "text": "Capital of Italy?"}]
    assert added[1]["previous_item_id"] == added[0]["item"]["id"]  # the reply follows the message
    socket.send(type="conversation.item.retrieve", item_id=added[0]["item"]["id"])
    retrieved = await until(socket, "conversation.item.retrieved")
    assert retrieved["item"]["id"] == added[0]["item"]["id"]
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(task, 5)


async def test_text_only_replies_by_session_or_by_response() -> None:
    """output_modalities ["text"]: the reply is text deltas, no audio, no TTS; a response.create may
    ask it for one response, and the session's modality holds again after it."""
    call, socket, llm = make_call()
    llm.replies = [REPLY, REPLY]
    task = asyncio.create_task(call.serve())
    socket.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Capital of Italy?"}]})
    socket.send(type="response.create", response={"output_modalities": ["text"]})
    done = await until(socket, "response.done")
    events = socket.events()
    assert done["response"]["output_modalities"] == ["text"]
    assert done["response"]["output"][0]["content"] == [{"type": "output_text", "text": REPLY}]
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta").strip() == REPLY
    assert next(e for e in events if e["type"] == "response.output_text.done")["text"] == REPLY
    assert not [e for e in events if e["type"].startswith("response.output_audio")]
    mark = len(events)
    socket.send(type="session.update", session={"type": "realtime"})  # no change of modality: audio again
    for chunk in speech(24000):
        socket.send(type="input_audio_buffer.append", audio=chunk)
    while not [e for e in socket.events()[mark:] if e["type"] == "response.done"]:
        await asyncio.sleep(0.02)
    assert [e for e in socket.events()[mark:] if e["type"] == "response.output_audio.delta"]
    socket.send(type="session.update", session={"type": "realtime", "output_modalities": ["text"]})
    updated = [e for e in socket.events() if e["type"] == "session.updated"]
    while len(updated) < 2:
        await asyncio.sleep(0.02)
        updated = [e for e in socket.events() if e["type"] == "session.updated"]
    assert updated[-1]["session"]["output_modalities"] == ["text"]
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(task, 5)


async def test_an_out_of_band_response_with_its_own_instructions_leaves_the_conversation_alone() -> None:
    call, socket, llm = make_call(replies=[REPLY, "A question about Italy.", REPLY])
    task = asyncio.create_task(call.serve())
    socket.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Capital of Italy?"}]})
    socket.send(type="response.create")
    await until(socket, "response.done")
    assert call.session is not None
    history = list(call.session.history)
    socket.send(type="response.create", response={"conversation": "none", "instructions": "Summarize the call.",
                                                  "output_modalities": ["text"]})
    while len(done := [e for e in socket.events() if e["type"] == "response.done"]) < 2:
        await asyncio.sleep(0.02)
    oob = done[1]["response"]
    assert oob["conversation_id"] is None and done[0]["response"]["conversation_id"]
    assert oob["output"][0]["content"] == [{"type": "output_text", "text": "A question about Italy."}]
    assert llm.requests[1][0].content == "Summarize the call."  # its own instructions
    assert [m.content for m in llm.requests[1][1:]] == [m.content for m in history[1:]]  # the conversation's words
    assert call.session.history == history  # and the conversation is as it was
    added = [e["item"]["id"] for e in socket.events() if e["type"] == "conversation.item.added"]
    assert oob["output"][0]["id"] not in added
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(task, 5)


WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


async def test_a_function_call_round_trip_waits_for_the_output_and_response_create() -> None:
    call, socket, llm = make_call(replies=[[ToolCall("call_1", "get_weather", '{"city": "Paris"}')],
                                           "It is sunny in Paris."])
    task = asyncio.create_task(call.serve())
    socket.send(type="session.update", session={"type": "realtime", "tools": [WEATHER]})
    assert (await until(socket, "session.updated"))["session"]["tools"] == [WEATHER]
    socket.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]})
    socket.send(type="response.create")
    first = await until(socket, "response.done")
    calls = [o for o in first["response"]["output"] if o["type"] == "function_call"]
    assert calls == [{"id": calls[0]["id"], "object": "realtime.item", "type": "function_call", "status": "completed",
                      "name": "get_weather", "call_id": "call_1", "arguments": '{"city": "Paris"}'}]
    done_item = next(e for e in socket.events() if e["type"] == "response.output_item.done")
    assert done_item["item"]["status"] == "completed" and done_item["item"]["call_id"] == "call_1"
    arguments = next(e for e in socket.events() if e["type"] == "response.function_call_arguments.done")
    assert arguments["name"] == "get_weather" and arguments["arguments"] == '{"city": "Paris"}'
    # the output alone makes no reply: like OpenAI's server, this one waits for response.create
    socket.send(type="conversation.item.create", item={"type": "function_call_output", "call_id": "call_1",
                                                       "output": '{"sky": "sunny"}'})
    socket.send(type="conversation.item.create", item={"type": "function_call_output", "call_id": "call_1",
                                                       "output": "twice"}, event_id="evt_twice")
    twice = await until(socket, "error")
    assert twice["error"]["code"] == "unknown_call_id" and twice["error"]["event_id"] == "evt_twice"
    # both events were handled, in order: a reply started by the output would be going now
    assert call.session is not None and call.session.reply is None and len(llm.requests) == 1
    socket.send(type="response.create")
    await until(socket, "response.output_audio_transcript.done")
    second = [e for e in socket.events() if e["type"] == "response.done"]
    while len(second) < 2:
        await asyncio.sleep(0.02)
        second = [e for e in socket.events() if e["type"] == "response.done"]
    assert second[1]["response"]["output"][0]["content"][0]["transcript"] == "It is sunny in Paris."
    tool_message = llm.requests[1][-1]
    assert tool_message.role == "tool" and tool_message.content == '{"sky": "sunny"}'  # the first output only
    socket.send(type="conversation.item.create", item={"type": "function_call_output", "call_id": "call_1",
                                                       "output": "again"}, event_id="evt_again")
    while not [e for e in socket.events() if e["type"] == "error" and e["error"]["event_id"] == "evt_again"]:
        await asyncio.sleep(0.02)
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(task, 5)


@pytest.mark.parametrize(("event", "code", "param"), [
    ({"type": "input_audio_buffer.append", "audio": "%%% not base64"}, "invalid_value", "audio"),
    ({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()}, "invalid_value", "audio"),
    ({"type": "no.such.event"}, "invalid_event", "type"),
    ({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}},
     "invalid_value", "session.audio.input.format.rate"),
    ({"type": "session.update", "session": {"tools": [{"type": "function"}]}}, "invalid_tools", "session.tools"),
    ({"type": "input_audio_buffer.commit"}, "unsupported", None),
    ({"type": "session.update", "session": {"audio": {"input": {"turn_detection": {
        "type": "server_vad", "interrupt_response": "no"}}}}}, "invalid_value",
     "session.audio.input.turn_detection.interrupt_response"),
    ({"type": "input_audio_buffer.clear"}, "unsupported", None),
    ({"type": "session.update", "session": {"output_modalities": ["video"]}}, "invalid_value",
     "session.output_modalities"),
    ({"type": "response.create", "response": {"input": [{"type": "message"}]}}, "invalid_value", "response.input[0]"),
    ({"type": "response.create", "response": {"input": [{"type": "item_reference", "id": "item_x"}]}},
     "item_not_found", "response.input[0].id"),
    ({"type": "response.create", "response": {"input": [{"type": "message", "role": "user", "content": [
        {"type": "input_image", "image_url": "data:"}]}]}}, "unsupported", "response.input[0].content"),
    ({"type": "response.create", "response": {"tools": [{"type": "function"}]}}, "invalid_tools", "response.tools"),
    ({"type": "response.create", "response": {"tool_choice": {"type": "function", "name": "nowhere"}}},
     "invalid_tools", "response.tools"),
    ({"type": "response.create", "response": {"prompt": {"id": "pmpt_1"}}}, "unsupported", "response"),
    ({"type": "response.create", "response": {"conversation": "other"}}, "invalid_value", "response.conversation"),
    ({"type": "response.cancel"}, "response_cancel_not_active", None),
    ({"type": "conversation.item.truncate", "item_id": "item_x", "content_index": 0, "audio_end_ms": 1.5},
     "invalid_value", "audio_end_ms"),
    ({"type": "conversation.item.retrieve", "item_id": "item_x"}, "item_not_found", "item_id"),
    ({"type": "conversation.item.delete", "item_id": "item_x"}, "item_not_found", "item_id"),
    ({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": []}},
     "invalid_value", "item.content"),
])
async def test_a_bad_event_gets_openais_error_naming_it_and_the_call_goes_on(
        event: dict[str, Any], code: str, param: str | None) -> None:
    call, socket, _ = make_call()
    task = asyncio.create_task(call.serve())
    socket.send(**event, event_id="evt_bad")
    error = await until(socket, "error")
    assert error["error"]["code"] == code and error["error"]["param"] == param, error
    assert error["error"]["event_id"] == "evt_bad" and error["error"]["type"] == "invalid_request_error"
    socket.send(type="session.update", session={"instructions": "Still here."})
    assert (await until(socket, "session.updated"))["session"]["instructions"] == "Still here."
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(task, 5)


async def test_not_json_and_binary_frames_are_errors_too() -> None:
    call, socket, _ = make_call()
    task = asyncio.create_task(call.serve())
    socket.text("{not json")
    socket.inbox.put_nowait({"type": "websocket.receive", "bytes": b"\x00\x01"})
    while len(codes := [e["error"]["code"] for e in socket.events() if e["type"] == "error"]) < 2:
        await asyncio.sleep(0.01)
    assert codes == ["invalid_json", "binary_frame"]
    assert call.errors == 2
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(task, 5)


async def test_an_ephemeral_key_opens_one_realtime_socket_with_its_session() -> None:
    """POST /v1/realtime/client_secrets with the server's key mints a one-use `ek_` key; a browser
    opens /v1/realtime with it (Bearer, or the subprotocol a browser can set), and its session
    starts with the settings it was minted with. A real server (fake engines), real sockets."""
    import httpx
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    from tests.app.live import fake_app, live

    key = "k-0123456789abcdef-secret"
    with live(fake_app(api_keys=[key])) as address:
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            assert (await http.post("/v1/realtime/client_secrets", json={})).status_code == 401
            bad = await http.post("/v1/realtime/client_secrets", headers={"Authorization": f"Bearer {key}"},
                                  json={"expires_after": {"anchor": "created_at", "seconds": 5}})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "expires_after.seconds"
            minted = []
            for _ in range(2):
                answer = await http.post("/v1/realtime/client_secrets", headers={"Authorization": f"Bearer {key}"},
                                         json={"session": {"type": "realtime", "instructions": "Speak like a pirate."}})
                assert answer.status_code == 200, answer.text
                minted.append(answer.json())
        assert minted[0]["value"].startswith("ek_") and minted[0]["session"]["instructions"] == "Speak like a pirate."
        url = f"ws://{address}/v1/realtime?model=gpt-realtime"
        async with connect(url) as ws:  # no key at all: closed with the reason, like /ws
            with pytest.raises(ConnectionClosed):
                await ws.recv()
            assert ws.close_code == 1008
        async with connect(url, additional_headers={"Authorization": f"Bearer {key}"}) as ws:  # the server's key
            assert json.loads(await ws.recv())["type"] == "session.created"
        async with connect(url, additional_headers={"Authorization": f"Bearer {minted[0]['value']}"}) as ws:
            created = json.loads(await ws.recv())
        assert created["type"] == "session.created" and created["session"]["instructions"] == "Speak like a pirate."
        async with connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{minted[1]['value']}"]) as ws:
            assert ws.subprotocol == "realtime"
            assert json.loads(await ws.recv())["session"]["instructions"] == "Speak like a pirate."
        async with connect(url, additional_headers={"Authorization": f"Bearer {minted[0]['value']}"}) as ws:
            with pytest.raises(ConnectionClosed):  # used already
                await ws.recv()
            assert ws.close_code == 1008


def test_turn_detection_settings_the_client_sets_shape_the_calls_endpointing() -> None:
    from app.transports.realtime.settings import RealtimeSettings
    from pipeline.config import EndpointingConfig

    base = EndpointingConfig()
    plain = RealtimeSettings(model="m").updated({"audio": {"input": {"turn_detection": {"type": "server_vad"}}}},
                                                beta=False)
    assert plain.endpointing(base) == base  # nothing asked: the server's own settings
    vad = plain.updated({"audio": {"input": {"turn_detection": {
        "type": "server_vad", "threshold": 0.7, "prefix_padding_ms": 200, "silence_duration_ms": 400}}}}, beta=False)
    shaped = vad.endpointing(base)
    assert (shaped.threshold, shaped.prefix_padding_ms, shaped.max_patience_ms, shaped.end_silence_ms) == (
        0.7, 200, 400, 400)
    assert vad.as_ga()["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 400
    eager = vad.updated({"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}, beta=True)
    assert eager.endpointing(base).max_patience_ms == base.max_patience_ms // 2
    assert eager.endpointing(base).threshold == base.threshold  # server_vad's values went with its type
    patient = eager.updated({"turn_detection": {"type": "semantic_vad", "eagerness": "low"}}, beta=True)
    assert patient.endpointing(base).max_patience_ms == base.max_patience_ms * 2


def typed(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def responses(socket: AcceptingFakeSocket, count: int) -> list[dict[str, Any]]:
    """The first `count` response.done events, waiting for them."""
    async def look() -> list[dict[str, Any]]:
        while len(done := [e for e in socket.events() if e["type"] == "response.done"]) < count:
            await asyncio.sleep(0.01)
        return done[:count]

    return await asyncio.wait_for(look(), 10)


async def test_deleted_items_leave_the_conversation_and_the_models_context() -> None:
    call, socket, llm = make_call(replies=[REPLY, "Paris.", "Madrid."])
    task = asyncio.create_task(call.serve())
    socket.send(type="conversation.item.create", item=typed("Capital of Italy?"))
    socket.send(type="response.create")
    first = (await responses(socket, 1))[0]["response"]
    added = [e["item"]["id"] for e in socket.events() if e["type"] == "conversation.item.added"]
    user_item, reply_item = added[0], first["output"][0]["id"]
    # two typed messages answered by one response: each is its own message, deleted alone
    socket.send(type="conversation.item.create", item=typed("And France?"))
    socket.send(type="conversation.item.create", item=typed("Just the city."))
    socket.send(type="response.create")
    await responses(socket, 2)
    assert [m.content for m in llm.requests[1][1:]] == ["Capital of Italy?", REPLY, "And France?", "Just the city."]
    france = [e["item"]["id"] for e in socket.events() if e["type"] == "conversation.item.added"][2]
    for item_id in (user_item, reply_item, france):
        socket.send(type="conversation.item.delete", item_id=item_id)
    while len([e for e in socket.events() if e["type"] == "conversation.item.deleted"]) < 3:
        await asyncio.sleep(0.01)
    assert [e["item_id"] for e in socket.events() if e["type"] == "conversation.item.deleted"] == [
        user_item, reply_item, france]
    assert call.session is not None
    assert [m.content for m in call.session.history[1:]] == ["Just the city.", "Paris."]
    socket.send(type="conversation.item.retrieve", item_id=user_item, event_id="evt_gone")
    assert (await until(socket, "error"))["error"]["code"] == "item_not_found"
    socket.send(type="conversation.item.create", item=typed("Spain?"))
    socket.send(type="response.create")
    await responses(socket, 3)
    assert [m.content for m in llm.requests[2][1:]] == ["Just the city.", "Paris.", "Spain?"]
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(task, 5)


async def test_deleting_a_function_call_takes_its_output_with_it() -> None:
    call, socket, _ = make_call(replies=[[ToolCall("call_1", "get_weather", '{"city": "Paris"}')],
                                         "It is sunny in Paris.", "Hello."])
    task = asyncio.create_task(call.serve())
    socket.send(type="session.update", session={"type": "realtime", "tools": [WEATHER]})
    socket.send(type="conversation.item.create", item=typed("Weather in Paris?"))
    socket.send(type="response.create")
    first = (await responses(socket, 1))[0]["response"]
    call_item = next(o for o in first["output"] if o["type"] == "function_call")["id"]
    socket.send(type="conversation.item.create", item={"type": "function_call_output", "call_id": "call_1",
                                                       "output": '{"sky": "sunny"}', "id": "item_output"})
    socket.send(type="response.create")
    await responses(socket, 2)
    assert call.session is not None
    assert any(m.role == "tool" for m in call.session.history)
    socket.send(type="conversation.item.delete", item_id=call_item)
    await until(socket, "conversation.item.deleted")
    while len(gone := [e["item_id"] for e in socket.events() if e["type"] == "conversation.item.deleted"]) < 2:
        await asyncio.sleep(0.01)
    assert gone == [call_item, "item_output"]
    assert not [m for m in call.session.history if m.role == "tool" or m.tool_calls]
    assert [m.content for m in call.session.history[1:]] == ["Weather in Paris?", "It is sunny in Paris."]
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(task, 5)


async def test_a_response_with_its_own_input_and_tools_answers_those_alone() -> None:
    """response.input replaces the conversation for one response (items, and references to the
    conversation's); response.tools and tool_choice replace the session's for it."""
    call, socket, llm = make_call(replies=[REPLY, "Yes.", "Rome again."])
    task = asyncio.create_task(call.serve())
    socket.send(type="conversation.item.create", item=typed("Capital of Italy?"))
    socket.send(type="response.create")
    await responses(socket, 1)
    asked = next(e for e in socket.events() if e["type"] == "conversation.item.added")["item"]["id"]
    assert call.session is not None
    history = list(call.session.history)
    socket.send(type="response.create", response={
        "conversation": "none", "output_modalities": ["text"], "tools": [WEATHER], "tool_choice": "none",
        "input": [{"type": "item_reference", "id": asked},
                  {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Rome."}]},
                  typed("Is that right?")]})
    second = (await responses(socket, 2))[1]["response"]
    assert second["output"][0]["content"] == [{"type": "output_text", "text": "Yes."}]
    assert [(m.role, m.content) for m in llm.requests[1][1:]] == [
        ("user", "Capital of Italy?"), ("assistant", "Rome."), ("user", "Is that right?")]
    offered = llm.tools_seen[1]
    assert offered is not None and [t.name for t in offered.tools] == ["get_weather"] and offered.choice == "none"
    assert call.session.history == history  # out of band: the conversation is as it was
    assert call.wire.toolbox.client_tools == ()  # type: ignore[attr-defined]  # the session's own
    socket.send(type="response.create")  # the conversation's own context and tools again
    await responses(socket, 3)
    assert [m.content for m in llm.requests[2][1:]] == ["Capital of Italy?", REPLY]
    assert llm.tools_seen[2] is None
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(task, 5)


async def test_an_idle_caller_is_answered_after_idle_timeout_ms() -> None:
    call, socket, llm = make_call(replies=[REPLY, "Are you still there?"])
    task = asyncio.create_task(call.serve())
    socket.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": {
        "type": "server_vad", "idle_timeout_ms": 200}}}})
    socket.send(type="conversation.item.create", item=typed("Capital of Italy?"))
    socket.send(type="response.create")
    done = await responses(socket, 2)  # the second answers the silence
    events = socket.events()
    kinds = [e["type"] for e in events]
    triggered = events[kinds.index("input_audio_buffer.timeout_triggered")]
    assert kinds.index("response.done") < kinds.index("input_audio_buffer.timeout_triggered")
    assert next(e for e in events if e["type"] == "input_audio_buffer.committed")["item_id"] == triggered["item_id"]
    assert llm.requests[1][-1].content == "(The caller has said nothing for 0.2 seconds.)"
    assert done[1]["response"]["output"][0]["content"][0]["transcript"] == "Are you still there?"
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(task, 5)


async def test_each_response_starts_with_the_clients_rate_limits() -> None:
    call, socket, _ = make_call()
    limits = [{"name": "requests", "limit": 30, "remaining": 29, "reset_seconds": 2.0}]

    async def standing() -> list[dict[str, Any]]:
        return limits

    socket.scope = {"voice_agent.rate_limits": standing}  # what the guard leaves (tests/app/test_limits.py)
    task = asyncio.create_task(call.serve())
    socket.send(type="conversation.item.create", item=typed("Capital of Italy?"))
    socket.send(type="response.create")
    await responses(socket, 1)
    kinds = [e["type"] for e in socket.events()]
    assert kinds.index("rate_limits.updated") == kinds.index("response.created") + 1
    assert next(e for e in socket.events() if e["type"] == "rate_limits.updated")["rate_limits"] == limits
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(task, 5)


async def test_assistant_and_system_messages_the_client_adds_join_the_context_unanswered() -> None:
    call, socket, llm = make_call(replies=["Rome.", "Paris."])
    task = asyncio.create_task(call.serve())
    socket.send(type="conversation.item.create", item={
        "type": "message", "role": "system", "content": [{"type": "input_text", "text": "The caller is Ada."}]})
    socket.send(type="conversation.item.create", item={
        "type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello Ada."}]})
    while len([e for e in socket.events() if e["type"] == "conversation.item.done"]) < 2:
        await asyncio.sleep(0.01)
    assert not llm.requests  # nothing is answered until response.create
    socket.send(type="conversation.item.create", item=typed("Capital of Italy?"))
    socket.send(type="response.create")
    await responses(socket, 1)
    assert [(m.role, m.content) for m in llm.requests[0][1:]] == [
        ("system", "The caller is Ada."), ("assistant", "Hello Ada."), ("user", "Capital of Italy?")]
    note = next(e for e in socket.events() if e["type"] == "conversation.item.added")["item"]
    assert note["role"] == "system" and note["content"] == [{"type": "input_text", "text": "The caller is Ada."}]
    socket.send(type="conversation.item.delete", item_id=note["id"])
    await until(socket, "conversation.item.deleted")
    socket.send(type="conversation.item.create", item=typed("And France?"))
    socket.send(type="response.create")
    await responses(socket, 2)
    assert [m.content for m in llm.requests[1][1:]] == ["Hello Ada.", "Capital of Italy?", "Rome.", "And France?"]
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(task, 5)


async def test_a_function_calls_arguments_come_in_pieces_as_the_model_writes_them() -> None:
    arguments = '{"city": "Paris", "units": "metric"}'
    call, socket, llm = make_call(replies=[[ToolCall("call_1", "get_weather", arguments)], "Sunny."])
    llm.stream_arguments = True
    task = asyncio.create_task(call.serve())
    socket.send(type="session.update", session={"type": "realtime", "tools": [WEATHER]})
    socket.send(type="conversation.item.create", item=typed("Weather in Paris?"))
    socket.send(type="response.create")
    first = (await responses(socket, 1))[0]["response"]
    events = socket.events()
    deltas = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert len(deltas) > 1 and "".join(e["delta"] for e in deltas) == arguments
    assert {e["call_id"] for e in deltas} == {"call_1"}
    kinds = [e["type"] for e in events]
    added = [e for e in events if e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call"]
    assert len(added) == 1 and kinds.index("response.output_item.added") < kinds.index(
        "response.function_call_arguments.delta") < kinds.index("response.function_call_arguments.done")
    assert next(e for e in events if e["type"] == "response.function_call_arguments.done")["arguments"] == arguments
    assert [o["arguments"] for o in first["output"] if o["type"] == "function_call"] == [arguments]
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(task, 5)


async def test_a_response_does_not_wait_on_rate_limits_that_are_slow_to_come() -> None:
    """A Redis that is slow or down must not hold back a reply's first audio: the limits are left out."""
    call, socket, _ = make_call()

    async def stuck() -> list[dict[str, Any]]:
        await asyncio.sleep(30)
        return []

    socket.scope = {"voice_agent.rate_limits": stuck}
    task = asyncio.create_task(call.serve())
    socket.send(type="conversation.item.create", item=typed("Capital of Italy?"))
    socket.send(type="response.create")
    assert (await responses(socket, 1))[0]["response"]["status"] == "completed"
    assert not [e for e in socket.events() if e["type"] == "rate_limits.updated"]
    socket.inbox.put_nowait({"type": "websocket.disconnect"})
    await asyncio.wait_for(task, 5)
