"""Echo: a caller on a speakerphone, whose microphone hears the bot's reply again 200 ms later and 10 dB down
through a small room (tests/speakerphone.py), with the real models over /ws. The bot must not take its own voice
for the caller's, and the caller must still be able to interrupt it. (Without echo cancellation the same calls
interrupt themselves: bench/echo_calls.py, docs/benchmarks.md.) Each call's first reply is where the line's echo
is found (in its first 0.7 s, before which the bot's echo can still stop it); what is asserted is the call
after it."""

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
STORYTELLER = (
    "You are a storyteller on a phone call. Whatever you are asked, answer with a long, detailed story "
    "of at least ten sentences. Never stop early."
)


def turn_lines(server: Server, last: int = 40) -> str:
    """The server's log lines about turns (their ends, barge-ins, take-backs), the last `last` of them."""
    return "\n".join([line for line in server.log().splitlines() if "turn " in line][-last:])


async def first_reply(client: VoiceClient, phone: Speakerphone, tmp_path: Path, question: str = "Hello there.") -> None:
    """The call's first question and its reply, heard back by the microphone: the line's echo is found in it."""
    mark = len(client.received)
    phone.say(speech_samples(question, tmp_path))
    await client.wait_for(lambda e: e["type"] == "response.done", 120, after=mark)
    await asyncio.sleep(2.0)


async def at_rest(client: VoiceClient, mark: int, settle_s: float = 2.5, timeout: float = 60.0) -> list[dict]:
    """The replies since `mark` once the call is at rest: every reply begun is done and nothing came for settle_s
    (its echo died away, and anything it set off came out). Without echo cancellation a speakerphone call never
    comes to rest: the bot answers its own voice, which it hears again (bench/echo_calls.py)."""
    deadline = time.monotonic() + timeout
    while True:
        got = client.received[mark:]
        begun = {r.event["turn_id"] for r in got if r.event and r.event["type"] == "response.text.delta"}
        done = [r.event for r in got if r.event and r.event["type"] == "response.done"]
        if done and begun <= {d["turn_id"] for d in done} and time.monotonic() - got[-1].at > settle_s:
            return done
        assert time.monotonic() < deadline, f"the call never came to rest: {done}"
        await asyncio.sleep(0.1)


async def test_the_bot_does_not_answer_itself_on_a_speakerphone(server: Server, tmp_path: Path) -> None:
    """Each question gets its answer whole and the call comes to rest. At a reply's start the echo can still stop
    it once (taken back as if the caller went on; 1 reply in 50 in the benchmark), and the question is answered
    again; never more, and the echo is never answered."""
    client = VoiceClient(server.ws_url, 16000)
    await client.connect()
    phone = Speakerphone(client, level_db=-10.0, delay_ms=200.0)
    phone.start()
    try:
        await first_reply(client, phone, tmp_path)
        for question in QUESTIONS:
            mark = len(client.received)
            phone.say(speech_samples(question, tmp_path))
            replies = await at_rest(client, mark)
            assert replies[-1]["status"] == "completed", replies
            assert len(replies) == 1 or (len(replies) == 2 and replies[0]["status"] == "interrupted"), replies
    finally:
        await phone.stop()
        await client.close()


async def test_the_caller_still_interrupts_over_the_echo(server: Server, tmp_path: Path) -> None:
    client = VoiceClient(server.ws_url, 16000)
    await client.connect(instructions=STORYTELLER)
    rate = client.session["output_audio"]["sample_rate"]
    phone = Speakerphone(client, level_db=-10.0, delay_ms=200.0)
    phone.start()
    try:
        # A story from the first turn: a refusal there (the recognizer once heard "Hello there." as "The lone air.",
        # which the honesty gate declines) is copied by the 0.5B model into the story requests after it.
        await first_reply(client, phone, tmp_path, "Tell me a story about a cat.")
        deadline = time.monotonic() + 180
        short: list[dict] = []  # the replies that ended before 4 s, to read a failure by
        for _ in range(3):  # a reply that ends by itself before 4 s (the 0.5B model once refused) is asked again
            story = len(client.received)
            phone.say(speech_samples("Tell me a story about a brave little dragon.", tmp_path))
            while sum(len(r.audio) for r in client.received[story:] if r.audio) < 2 * rate * 4.0:  # 4 s of the story
                assert time.monotonic() < deadline, "no reply audio arrived"
                done = [(i, r.event) for i, r in enumerate(client.received) if i >= story and r.event
                        and r.event["type"] == "response.done"]
                # A reply taken back at its start (the echo or the question's end heard as the caller going on,
                # as in the test above) is answered again: its audio is not the story's.
                if done and done[-1][1].get("taken_back"):
                    story = done[-1][0] + 1
                    continue
                # it did not stop itself (the server's account of the turns, to read a failure by)
                assert all(e["status"] == "completed" for _, e in done), (done, turn_lines(server))
                if done:
                    short.append(done[-1][1])
                    break
                await asyncio.sleep(0.05)
            else:
                break  # 4 s of the story, the bot still talking
            await asyncio.sleep(2.5)  # the call at rest before asking again
        else:
            raise AssertionError(f"three replies ended before 4 s of audio: no story to interrupt: {short}\n"
                                 f"{turn_lines(server)}")
        mark = len(client.received)
        phone.say(speech_samples("Wait, stop please, I have another question.", tmp_path))
        started = await client.wait_for(lambda e: e["type"] == "speech.started", 10, after=mark)
        done = await client.wait_for(lambda e: e["type"] == "response.done", 15, after=mark)
        assert done["status"] == "interrupted" and started["turn_id"] > done["turn_id"], (done, started)
    finally:
        await phone.stop()
        await client.close()
