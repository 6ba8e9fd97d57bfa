"""Every call is kept (issue 11): after real calls (real models, real sockets, real audio) the QA API
returns each turn with the numbers the caller was sent, the stereo recording holds both voices, and
a server killed mid-call keeps every turn that had finished. The barged-in and the failed (LLM
outage) calls are checked where those calls are made: test_barge_in.py and test_llm_outage.py."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from app.client import VoiceClient
from app.store import CallStore, StorageConfig
from tests.e2e.conftest import Server, ask_once, kept_call, start_server, stop_server
from tests.speech import speech_samples

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def qa_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Any, Path]]:
    data = tmp_path_factory.mktemp("qa-data")
    server, proc = start_server(tmp_path_factory.mktemp("qa"), env={
        "VOICE_AGENT_STORAGE__DATA_DIR": str(data), "VOICE_AGENT_STORAGE__RECORDINGS": "true"})
    yield server, proc, data
    if proc.poll() is None:
        stop_server(proc)


async def test_a_finished_call_is_kept_with_its_numbers_and_recording(qa_server: tuple[Server, Any, Path],
                                                                       tmp_path: Path) -> None:
    server = qa_server[0]
    client = await ask_once(server, "What is the capital of Italy?", tmp_path, lead_s=0.5)
    done = client.events("response.done")[0]
    final = client.events("transcript.final")[0]
    call_id = client.session["session_id"]
    await client.close()

    body = await kept_call(server, call_id, 1)
    call, turn = body["call"], body["turns"][0]
    assert call["transport"] == "ws" and call["status"] == "completed" and call["turns"] == 1
    assert call["end_reason"] == "hangup" and call["duration_s"] > 1
    assert turn["status"] == "completed" and not turn["barge_in"]
    assert turn["user_text"] == final["text"]
    assert turn["heard_text"] == turn["sent_text"] == turn["generated_text"] == done["text"]
    assert turn["latency_ms"] == done["latency_ms"]  # every stage, to the tenth of a ms the caller was sent
    assert turn["voice_to_voice_ms"] == done["voice_to_voice_ms"]
    assert call["v2v_median_ms"] == done["voice_to_voice_ms"]
    assert turn["spec"]["completion_tokens"] == done["llm"]["completion_tokens"]
    assert 0.5 < turn["offset_s"] < call["duration_s"]

    # the recording: the caller on the left, the bot on the right, on one timeline
    assert call["has_recording"]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as http:
        deadline = time.monotonic() + 20
        while (response := await http.get(f"/api/calls/{call_id}/recording")).status_code == 404:
            assert time.monotonic() < deadline, "no recording"
            await asyncio.sleep(0.2)
    assert response.headers["content-type"].startswith("audio/")
    with wave.open(io.BytesIO(response.content)) as wav:
        rate, channels = wav.getframerate(), wav.getnchannels()
        frames = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").reshape(-1, channels)
    assert channels == 2
    caller, bot = (np.abs(frames[:, c].astype(np.float32)) > 500 for c in (0, 1))
    speech_end = turn["offset_s"]
    first_bot = np.flatnonzero(bot)[0] / rate
    # the caller speaks before the turn ends; the bot starts after it, within the turn's own figures
    assert caller[: int(speech_end * rate)].any() and not caller[int((speech_end + 0.3) * rate):].any()
    assert speech_end < first_bot < speech_end + turn["latency_ms"]["first_audio_sent"] / 1000 + 0.5
    assert not bot[: int(speech_end * rate)].any()


async def test_killing_the_server_keeps_every_finished_turn(qa_server: tuple[Server, Any, Path],
                                                            tmp_path: Path) -> None:
    server, proc, data = qa_server
    client = VoiceClient(server.ws_url, 16000)
    await client.connect(instructions="You are a storyteller. Answer every question with a long story.")
    call_id = client.session["session_id"]
    await client.stream(speech_samples("What is the capital of Italy?", tmp_path))
    # silence while the story plays (as a phone line sends it), stopped while the next question
    # goes out, then again after it: two streams at once would interleave their frames
    background = asyncio.create_task(client.silence(600))
    await client.wait_for(lambda e: e["type"] == "response.done", 180)
    background.cancel()
    mark = len(client.received)
    await client.stream(speech_samples("Tell me about the moon.", tmp_path))
    trailing = asyncio.create_task(client.silence(600))
    await client.wait_for(lambda e: e["type"] == "response.text.delta", 60, after=mark)  # mid-reply
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    trailing.cancel()
    with contextlib.suppress(Exception):  # the server is gone
        await client.close(end=False)

    store = CallStore(StorageConfig(data_dir=str(data)))
    await store.open()
    try:
        kept = await store.get_call(call_id)
    finally:
        await store.close()
    assert kept is not None, "the call was lost"
    call, turns = kept
    assert [t.turn_id for t in turns] == [1] and turns[0].status == "completed" and turns[0].heard_text
    assert call.ended_at is None  # it never ended: the server died under it
