"""/v1/realtime driven by the unmodified official `openai` SDK (GA `client.realtime.connect`, and the
beta client): real speech in, the real models, reply audio out, transcribed back and checked; a
barge-in with `conversation.item.truncate`; a typed message; an error for a malformed event."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from openai import AsyncOpenAI

from models.config import AsrConfig
from models.speech.asr_faster_whisper import FasterWhisperRecognizer
from pipeline.audio import alaw_to_pcm16, pcm16_to_mulaw, resample
from tests.e2e.conftest import Server, kept_call
from tests.speech import speech_samples, words

pytestmark = pytest.mark.slow

GA_SESSION: Any = {"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                                                      "turn_detection": {"type": "server_vad"}},
                                            "output": {"format": {"type": "audio/pcm", "rate": 24000}}}}
STORYTELLER = ("You are a storyteller on a phone call. Whatever you are asked, answer with a long, detailed story "
               "of at least ten sentences. Never stop early.")


@pytest.fixture(scope="module")
def recognizer() -> FasterWhisperRecognizer:
    return FasterWhisperRecognizer(AsrConfig())


class Line:
    """One SDK connection: every server event kept (as dicts), audio sent in real time as 100 ms
    appends, silence between."""

    def __init__(self, connection: Any, rate: int, encoding: str) -> None:
        self.connection = connection
        self.rate = rate
        self.encoding = encoding
        self.events: list[dict[str, Any]] = []
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for event in self.connection:
            self.events.append(event.model_dump(exclude_unset=True) | {"type": event.type})

    async def say(self, samples: np.ndarray) -> None:
        """int16 samples at the line's rate, in real time."""
        pcm = samples.astype("<i2").tobytes()
        data = pcm if self.encoding == "pcm" else pcm16_to_mulaw(pcm)
        step = self.rate // 10 * (2 if self.encoding == "pcm" else 1)
        for i in range(0, len(data), step):
            await self.connection.input_audio_buffer.append(audio=base64.b64encode(data[i:i + step]).decode())
            await asyncio.sleep(0.1)

    @contextlib.asynccontextmanager
    async def silence(self) -> AsyncIterator[None]:
        async def quiet() -> None:
            while True:
                await self.say(np.zeros(self.rate // 10, dtype=np.int16))

        task = asyncio.create_task(quiet())
        try:
            yield
        finally:
            task.cancel()

    async def wait_for(self, kind: str, timeout: float = 90, after: int = 0, **match: Any) -> dict[str, Any]:
        async def look() -> dict[str, Any]:
            while True:
                for event in self.events[after:]:
                    if event["type"] == kind and all(event.get(k) == v for k, v in match.items()):
                        return event
                assert not self.reader.done(), "the connection ended"
                await asyncio.sleep(0.05)

        return await asyncio.wait_for(look(), timeout)

    def of(self, kind: str, after: int = 0) -> list[dict[str, Any]]:
        return [e for e in self.events[after:] if e["type"] == kind]


def ga_client(server: Server) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.base_url + "/v1", api_key="not-needed-here")


async def test_the_official_sdk_asks_a_spoken_question_and_hears_the_answer(
        server: Server, tmp_path: Path, recognizer: FasterWhisperRecognizer) -> None:
    async with ga_client(server).realtime.connect(model="gpt-realtime") as connection:
        line = Line(connection, 24000, "pcm")
        await connection.session.update(session=GA_SESSION)
        await line.wait_for("session.updated", 10)
        assert line.events[0]["type"] == "session.created"
        await line.say(speech_samples("What is the capital of Italy?", tmp_path, 24000))
        async with line.silence():
            done = await line.wait_for("response.done")
        transcript = line.of("conversation.item.input_audio_transcription.completed")[0]
        assert {"capital", "italy"} <= set(words(transcript["transcript"])), transcript
        for kind in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                     "input_audio_buffer.committed", "response.created", "response.output_item.added",
                     "response.content_part.added", "response.output_audio_transcript.done"):
            assert line.of(kind), kind
        response = done["response"]
        assert response["status"] == "completed", response
        said = response["output"][0]["content"][0]["transcript"]
        assert "rome" in words(said), said
        deltas = "".join(e["delta"] for e in line.of("response.output_audio_transcript.delta"))
        assert words(deltas) == words(said)
        # our own figures ride along in a field the SDK keeps as an extra
        ours = response["voice_agent"]
        marks = ours["latency_ms"]  # ms since the end-of-turn decision, each stage's first
        assert set(marks) >= {"llm_first_token", "first_phrase", "tts_first_audio", "first_audio_sent"}, marks
        assert marks["llm_first_token"] <= marks["tts_first_audio"] <= marks["first_audio_sent"], marks
        assert ours["voice_to_voice_ms"] > 0  # audio went out after the caller's speech really ended
        pcm = b"".join(base64.b64decode(e["delta"]) for e in line.of("response.output_audio.delta"))
        audio = (np.frombuffer(pcm, dtype="<i2") / 32768).astype(np.float32)
        heard = words(recognizer.transcribe(resample(audio, 24000, 16000)))
        assert len(set(heard) & set(words(said))) / len(set(words(said))) >= 0.6, (heard, said)


async def test_the_beta_client_gets_the_beta_events_and_g711(server: Server, tmp_path: Path) -> None:
    client = AsyncOpenAI(api_key="not-needed-here", websocket_base_url=server.base_url.replace("http", "ws") + "/v1")
    async with client.beta.realtime.connect(model="gpt-4o-realtime-preview") as connection:
        line = Line(connection, 8000, "pcmu")
        beta_session: Any = {"modalities": ["audio", "text"], "input_audio_format": "g711_ulaw",
                             "output_audio_format": "g711_alaw", "turn_detection": {"type": "server_vad"}}
        await connection.session.update(session=beta_session)
        updated = await line.wait_for("session.updated", 10)
        assert updated["session"]["output_audio_format"] == "g711_alaw"
        await line.say(speech_samples("How many days are there in a week?", tmp_path, 8000))
        async with line.silence():
            done = await line.wait_for("response.done")
        assert done["response"]["status"] == "completed"
        assert line.of("conversation.item.created") and not line.of("conversation.item.added")
        alaw = b"".join(base64.b64decode(e["delta"]) for e in line.of("response.audio.delta"))
        assert len(alaw) > 8000 * 0.5  # more than half a second of 8 kHz A-law
        assert np.abs(np.frombuffer(alaw_to_pcm16(alaw), dtype="<i2")).max() > 1000  # and not silence
        said = "".join(e["delta"] for e in line.of("response.audio_transcript.delta"))
        assert {"seven", "7"} & set(words(said)), said


async def test_a_barge_in_with_truncate_keeps_what_was_heard(server: Server, tmp_path: Path) -> None:
    async with ga_client(server).realtime.connect(model="gpt-realtime") as connection:
        line = Line(connection, 24000, "pcm")
        storyteller: Any = {**GA_SESSION, "instructions": STORYTELLER}
        await connection.session.update(session=storyteller)
        await line.wait_for("session.updated", 10)
        await line.say(speech_samples("Tell me a story about a brave little dragon.", tmp_path, 24000))
        async with line.silence():
            while sum(len(e["delta"]) for e in line.of("response.output_audio.delta")) * 3 / 4 < 2 * 24000 * 1.5:
                await asyncio.sleep(0.05)
        mark = len(line.events)
        first = line.of("response.created")[0]["response"]["id"]
        item_id = line.of("response.output_item.added")[0]["item"]["id"]
        barge = asyncio.create_task(line.say(speech_samples("Wait, stop please.", tmp_path, 24000)))
        await line.wait_for("input_audio_buffer.speech_started", 10, after=mark)
        # as the Agents SDK does: what played so far (here: a second), then let the server decide
        await connection.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=1000)
        truncated = await line.wait_for("conversation.item.truncated", 10, after=mark)
        assert truncated["audio_end_ms"] == 1000
        done = await line.wait_for("response.done", 30, after=mark)
        await barge
        assert done["response"]["id"] == first and done["response"]["status"] == "cancelled", done
        assert done["response"]["status_details"]["reason"] == "turn_detected"
        kept = words(done["response"]["output"][0]["content"][0]["transcript"])
        generated = words("".join(e["delta"] for e in line.of("response.output_audio_transcript.delta")))
        assert kept and len(kept) < len(generated) and kept[:-1] == generated[:len(kept) - 1], (kept, generated)
        assert len(kept) < 12, kept  # about one second of speech was heard
        async with line.silence():  # the caller's words get their own answer
            second = await line.wait_for("response.done", 90, after=line.events.index(done) + 1)
        assert second["response"]["id"] != first and second["response"]["status"] == "completed", second


async def test_a_typed_message_gets_a_spoken_answer_a_text_one_and_the_call_is_kept(server: Server) -> None:
    async with ga_client(server).realtime.connect(model="gpt-realtime") as connection:
        line = Line(connection, 24000, "pcm")
        session_id = (await line.wait_for("session.created", 10))["session"]["id"]
        await connection.send({"type": "input_audio_buffer.append", "audio": "not base64!", "event_id": "evt_bad"})
        error = await line.wait_for("error", 10)
        assert error["error"]["event_id"] == "evt_bad" and error["error"]["param"] == "audio", error
        await connection.conversation.item.create(item={
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is two plus two?"}]})
        await connection.response.create()
        done = await line.wait_for("response.done")
        said = done["response"]["output"][0]["content"][0]["transcript"]
        assert {"four", "4"} & set(words(said)), said
        assert line.of("response.output_audio.delta")
        mark = len(line.events)
        await connection.conversation.item.create(item={
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "And three plus three?"}]})
        await connection.response.create(response={"output_modalities": ["text"]})
        text_done = await line.wait_for("response.done", 90, after=mark)
        written = text_done["response"]["output"][0]["content"][0]
        assert written["type"] == "output_text" and {"six", "6"} & set(words(written["text"])), written
        assert not line.of("response.output_audio.delta", after=mark)  # a text reply: no audio
        assert words("".join(e["delta"] for e in line.of("response.output_text.delta", after=mark))) == words(
            written["text"])
        # each response began with the client's limits, as the guard counts them
        limits = line.of("rate_limits.updated")
        assert len(limits) == 2 and limits[0]["rate_limits"][0]["name"] == "requests", limits
        # an out-of-band response with its own input, then the first question deleted
        mark = len(line.events)
        await connection.response.create(response={
            "conversation": "none", "output_modalities": ["text"],
            "input": [{"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "What is ten plus ten?"}]}]})
        oob = await line.wait_for("response.done", 90, after=mark)
        answer = oob["response"]["output"][0]["content"][0]["text"]
        assert oob["response"]["conversation_id"] is None and {"twenty", "20"} & set(words(answer)), answer
        first_item = line.of("conversation.item.added")[0]["item"]["id"]
        await connection.conversation.item.delete(item_id=first_item)
        assert (await line.wait_for("conversation.item.deleted", 10))["item_id"] == first_item
    # the QA store keeps a Realtime call like any other
    record = await kept_call(server, session_id, 3)
    assert record["call"]["transport"] == "realtime" and len(record["turns"]) == 3, record["call"]
    assert [t["user_text"] for t in record["turns"]][:2] == ["What is two plus two?", "And three plus three?"]
