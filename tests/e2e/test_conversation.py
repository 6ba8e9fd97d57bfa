"""A caller asks a spoken question over /ws and hears a spoken answer (real models, real audio)."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import numpy as np
import pytest

from app.client import VoiceClient
from models.config import AsrConfig
from models.speech.asr_faster_whisper import FasterWhisperRecognizer
from pipeline.audio import resample
from pipeline.turns import MARKS
from tests.e2e.conftest import Server, ask_once
from tests.speech import speech_samples, words

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def recognizer() -> FasterWhisperRecognizer:
    return FasterWhisperRecognizer(AsrConfig())


async def ask(server: Server, question: str, tmp: Path, rate: int) -> tuple[VoiceClient, dict, dict, bytes]:
    client = await ask_once(server, question, tmp, rate, lead_s=0.4)
    final = client.events("transcript.final")[0]
    done = client.events("response.done")[0]
    audio = client.audio_between(0)
    await client.close()
    return client, final, done, audio


@pytest.mark.parametrize(("rate", "question", "expect"), [
    (16000, "What is the capital of Italy?", {"capital", "italy"}),
    (48000, "What color is the sky on a clear day?", {"color", "sky"}),
    (8000, "How many days are there in a week?", {"days", "week"}),
])
async def test_spoken_question_gets_a_spoken_answer(
    server: Server, tmp_path: Path, recognizer: FasterWhisperRecognizer, rate: int, question: str, expect: set[str]
) -> None:
    client, final, done, audio = await ask(server, question, tmp_path, rate)

    assert expect <= set(words(final["text"])), final
    assert done["status"] == "completed"
    deltas = "".join(e["text"] for e in client.events("response.text.delta") if e["turn_id"] == done["turn_id"])
    assert words(deltas) == words(done["text"]) and words(deltas), (deltas, done["text"])

    # every latency mark, in pipeline order, measured from speech_end
    marks = done["latency_ms"]
    assert list(marks) == list(MARKS), marks
    values = [marks[m] for m in MARKS]
    if done["preemptive"]:
        # started at a pause on the transcript made there: the reply's own marks are in order, and
        # may come before speech_end (negative), but nothing was sent before the turn was over
        assert values[0] == 0.0 and 0 <= marks["asr_final"] <= marks["first_audio_sent"], marks
        assert all(a <= b for a, b in itertools.pairwise(values[2:])), marks
    else:
        assert values[0] == 0.0 and all(a <= b for a, b in itertools.pairwise(values[1:])), marks
    assert done["voice_to_voice_ms"] >= marks["first_audio_sent"]
    assert done["llm"]["completion_tokens"] > 0 and done["llm"]["prefill_tokens"] < done["llm"]["prompt_tokens"]

    # the reply audio says the reply text
    out_rate = client.session["output_audio"]["sample_rate"]
    pcm = np.frombuffer(audio, dtype="<i2").astype(np.float32) / 32768
    assert len(pcm) / out_rate > 0.5
    heard = words(recognizer.transcribe(resample(pcm, out_rate, 16000)))
    said = words(done["text"])
    overlap = len(set(heard) & set(said)) / len(set(said))
    assert overlap >= 0.6, (heard, said)


async def test_two_turns_keep_the_conversation(server: Server, tmp_path: Path) -> None:
    client = VoiceClient(server.ws_url, 16000)
    await client.connect(instructions="You are a helpful assistant. Answer in one short sentence.")
    background = asyncio.create_task(asyncio.sleep(0))
    dones = []
    for question in ("My name is Alice.", "What is my name?"):
        await background
        await client.stream(speech_samples(question, tmp_path))
        # silence as a phone streams it: long enough for a turn the end-of-turn model judges
        # unfinished (espeak's voice often sounds so) to end on silence
        background = asyncio.create_task(client.silence(2.5))
        count = len(dones)
        done = await client.wait_for(
            lambda e, n=count: e["type"] == "response.done" and e["turn_id"] == n + 1, 90)
        dones.append(done)
    background.cancel()
    await client.close()
    assert "alice" in words(dones[1]["text"]), dones[1]
    # the second turn reused the first turn's KV cache: only its new tokens were computed
    llm = dones[1]["llm"]
    assert llm["prefill_tokens"] < llm["prompt_tokens"] / 2, llm
