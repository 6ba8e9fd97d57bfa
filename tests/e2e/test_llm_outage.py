"""The LLM server is down or stalls: the caller hears a short spoken apology soon after they stop
speaking, gets an error event and a failed response, and the call goes on (real server, real audio).

The voice service runs with the OpenAI-compatible backend (`llm.engine=openai`) pointed at a port
where nothing listens (which also proves the service starts without its LLM server), or at a fake
LLM server that accepts the request and then sends no token.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.client import VoiceClient
from tests.e2e.conftest import Server, kept_call, start_server, stop_server
from tests.models.test_llm_openai import SSE_HEAD, Exchange, FakeLLMServer, delta, http_answer
from tests.speech import speech_samples

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def outage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    llm_url = f"http://127.0.0.1:{_free_port()}/v1"
    env = {"VOICE_AGENT_LLM__ENGINE": "openai", "VOICE_AGENT_LLM__BASE_URL": llm_url,
           "VOICE_AGENT_LLM__REMOTE_MODEL": ""}
    server, proc = start_server(tmp_path_factory.mktemp("outage"), env, timeout=480)
    yield server, llm_url
    stop_server(proc)


def sample_value(server: Server, name: str, labels: dict[str, str]) -> float:
    text = httpx.get(server.base_url + "/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


async def ask_expecting_an_apology(client: VoiceClient, question: str, tmp_path: Path,
                                   llm_url: str) -> tuple[float, float]:
    """Speak `question`; check the error, the apology audio and the failed response; return the
    seconds from transcript.final to the error event and to the first apology audio."""
    out_rate = client.session["output_audio"]["sample_rate"]
    mark = len(client.received)
    await client.stream(speech_samples(question, tmp_path))
    trailing = asyncio.create_task(client.silence(2.0))
    final = await client.wait_for(lambda e: e["type"] == "transcript.final", 30, after=mark)
    error = await client.wait_for(lambda e: e["type"] == "error", 30, after=mark)
    done = await client.wait_for(lambda e: e["type"] == "response.done", 30, after=mark)
    await trailing

    # the caller is told what to do, not where the LLM server is (that is for the log and the record)
    assert error["code"] == "llm_unavailable" and llm_url not in error["message"], error
    assert "not reachable" in error["message"], error
    assert error["turn_id"] == done["turn_id"] == final["turn_id"]
    assert done["status"] == "failed" and done["text"] == ""

    turn = client.received[mark:]
    final_at = next(r.at for r in turn if r.event is not None and r.event["type"] == "transcript.final")
    error_at = next(r.at for r in turn if r.event is not None and r.event["type"] == "error")
    audio = [r for r in turn if r.audio is not None]
    assert audio, "no apology audio"
    assert audio[0].at >= final_at
    pcm = np.frombuffer(b"".join(r.audio or b"" for r in audio), dtype="<i2")
    assert len(pcm) / out_rate > 1.0 and np.abs(pcm).max() > 1000  # a spoken sentence, not silence
    assert not client.closed
    return error_at - final_at, audio[0].at - final_at


async def test_llm_down_gives_an_apology_and_the_call_goes_on(outage: tuple[Server, str], tmp_path: Path) -> None:
    server, llm_url = outage
    assert "LLM server not ready at start-up" in server.log()  # warned, started anyway

    client = VoiceClient(server.ws_url, 16000)
    started = await client.connect()
    assert started["type"] == "session.started", started
    for question in ("What is the capital of France?", "How many days are there in a week?"):
        to_error, to_audio = await ask_expecting_an_apology(client, question, tmp_path, llm_url)
        assert to_error < 1.0, to_error
        assert to_audio < 1.5, to_audio  # the apology starts

    assert len(client.events("error")) == 2
    await client.close()
    # the call's record: both turns failed, with the error, what the caller said, nothing heard
    kept = await kept_call(server, client.session["session_id"], 2)
    assert kept["call"]["status"] == "failed" and kept["call"]["errors"] == 2, kept["call"]
    for turn, final in zip(kept["turns"], client.events("transcript.final"), strict=True):
        assert turn["status"] == "failed" and "llm_unavailable" in (turn["error"] or ""), turn
        assert llm_url in turn["error"], turn  # the record keeps the detail the caller was not shown
        assert turn["user_text"] == final["text"] and turn["heard_text"] == "" and turn["generated_text"] == ""
    assert sample_value(server, "voice_agent_errors_total", {"code": "llm_unavailable"}) == 2
    assert sample_value(server, "voice_agent_turns_total", {"status": "failed"}) == 2
    assert server.log().count("LLM failed after no text") == 2
    assert llm_url in server.log()


async def test_llm_that_stops_answering_gives_an_apology(tmp_path: Path) -> None:
    """A fake LLM server lists its model, accepts each chat request, sends the first (empty) chunk
    and then nothing: after read_timeout_s (1 s, retried once) the caller hears the apology."""

    async def script(ex: Exchange, n: int) -> None:
        if ex.method == "GET":
            await ex.send(http_answer(200, json.dumps({"object": "list", "data": [{"id": "stuck-7b"}]})))
        else:
            await ex.send(SSE_HEAD, delta(role=True))
            await ex.stall()

    fake = FakeLLMServer(script)
    async with fake.running():
        # timed from the final transcript: no preemptive reply may ask the LLM before it
        env = {"VOICE_AGENT_LLM__ENGINE": "openai", "VOICE_AGENT_LLM__BASE_URL": fake.base_url,
               "VOICE_AGENT_LLM__READ_TIMEOUT_S": "1", "VOICE_AGENT_LLM__RETRIES_BEFORE_FIRST_TOKEN": "1",
               "VOICE_AGENT_SESSION__PREEMPTIVE": "false"}
        server, proc = await asyncio.to_thread(start_server, tmp_path, env, 480)
        try:
            client = VoiceClient(server.ws_url, 16000)
            await client.connect()
            to_error, to_audio = await ask_expecting_an_apology(
                client, "What is the capital of France?", tmp_path, fake.base_url)
            # two tries of 1 s each, then the apology within a second
            assert 2.0 <= to_error < 3.0, to_error
            assert to_audio - to_error < 1.0, (to_error, to_audio)
            posts = [e for e in fake.exchanges if e.method == "POST"]
            assert len(posts) == 2 and posts[0].json()["model"] == "stuck-7b"
            assert all(e.client_closed for e in posts)  # both stalled requests were hung up on
            await client.close()
            assert "stalled" in server.log()
        finally:
            await asyncio.to_thread(stop_server, proc)
