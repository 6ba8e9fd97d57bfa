"""Echo: a caller on a speakerphone, whose microphone hears the bot's reply again 200 ms later and 10 dB down
through a small room (tests/speakerphone.py), with the real models over /ws. The bot must not take its own voice
for the caller's, and the caller must still be able to interrupt it. (Without echo cancellation the same calls
interrupt themselves: bench/echo_calls.py, docs/benchmarks.md.)"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from app.client import VoiceClient
from tests.e2e.conftest import Server
from tests.speakerphone import Speakerphone
from tests.speech import speech_samples

pytestmark = pytest.mark.slow

QUESTIONS = ["What is the capital of France?", "How many days are there in a week?"]


async def test_the_bot_does_not_interrupt_itself_on_a_speakerphone(server: Server, tmp_path: Path) -> None:
    client = VoiceClient(server.ws_url, 16000)
    await client.connect()
    phone = Speakerphone(client, level_db=-10.0, delay_ms=200.0)
    phone.start()
    try:
        for question in QUESTIONS:
            mark = len(client.received)
            phone.say(speech_samples(question, tmp_path))
            done = await client.wait_for(lambda e: e["type"] == "response.done", 120, after=mark)
            await asyncio.sleep(2.0)  # the reply's echo dies away, heard by the microphone all along
            replies = [e for e in client.events("response.done")]
            assert done["status"] == "completed", done
            assert all(e["status"] == "completed" for e in replies), replies
        assert len(client.events("response.done")) == len(QUESTIONS), client.events("response.done")
    finally:
        await phone.stop()
        await client.close()


STORYTELLER = (
    "You are a storyteller on a phone call. Whatever you are asked, answer with a long, detailed story "
    "of at least ten sentences. Never stop early."
)


async def test_the_caller_still_interrupts_over_the_echo(server: Server, tmp_path: Path) -> None:
    client = VoiceClient(server.ws_url, 16000)
    await client.connect(instructions=STORYTELLER)
    rate = client.session["output_audio"]["sample_rate"]
    phone = Speakerphone(client, level_db=-10.0, delay_ms=200.0)
    phone.start()
    try:
        phone.say(speech_samples("Tell me a story about a brave little dragon.", tmp_path))
        deadline = time.monotonic() + 120
        while sum(len(r.audio) for r in client.received if r.audio) < 2 * rate * 4.0:  # 4 s of the story
            assert time.monotonic() < deadline, "no reply audio arrived"
            assert not client.events("response.done"), client.events("response.done")  # it did not stop itself
            await asyncio.sleep(0.05)
        mark = len(client.received)
        phone.say(speech_samples("Wait, stop please, I have another question.", tmp_path))
        started = await client.wait_for(lambda e: e["type"] == "speech.started", 10, after=mark)
        done = await client.wait_for(lambda e: e["type"] == "response.done" and e["turn_id"] == 1, 15, after=mark)
        assert done["status"] == "interrupted" and started["turn_id"] > 1
    finally:
        await phone.stop()
        await client.close()
