"""WebRTC calls (POST /v1/realtime/calls) over a real server, real UDP, DTLS-SRTP, Opus and SCTP, with
an aiortc caller (tests/webrtc_caller.py) and fake engines (named as fakes: the fake VAD hears speech
in a loud tone, the fake recognizer hears "hello", the fake LLM says REPLY). The real models' calls
are tests/e2e/test_webrtc.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from aiortc import RTCPeerConnection

from app.main import create_app
from app.settings import ServerConfig, Settings
from app.store.config import StorageConfig
from tests.app.fake_server import REPLY, fake_backends
from tests.app.live import live
from tests.webrtc_caller import MIC_RATE, WebRTCCaller

KEY = "k-webrtc-test-key-0123456789"


def tone(seconds: float, level: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * MIC_RATE)) / MIC_RATE
    return (level * np.sin(2 * np.pi * 300 * t)).astype(np.float32)


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    settings = Settings(server=ServerConfig(api_keys=[KEY]), storage=StorageConfig(enabled=False))
    with live(create_app(settings, backends=fake_backends(0.02))) as address:
        yield f"http://{address}"


async def test_a_call_is_answered_and_its_reply_is_heard_on_the_track(served: str) -> None:
    caller = WebRTCCaller(served, KEY)
    try:
        answer = await caller.call()
        assert answer.status_code == 201, answer.text
        assert answer.headers["content-type"].startswith("application/sdp") and answer.text.startswith("v=0")
        assert answer.headers["location"].startswith("/v1/realtime/calls/webrtc_")
        created = await caller.wait_for("session.created", 15)
        assert created["session"]["type"] == "realtime"
        await asyncio.sleep(0.3)
        spoke = caller.mic.say(tone(0.6))
        done = await caller.wait_for("response.done", 20)
        assert done["response"]["status"] == "completed", done
        transcript = done["response"]["output"][0]["content"][0]["transcript"]
        assert transcript.strip() == REPLY
        kinds = [e["type"] for e in caller.events]
        assert "output_audio_buffer.started" in kinds and "response.output_audio_transcript.delta" in kinds
        assert not any(k.startswith("response.output_audio.delta") for k in kinds)  # the audio is on the track
        await caller.wait_for("output_audio_buffer.stopped", 20)
        first = caller.heard.loud_since(spoke)
        assert first is not None, "no reply audio arrived on the track"
        assert caller.heard.seconds_loud(spoke) > 0.5
    finally:
        await caller.close()


async def test_a_peer_that_offers_only_g711_is_answered_in_it(served: str) -> None:
    caller = WebRTCCaller(served, KEY, codec="audio/PCMU")
    try:
        answer = await caller.call()
        assert answer.status_code == 201, answer.text
        rtpmaps = [line for line in answer.text.splitlines() if line.startswith("a=rtpmap:")]
        assert rtpmaps and all("PCMU/8000" in line for line in rtpmaps), rtpmaps
        await caller.wait_for("session.created", 15)
        caller.mic.say(tone(0.6))
        done = await caller.wait_for("response.done", 20)
        assert done["response"]["status"] == "completed", done
        assert caller.heard.seconds_loud(0.0) > 0.5
    finally:
        await caller.close()


async def test_speech_over_the_reply_clears_the_track_and_keeps_what_went_out(served: str) -> None:
    caller = WebRTCCaller(served, KEY)
    try:
        assert (await caller.call()).status_code == 201
        await caller.wait_for("session.created", 15)
        caller.mic.say(tone(0.6))
        started = await caller.wait_for("output_audio_buffer.started", 20)
        await asyncio.sleep(0.6)
        mark = len(caller.events)
        # longer than session.barge_in_max_hold_ms (1.5 s): the reply is cut while the caller still talks, so
        # the next turn's reply cannot begin within the silent stretch checked below
        caller.mic.say(tone(2.2))
        cleared = await caller.wait_for("output_audio_buffer.cleared", 10, after=mark)
        assert cleared["response_id"] == started["response_id"]
        done = await caller.wait_for("response.done", 10, after=mark)
        assert done["response"]["status"] == "cancelled"
        heard = done["response"]["output"][0]["content"][0]["transcript"]
        assert heard and len(heard.split()) < len(REPLY.split()), heard  # what went out on the track, not all
        at = time.monotonic()
        await asyncio.sleep(0.4)  # what was queued already went; then the cleared reply is silent
        tail = [s for t, s in caller.heard.frames if t > at + 0.2]
        assert tail and max(float(np.max(np.abs(s))) for s in tail) < 0.01
    finally:
        await caller.close()


async def test_a_call_without_a_valid_key_gets_no_answer(served: str) -> None:
    for key in (None, "k-wrong", "ek_not-a-real-secret"):
        caller = WebRTCCaller(served, key)
        try:
            reply = await caller.call()
            assert reply.status_code == 401, (key, reply.text)
            assert reply.headers["content-type"].startswith("application/json") and "v=0" not in reply.text
        finally:
            await caller.close()


async def test_an_ephemeral_key_starts_the_call_with_its_session_once(served: str) -> None:
    async with httpx.AsyncClient(base_url=served) as http:
        minted = await http.post("/v1/realtime/client_secrets", headers={"authorization": f"Bearer {KEY}"},
                                 json={"session": {"type": "realtime", "instructions": "Talk like a pirate."}})
    secret = minted.json()["value"]
    caller = WebRTCCaller(served, secret)
    try:
        assert (await caller.call()).status_code == 201
        created = await caller.wait_for("session.created", 15)
        assert created["session"]["instructions"] == "Talk like a pirate."
    finally:
        await caller.close()
    again = WebRTCCaller(served, secret)
    try:
        assert (await again.call()).status_code == 401  # one use
    finally:
        await again.close()


async def test_the_session_can_come_with_the_offer_and_audio_appends_are_refused(served: str) -> None:
    caller = WebRTCCaller(served, KEY)
    try:
        reply = await caller.call(session={"type": "realtime", "instructions": "Be brief."})
        assert reply.status_code == 201, reply.text
        created = await caller.wait_for("session.created", 15)
        assert created["session"]["instructions"] == "Be brief."
        caller.send(type="input_audio_buffer.append", audio="AAAA", event_id="e1")
        error = await caller.wait_for("error", 10)
        assert error["error"]["code"] == "unsupported" and "track" in error["error"]["message"]
    finally:
        await caller.close()


@pytest.mark.parametrize(("body", "says"), [
    ("hello", "not an SDP offer"),
    ("v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n", "no audio"),
])
async def test_a_bad_offer_is_a_clear_error(served: str, body: str, says: str) -> None:
    async with httpx.AsyncClient(base_url=served) as http:
        reply = await http.post("/v1/realtime/calls", content=body,
                                headers={"authorization": f"Bearer {KEY}", "content-type": "application/sdp"})
    assert reply.status_code == 400 and says in reply.json()["error"]["message"]


async def test_an_offer_without_a_data_channel_is_refused(served: str) -> None:
    pc = RTCPeerConnection()
    try:
        pc.addTransceiver("audio")
        await pc.setLocalDescription(await pc.createOffer())
        async with httpx.AsyncClient(base_url=served) as http:
            reply = await http.post("/v1/realtime/calls", content=pc.localDescription.sdp,
                                    headers={"authorization": f"Bearer {KEY}", "content-type": "application/sdp"})
        assert reply.status_code == 400 and "oai-events" in reply.json()["error"]["message"]
    finally:
        await pc.close()


async def test_the_native_protocol_over_webrtc_takes_the_pages_one_use_token(served: str) -> None:
    async with httpx.AsyncClient(base_url=served) as http:
        token = (await http.post("/api/session-token", headers={"authorization": f"Bearer {KEY}"})).json()["token"]
    caller = WebRTCCaller(served, channel="events", as_arrived=True)
    try:
        reply = await caller.call(path=f"/webrtc/calls?token={token}")
        assert reply.status_code == 201, reply.text
        await asyncio.wait_for(caller.opened.wait(), 15)
        caller.send(type="session.start", audio={"sample_rate": 48000})
        started = await caller.wait_for("session.started", 15)
        assert started["input_audio"]["sample_rate"] == 16000  # the track's, whatever was asked
        caller.mic.say(tone(0.6))
        done = await caller.wait_for("response.done", 20)
        assert done["status"] == "completed" and done["text"].strip() == REPLY
        assert caller.heard.seconds_loud(0.0) > 0.5
        caller.channel.send(b"\x00\x01")  # audio goes on the track, not the channel
        error = await caller.wait_for("error", 10)
        assert error["code"] == "binary_frame"
    finally:
        await caller.close()
    again = WebRTCCaller(served, channel="events")
    try:
        assert (await again.call(path=f"/webrtc/calls?token={token}")).status_code == 401  # one use
    finally:
        await again.close()


async def test_a_page_of_another_site_may_not_make_a_call(served: str) -> None:
    async with httpx.AsyncClient(base_url=served) as http:
        for path in ("/v1/realtime/calls", "/webrtc/calls"):
            reply = await http.post(path, content="v=0\r\n", headers={
                "authorization": f"Bearer {KEY}", "content-type": "application/sdp", "origin": "https://evil.example"})
            assert reply.status_code == 403 and "allowed_origins" in reply.json()["error"]["message"], path
