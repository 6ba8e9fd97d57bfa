"""WebRTC calls with the real models: an aiortc caller (tests/webrtc_caller.py) makes OpenAI's browser
flow (an offer with its microphone and the `oai-events` channel, POST /v1/realtime/calls), speaks real
audio (flite's voice, which the server's tuning never used) and hears the reply on the server's track;
it interrupts a story, and it runs a function tool the model calls."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.e2e.conftest import Server
from tests.speech import flite_samples, words
from tests.webrtc_caller import MIC_RATE, WebRTCCaller

pytestmark = pytest.mark.slow


async def connected(server: Server, session: dict | None = None) -> WebRTCCaller:
    """A WebRTC call answered and its session created (with `session`'s settings), the line quiet a moment."""
    caller = WebRTCCaller(server.base_url)
    assert (await caller.call(session=session)).status_code == 201
    await caller.wait_for("session.created", 30)
    await asyncio.sleep(0.5)
    return caller


def transcript(done: dict) -> str:
    return " ".join(part.get("transcript") or part.get("text") or "" for item in done["response"]["output"]
                    if item["type"] == "message" for part in item["content"])


async def test_a_spoken_question_is_answered_on_the_track(server: Server, tmp_path: Path) -> None:
    caller = await connected(server)
    try:
        ended = caller.mic.say(flite_samples("What is the capital of Italy?", tmp_path, MIC_RATE))
        heard = await caller.wait_for("conversation.item.input_audio_transcription.completed", 60)
        assert {"capital", "italy"} <= set(words(heard["transcript"])), heard
        done = await caller.wait_for("response.done", 90)
        assert done["response"]["status"] == "completed", done
        assert "rome" in words(transcript(done)), done
        first = caller.heard.loud_since(ended)
        assert first is not None, "no reply audio on the track"
        print(f"WebRTC voice-to-voice (end of speech to the first loud reply frame received): "
              f"{1000 * (first - ended):.0f} ms")
    finally:
        await caller.close()


async def test_the_caller_interrupts_a_story_and_the_track_goes_quiet(server: Server, tmp_path: Path) -> None:
    session = {"type": "realtime", "instructions": "You are a storyteller. Whatever you are asked, answer with "
               "a long, detailed story of at least ten sentences."}
    caller = await connected(server, session)
    try:
        caller.mic.say(flite_samples("Tell me a story about a brave little dragon.", tmp_path, MIC_RATE))
        started = await caller.wait_for("output_audio_buffer.started", 90)
        await asyncio.sleep(2.0)
        mark = len(caller.events)
        if any(e["type"] == "response.done" for e in caller.events):
            pytest.fail(f"the story ended within 2 s: {caller.events}")
        caller.mic.say(flite_samples("Wait, stop please, I have another question.", tmp_path, MIC_RATE))
        cleared = await caller.wait_for("output_audio_buffer.cleared", 15, after=mark)
        assert cleared["response_id"] == started["response_id"]
        done = await caller.wait_for("response.done", 15, after=mark)
        assert done["response"]["status"] == "cancelled", done
        kept = transcript(done)
        assert kept, done  # what went out on the track before the caller cut in
    finally:
        await caller.close()


async def test_a_function_tool_runs_and_the_answer_uses_its_result(server: Server, tmp_path: Path) -> None:
    tool = {"type": "function", "name": "get_order_status",
            "description": "Look up where a customer's order is, by its order number.",
            "parameters": {"type": "object", "properties": {"order_number": {"type": "string"}},
                           "required": ["order_number"]}}
    session = {"type": "realtime", "tools": [tool], "instructions":
               "You answer a shop's phone. To say where an order is, call get_order_status with its number, "
               "then tell the caller what it says in one short sentence."}
    caller = await connected(server, session)
    try:
        caller.mic.say(flite_samples("Where is my order? The number is 4 1 7 7 3.", tmp_path, MIC_RATE))
        asked = await caller.wait_for("response.function_call_arguments.done", 120)
        assert asked["name"] == "get_order_status"
        number = json.loads(asked["arguments"])["order_number"]
        assert "".join(ch for ch in str(number) if ch.isdigit()) == "41773", asked
        called = await caller.wait_for("response.done", 30)  # the response that asked for the call
        assert any(item["type"] == "function_call" for item in called["response"]["output"]), called
        mark = len(caller.events)
        caller.send(type="conversation.item.create", item={
            "type": "function_call_output", "call_id": asked["call_id"],
            "output": json.dumps({"status": "shipped yesterday, arrives on Friday"})})
        caller.send(type="response.create")
        done = await caller.wait_for("response.done", 90, after=mark)
        said = words(transcript(done))
        assert "friday" in said or "shipped" in said, done
        assert caller.heard.seconds_loud(0.0) > 1.0
    finally:
        await caller.close()

