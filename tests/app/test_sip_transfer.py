"""Warm transfers on SIP (app/transports/sip/warm.py) with real SIP stacks on real sockets: baresip
as the caller and as the person the call is handed to, the server in this process with fake
engines (named as fakes: FakeLLM calls transfer_call, FakeSynthesizer says 0.1 s of a 200 Hz tone
a word, FakeVad hears loud audio as speech). Each side "talks" in a tone of its own, quiet enough
that the fake VAD never takes it for speech, so what each phone recorded tells who it heard, when."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from app.main import create_app
from app.settings import ServerConfig, Settings, SipConfig
from app.store.config import StorageConfig
from models.llm.tool_calls import ToolCall
from pipeline.config import AsrStageConfig, EndpointingConfig, ToolsConfig
from pipeline.session import Backends
from tests.app.live import serving
from tests.pipeline.fakes import FakeLLM, FakeRecognizer, FakeSynthesizer, FakeVad
from tests.sip_phone import Baresip, free_udp_port, need, write_wav

KEY = "k-sip-transfer-0123456789"
RATE = 8000
CALLER_HZ, PERSON_HZ, AGENT_HZ = 600, 1000, 200  # the caller's tone, the person's, the fake synthesizer's
SUMMARY = "Jordan wants to move a payment date."
MESSAGE = "Hello, this is the assistant with a caller for you. {summary} Putting them through now."
ANNOUNCED_WORDS = len(MESSAGE.replace("{summary}", SUMMARY).split())  # 21: 2.1 s of the fake voice


def tone(freq: float, seconds: float, level: float) -> np.ndarray:
    return (level * np.sin(2 * np.pi * freq * np.arange(int(seconds * RATE)) / RATE)).astype(np.float32)


def caller_microphone(tmp: Path) -> Path:
    """Half a second of silence, a loud second the fake VAD takes for the question, silence while
    the agent answers and calls the person, then the caller's own quiet tone from 9 s to 22 s."""
    quiet = np.zeros(int(7.5 * RATE), np.float32)
    parts = [np.zeros(RATE // 2, np.float32), tone(300, 1.0, 0.5), quiet, tone(CALLER_HZ, 13.0, 0.1)]
    return write_wav(tmp / "caller.wav", np.concatenate(parts))


def level_at(audio: np.ndarray, freq: float, window_s: float = 0.25) -> np.ndarray:
    """The amplitude of `freq` in each window of `audio`."""
    n = int(window_s * RATE)
    frames = audio[: len(audio) // n * n].reshape(-1, n)
    bin_ = round(freq * n / RATE)
    return np.asarray(2 * np.abs(np.fft.rfft(frames, axis=1)[:, bin_]) / n)


def heard_from(audio: np.ndarray, freq: float, window_s: float = 0.25) -> float | None:
    """When `freq` is first heard (seconds into the recording), or None."""
    loud = np.flatnonzero(level_at(audio, freq, window_s) > 0.03)
    return float(loud[0] * window_s) if len(loud) else None


@contextlib.asynccontextmanager
async def server(tmp: Path, llm: FakeLLM, tools: ToolsConfig) -> AsyncIterator[tuple[int, str, Any]]:
    """The app with SIP on (127.0.0.1 a trusted trunk): its SIP port, HTTP address and runtime."""
    sip_port = free_udp_port()
    settings = Settings(
        tools=tools,
        endpointing=EndpointingConfig(min_speech_ms=64, end_silence_ms=256, prefix_padding_ms=100),
        asr_stage=AsrStageConfig(partials=False),
        server=ServerConfig(api_keys=[KEY], log_caller_content="info"),  # type: ignore[list-item]
        storage=StorageConfig(url=f"sqlite:///{tmp}/calls.db", data_dir=str(tmp)),
        sip=SipConfig(enabled=True, host="127.0.0.1", port=sip_port, trusted_addresses=["127.0.0.1/32"]),
    )
    app = create_app(settings, backends=Backends(FakeVad(), FakeRecognizer(["Put me through to billing."]),  # type: ignore[arg-type]
                                                 FakeSynthesizer(), llm))
    async with serving(app, stop_s=20) as host:
        yield sip_port, host, app.state.runtime


def calling_billing() -> FakeLLM:
    return FakeLLM([[ToolCall("call_tr", "transfer_call", json.dumps({"target": "billing", "summary": SUMMARY}))],
                    "I am putting you through now."])


async def the_record(host: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=f"http://{host}", headers={"authorization": f"Bearer {KEY}"},
                                 timeout=10) as http:
        deadline = asyncio.get_running_loop().time() + 20
        while True:
            calls = (await http.get("/api/calls")).json()["calls"]
            if calls and calls[0].get("ended_at"):
                found: dict[str, Any] = (await http.get(f"/api/calls/{calls[0]['id']}")).json()
                return found
            assert asyncio.get_running_loop().time() < deadline, calls
            await asyncio.sleep(0.2)


async def test_a_warm_transfer_tells_the_person_first_then_joins_the_two_calls(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    need("baresip")
    caplog.set_level("INFO", logger="app.transports.sip")
    person_port = free_udp_port()
    tools = ToolsConfig(transfer_targets={"billing": f"sip:billing@127.0.0.1:{person_port}"},
                        warm_transfers=["billing"], warm_transfer_message=MESSAGE)
    llm = calling_billing()
    async with server(tmp_path, llm, tools) as (sip_port, host, _):
        person = Baresip(tmp_path / "person", write_wav(tmp_path / "person.wav", tone(PERSON_HZ, 40.0, 0.1)),
                         port=person_port, user="billing")
        answering = await person.answering(40)
        caller = Baresip(tmp_path / "caller", caller_microphone(tmp_path))
        heard = await caller.run(30, dial=f"sip:agent@127.0.0.1:{sip_port}")
        person_heard = await answering
        record = await the_record(host)
    assert heard.established and person_heard.established, heard.log[-2000:] + person_heard.log[-2000:]
    assert re.search(r"joined to billing", caplog.text), caplog.text[-3000:]
    # the model was told the person took the call, and said so
    (_, result), = [(m.role, m.content) for m in llm.requests[1] if m.role == "tool"]
    assert json.loads(result)["connecting_to"] == "billing"
    caller_audio, person_audio = heard.audio(), person_heard.audio()
    # the person heard the announcement (the fake voice, a word 0.1 s), then, joined, the caller's tone
    announced = level_at(person_audio, AGENT_HZ, 0.1) > 0.05
    assert abs(int(announced.sum()) - ANNOUNCED_WORDS) <= 2, announced.sum()
    caller_heard_at = heard_from(person_audio, CALLER_HZ)
    assert caller_heard_at is not None and caller_heard_at > np.flatnonzero(announced)[-1] * 0.1
    # the caller heard the agent (the filler while the person was called, then its words), and the
    # person only after the agent's last words
    agent = np.flatnonzero(level_at(caller_audio, AGENT_HZ, 0.1) > 0.05)
    person_at = heard_from(caller_audio, PERSON_HZ, 0.1)
    assert len(agent) >= 6 and person_at is not None and person_at >= agent[-1] * 0.1, (agent, person_at)
    # while the person was called and told, the caller heard it ring (440 + 480 Hz), not silence
    ringing = np.flatnonzero(level_at(caller_audio, 440, 0.1) > 0.015)
    assert len(ringing) >= 3 and ringing[-1] * 0.1 < person_at, (ringing, person_at)
    assert record["call"]["end_reason"] == "transferred", record["call"]
    (tool_call,) = record["turns"][0]["tool_calls"]
    assert tool_call["name"] == "transfer_call" and "billing" in tool_call["arguments"]


async def test_a_person_who_does_not_answer_leaves_the_caller_with_the_agent(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    need("baresip")
    caplog.set_level("INFO", logger="app.transports.sip")
    nobody = free_udp_port()  # no phone answers there
    tools = ToolsConfig(transfer_targets={"billing": f"sip:billing@127.0.0.1:{nobody}"},
                        warm_transfers=["billing"], transfer_ring_timeout_s=3)
    llm = FakeLLM([[ToolCall("call_tr", "transfer_call", json.dumps({"target": "billing", "summary": SUMMARY}))],
                   "Billing is not answering right now."])
    async with server(tmp_path, llm, tools) as (sip_port, host, _):
        caller = Baresip(tmp_path / "caller", caller_microphone(tmp_path))
        heard = await caller.run(14, dial=f"sip:agent@127.0.0.1:{sip_port}")
        record = await the_record(host)
    assert heard.established, heard.log[-2000:]
    (result,) = [m.content for m in llm.requests[1] if m.role == "tool"]
    assert "billing did not answer" in result, result
    assert "joined to billing" not in caplog.text
    assert record["call"]["end_reason"] != "transferred", record["call"]
    # the agent's answer after the failed try was heard: 6 words of the fake voice, and nobody else
    assert (level_at(heard.audio(), AGENT_HZ, 0.1) > 0.05).sum() >= 6
    assert (level_at(heard.audio(), 440, 0.1) > 0.015).sum() >= 3  # it rang while billing was called
    assert heard_from(heard.audio(), PERSON_HZ) is None


async def test_a_person_who_hangs_up_before_the_calls_are_joined_gets_the_caller_cold(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Billing's phone hangs up 4 s after it answered: after the 2.1 s message, before the agent's 6 s answer
    to the caller has been heard and the calls would be joined. The caller is sent to them with a REFER."""
    need("baresip")
    caplog.set_level("INFO", logger="app.transports.sip")
    person_port = free_udp_port()
    tools = ToolsConfig(transfer_targets={"billing": f"sip:billing@127.0.0.1:{person_port}"},
                        warm_transfers=["billing"], warm_transfer_message=MESSAGE)
    long_answer = " ".join(["I am putting you through to billing now, thank you for waiting."] * 6)  # 66 words
    llm = FakeLLM([[ToolCall("call_tr", "transfer_call", json.dumps({"target": "billing", "summary": SUMMARY}))],
                   long_answer])
    async with server(tmp_path, llm, tools) as (sip_port, host, _):
        person = Baresip(tmp_path / "person", write_wav(tmp_path / "person.wav", tone(PERSON_HZ, 4.0, 0.1)),
                         port=person_port, user="billing")  # (baresip hangs up when its microphone's file ends)
        answering = await person.answering(30)
        caller = Baresip(tmp_path / "caller", caller_microphone(tmp_path))
        heard = await caller.run(24, dial=f"sip:agent@127.0.0.1:{sip_port}")
        person_heard = await answering
        record = await the_record(host)
    assert heard.established, heard.log[-2000:]
    assert "hung up after the message, before the calls were joined; sending the caller to them cold" in caplog.text
    assert "joined to billing" not in caplog.text and re.search(r"transferring the call to \S+ \(REFER\)", caplog.text)
    # billing's phone was called twice: by the server (the message), then by the caller's phone, following the REFER
    assert len(person_heard.recordings) == 2, person_heard.log[-3000:]
    assert record["call"]["end_reason"] == "transferred", record["call"]
