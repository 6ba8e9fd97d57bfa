"""Calls placed out through Twilio's and Telnyx's REST APIs (app/transports/phone/dial.py), with the
server on a real socket and fake engines (named as fakes). The providers are test doubles (FakeTwilio,
FakeTelnyx: aiohttp servers that record each request and answer as the provider's documentation
says). The test checks each request against the documented shape, then plays the provider's part
as it would: it opens the media stream the request named, signed as Twilio signs, and the callee
hears the first message."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlsplit

import httpx
import numpy as np
import pytest
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from websockets.exceptions import InvalidStatus

from app.main import create_app
from app.settings import PhoneConfig, ServerConfig, Settings, TelnyxConfig, TwilioConfig
from app.store.config import StorageConfig
from models.llm.tool_calls import ToolCall
from pipeline.config import AsrStageConfig, EndpointingConfig, ToolsConfig
from pipeline.session import Backends
from tests.app.live import serving
from tests.http_server import served as served_api
from tests.phone_sim import PhoneSim, call_records, dial, parse_twiml, twilio_signature
from tests.pipeline.fakes import FakeLLM, FakeRecognizer, FakeSynthesizer, FakeVad

KEY = "k-outbound-phone-0123456789"
HEADERS = {"authorization": f"Bearer {KEY}"}
PUBLIC = "https://voice.example.test"
AUTH_TOKEN = "twilio-auth-token"
ACCOUNT = "AC" + "1" * 32
TELNYX_KEY = "KEY0123456789"
FIRST = "Hello, this is the clinic calling about your appointment tomorrow."  # 10 words: 1 s of fake speech
VOICEMAIL = "Please call the clinic back."  # 5 words
TELNYX_SIGNER = Ed25519PrivateKey.generate()  # stands for the Telnyx account's webhook signing key
TELNYX_PUBLIC_KEY = base64.b64encode(TELNYX_SIGNER.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()


class FakeTwilio:
    """A test double of Twilio's Calls API: records each request, answers 201 with a call sid (or
    `refuse`: Twilio's error body)."""

    def __init__(self, refuse: dict[str, Any] | None = None) -> None:
        self.requests: list[tuple[str, dict[str, str], list[tuple[str, str]]]] = []
        self.refuse = refuse
        self.app = web.Application()
        self.app.router.add_post("/2010-04-01/Accounts/{account}/Calls.json", self.create)
        self.app.router.add_post("/2010-04-01/Accounts/{account}/Calls/{sid}.json", self.update)
        self.updates: list[tuple[str, list[tuple[str, str]]]] = []

    async def update(self, request: web.Request) -> web.Response:
        form = parse_qsl(await request.text(), keep_blank_values=True)
        self.updates.append((request.match_info["sid"], form))
        return web.json_response({"sid": request.match_info["sid"], "status": "in-progress"})

    async def create(self, request: web.Request) -> web.Response:
        form = parse_qsl(await request.text(), keep_blank_values=True)
        self.requests.append((request.path, dict(request.headers), form))
        if self.refuse is not None:
            return web.json_response(self.refuse, status=int(self.refuse["status"]))
        sid = f"CA{len(self.requests):032x}"
        return web.json_response({"sid": sid, "status": "queued", "to": dict(form)["To"]}, status=201)


class FakeTelnyx:
    """A test double of Telnyx's Dial command (POST /v2/calls)."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.app = web.Application()
        self.app.router.add_post("/v2/calls", self.dial)
        self.app.router.add_post("/v2/calls/{id}/actions/transfer", self.transfer)
        self.app.router.add_post("/v2/calls/{id}/actions/hangup", self.hangup)
        self.transfers: list[tuple[str, dict[str, Any]]] = []
        self.hangups: list[str] = []

    async def hangup(self, request: web.Request) -> web.Response:
        self.hangups.append(request.match_info["id"])
        return web.json_response({"data": {"result": "ok"}})

    async def transfer(self, request: web.Request) -> web.Response:
        self.transfers.append((request.match_info["id"], await request.json()))
        return web.json_response({"data": {"result": "ok"}})

    async def dial(self, request: web.Request) -> web.Response:
        self.requests.append((dict(request.headers), await request.json()))
        return web.json_response({"data": {"call_control_id": f"v3:control-{len(self.requests)}",
                                           "call_leg_id": "leg", "call_session_id": "session", "is_alive": False,
                                           "record_type": "call"}})


@contextlib.asynccontextmanager
async def server(tmp: Path, api: str, llm: FakeLLM | None = None, finals: list[str] | None = None,
                 tools: ToolsConfig | None = None, **phone: Any) -> AsyncIterator[tuple[str, Any]]:
    """The app on a real socket, placing calls through the double at `api`: its address and runtime."""
    settings = Settings(
        tools=tools or ToolsConfig(),
        endpointing=EndpointingConfig(min_speech_ms=64, end_silence_ms=256, prefix_padding_ms=100),
        asr_stage=AsrStageConfig(partials=False),
        server=ServerConfig(api_keys=[KEY], max_sessions=2, max_calls_per_key=1,  # type: ignore[list-item]
                            log_caller_content="info"),
        storage=StorageConfig(url=f"sqlite:///{tmp}/calls.db", data_dir=str(tmp)),
        twilio=TwilioConfig(auth_token=AUTH_TOKEN, public_url=PUBLIC, account_sid=ACCOUNT,  # type: ignore[arg-type]
                            caller_id="+15550100000", api_url=api),
        telnyx=TelnyxConfig(stream_token="telnyx-secret", public_url=PUBLIC, api_key=TELNYX_KEY,  # type: ignore[arg-type]
                            connection_id="1494404757140276705", caller_id="+15550100001", api_url=api,
                            public_key=TELNYX_PUBLIC_KEY),
        phone=PhoneConfig(mark_interval_ms=200, **phone),
    )
    app = create_app(settings, backends=Backends(FakeVad(), FakeRecognizer(finals or []),  # type: ignore[arg-type]
                                                 FakeSynthesizer(), llm or FakeLLM([])))
    async with serving(app) as host:
        yield host, app.state.runtime


async def place(host: str, **body: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=f"http://{host}", headers=HEADERS, timeout=10) as http:
        return await http.post("/api/calls/outbound", json=body)


async def placed(host: str, ident: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=f"http://{host}", headers=HEADERS, timeout=10) as http:
        answer = await http.get(f"/api/calls/outbound/{ident}")
    answer.raise_for_status()
    found: dict[str, Any] = answer.json()
    return found


async def until(condition: Any, timeout: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await condition():
        assert asyncio.get_running_loop().time() < deadline, "the condition did not come true in time"
        await asyncio.sleep(0.05)


async def twilio_status(host: str, callback: str, status: str, **more: str) -> httpx.Response:
    """Twilio's status callback: POSTed to the StatusCallback URL, signed over it and the form."""
    form = {"CallSid": "CA" + "9" * 32, "AccountSid": ACCOUNT, "CallStatus": status, **more}
    headers = {"X-Twilio-Signature": twilio_signature(AUTH_TOKEN, callback, form)}
    parts = urlsplit(callback)
    async with httpx.AsyncClient(timeout=10) as http:
        return await http.post(f"http://{host}{parts.path}?{parts.query}", data=form, headers=headers)


async def test_a_call_out_through_twilio_is_placed_as_documented_and_speaks_its_first_message(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="app.transports.phone.wire")
    twilio = FakeTwilio()
    async with served_api(twilio.app) as api, server(tmp_path, api) as (host, runtime):
        answer = await place(host, to="+15550123456", transport="twilio", first_message=FIRST,
                             reason="appointment reminder", instructions="You are the clinic's assistant.")
        assert answer.status_code == 201, answer.text
        call = answer.json()
        assert call["status"] == "dialing" and call["transport"] == "twilio" and call["to"] != "+15550123456"
        assert list(runtime.sessions.values()) == ["twilio"]  # its slot is taken from the moment it is placed
        # Twilio's Calls resource: form-encoded, HTTP Basic with the account SID and auth token
        path, headers, form = twilio.requests[0]
        assert path == f"/2010-04-01/Accounts/{ACCOUNT}/Calls.json"
        assert headers["Authorization"] == "Basic " + base64.b64encode(f"{ACCOUNT}:{AUTH_TOKEN}".encode()).decode()
        assert headers["Content-Type"].startswith("application/x-www-form-urlencoded")
        fields = dict(form)
        assert fields["To"] == "+15550123456" and fields["From"] == "+15550100000" and fields["Timeout"] == "30"
        assert [v for k, v in form if k == "StatusCallbackEvent"] == ["initiated", "ringing", "answered", "completed"]
        assert fields["StatusCallbackMethod"] == "POST"
        callback = fields["StatusCallback"]
        assert callback == f"{PUBLIC}/twilio/status?placed={call['id']}"
        stream, parameters = parse_twiml(fields["Twiml"])
        assert stream == "wss://voice.example.test/twilio/media" and set(parameters) == {"placed"}

        # it rings (a signed status callback; an unsigned one is refused)
        async with httpx.AsyncClient(timeout=10) as http:
            forged = await http.post(f"http://{host}/twilio/status?placed={call['id']}", data={"CallStatus": "busy"})
        assert forged.status_code == 403
        assert (await twilio_status(host, callback, "ringing")).status_code == 204
        assert (await placed(host, call["id"]))["status"] == "ringing"

        # a stream with a made-up credential is refused, and the call rings on
        forged_stream = PhoneSim(f"ws://{host}/twilio/media", auth_token=AUTH_TOKEN, signed_url=stream,
                                 parameters={"placed": f"{call['id']}.guess"})
        await forged_stream.connect()
        await forged_stream.wait_until(lambda: forged_stream.closed, 10)
        assert forged_stream.close_code == 1008 and (await placed(host, call["id"]))["status"] == "ringing"
        # answered: Twilio opens the stream the TwiML named, signed over its public URL
        sim = PhoneSim(f"ws://{host}/twilio/media", auth_token=AUTH_TOKEN, signed_url=stream, parameters=parameters,
                       call_sid=f"CA{1:032x}")  # the sid the double answered
        await sim.connect()
        await sim.wait_until(lambda: sim.marks and sim.marks[-1].name == "t1:1000", 15)
        assert len(sim.received_audio()) == 8 * 1000  # the first message: 10 fake words of 0.1 s
        status = await placed(host, call["id"])
        assert status["status"] == "answered" and status["call_id"].startswith("twilio_")
        assert list(runtime.sessions) == [status["call_id"]]  # the slot taken when placed, not a second one
        # the same stream credential opens nothing a second time
        again = PhoneSim(f"ws://{host}/twilio/media", auth_token=AUTH_TOKEN, signed_url=stream, parameters=parameters)
        await again.connect()
        await again.wait_until(lambda: again.closed, 10)
        assert again.close_code == 1008 and not again.received_audio().size
        await sim.hangup()
        await until(lambda: _status_is(host, call["id"], "ended"))
        assert runtime.sessions == {}
        # the call's record: who placed it and why, its first message as heard
        async with httpx.AsyncClient(base_url=f"http://{host}", headers=HEADERS, timeout=10) as http:
            record = (await http.get(f"/api/calls/{status['call_id']}")).json()
        assert record["call"]["transport"] == "twilio"
        assert record["call"]["settings"]["placed"]["reason"] == "appointment reminder"
        assert record["call"]["settings"]["placed"]["transport"] == "twilio"
    # what the callee heard joined the history: the first message is the call's first turn
    (first,) = call_records(caplog.text, sim.call_sid)
    assert first["text"] == FIRST and first["status"] == "completed", first


async def _status_is(host: str, ident: str, state: str) -> bool:
    return (await placed(host, ident))["status"] == state


async def test_twilio_refusing_or_the_callee_busy_gives_the_slot_back_with_the_reason(tmp_path: Path) -> None:
    error = {"code": 21211, "message": "The 'To' number 123 is not a valid phone number.", "status": 400}
    async with served_api(FakeTwilio(refuse=error).app) as api, server(tmp_path, api) as (host, runtime):
        refused = await place(host, to="123", transport="twilio")
        assert refused.status_code == 502 and refused.json()["error"]["code"] == "provider_refused"
        assert "21211 The 'To' number 123 is not a valid phone number." in refused.json()["error"]["message"]
        assert runtime.sessions == {}
        again = await place(host, to="123", transport="twilio")  # the key's one call (max_calls_per_key) is free
        assert again.status_code == 502, again.text
    twilio = FakeTwilio()
    async with served_api(twilio.app) as api, server(tmp_path, api) as (host, runtime):
        call = (await place(host, to="+15550123456", transport="twilio", first_message=FIRST)).json()
        callback = dict(twilio.requests[0][2])["StatusCallback"]
        assert (await twilio_status(host, callback, "busy", SipResponseCode="486")).status_code == 204
        status = await placed(host, call["id"])
        assert status["status"] == "failed" and status["detail"] == "busy (SIP 486)"
        assert runtime.sessions == {}
        assert (await twilio_status(host, callback, "completed")).status_code == 204  # late: nothing changes
        assert (await placed(host, call["id"]))["detail"] == "busy (SIP 486)"
        # a stream that comes after all is refused: the call was given up
        stream, parameters = parse_twiml(dict(twilio.requests[0][2])["Twiml"])
        late = PhoneSim(f"ws://{host}/twilio/media", auth_token=AUTH_TOKEN, signed_url=stream, parameters=parameters)
        await late.connect()
        await late.wait_until(lambda: late.closed, 10)
        assert late.close_code == 1008
        # the key's one call is free again: the next is placed
        assert (await place(host, to="+15550123456", transport="twilio")).status_code == 201


async def test_a_draining_server_gives_up_the_calls_still_ringing(tmp_path: Path) -> None:
    telnyx = FakeTelnyx()
    async with served_api(telnyx.app) as api, server(tmp_path, api) as (host, runtime):
        call = (await place(host, to="+15550123456", transport="telnyx", ring_timeout_s=60)).json()
        runtime.begin_drain()
        await until(lambda: _status_is(host, call["id"], "failed"))
        assert (await placed(host, call["id"]))["detail"] == "server_shutdown" and runtime.sessions == {}
        await until(lambda: _true(bool(telnyx.hangups)))


async def test_a_call_out_through_telnyx_is_dialled_as_documented_and_speaks_its_first_message(
        tmp_path: Path) -> None:
    telnyx = FakeTelnyx()
    async with served_api(telnyx.app) as api, server(tmp_path, api) as (host, runtime):
        answer = await place(host, to="+15550123456", transport="telnyx", first_message=FIRST, ring_timeout_s=20)
        assert answer.status_code == 201, answer.text
        call = answer.json()
        headers, body = telnyx.requests[0]
        assert headers["Authorization"] == f"Bearer {TELNYX_KEY}"
        assert headers["Content-Type"].startswith("application/json")
        stream = body.pop("stream_url")
        assert body == {"connection_id": "1494404757140276705", "to": "+15550123456", "from": "+15550100001",
                        "timeout_secs": 20, "stream_track": "inbound_track", "stream_bidirectional_mode": "rtp",
                        "stream_bidirectional_codec": "PCMU",
                        "client_state": base64.b64encode(call["id"].encode()).decode(),
                        "webhook_url": f"{PUBLIC}/telnyx/events", "webhook_url_method": "POST"}
        parts = urlsplit(stream)
        assert f"{parts.scheme}://{parts.netloc}{parts.path}" == "wss://voice.example.test/telnyx/media"
        assert set(parse_qs(parts.query)) == {"placed"}
        # a made-up credential opens nothing (403 before the socket opens)
        with pytest.raises(InvalidStatus) as refused:
            await PhoneSim(f"ws://{host}/telnyx/media?placed={call['id']}.guess", provider="telnyx").connect()
        assert refused.value.response.status_code == 403
        sim = PhoneSim(f"ws://{host}{parts.path}?{parts.query}", provider="telnyx", call_sid="v3:control-1")
        await sim.connect()
        await sim.wait_until(lambda: sim.marks and sim.marks[-1].name == "t1:1000", 15)
        status = await placed(host, call["id"])
        assert status["status"] == "answered" and status["call_id"].startswith("telnyx_")
        await sim.hangup()
        await until(lambda: _status_is(host, call["id"], "ended"))
        assert runtime.sessions == {}
    assert telnyx.hangups == []  # the callee hung up: nothing left to end


async def telnyx_webhook(host: str, event_type: str, payload: dict[str, Any], *,
                         signer: Ed25519PrivateKey = TELNYX_SIGNER, age_s: int = 0) -> httpx.Response:
    """A Call Control webhook as Telnyx sends one: JSON, signed with Ed25519 over "<timestamp>|<body>"."""
    body = json.dumps({"data": {"record_type": "event", "event_type": event_type, "id": "0ccc7b54-4df3",
                                "occurred_at": "2026-12-07T21:00:00Z", "payload": payload}}).encode()
    stamp = str(int(time.time()) - age_s)
    headers = {"content-type": "application/json", "telnyx-timestamp": stamp,
               "telnyx-signature-ed25519": base64.b64encode(signer.sign(stamp.encode() + b"|" + body)).decode()}
    async with httpx.AsyncClient(timeout=10) as http:
        return await http.post(f"http://{host}/telnyx/events", content=body, headers=headers)


async def test_a_busy_telnyx_callee_ends_the_call_at_its_signed_hangup_webhook(tmp_path: Path) -> None:
    telnyx = FakeTelnyx()
    async with served_api(telnyx.app) as api, server(tmp_path, api) as (host, runtime):
        call = (await place(host, to="+15550123456", transport="telnyx", ring_timeout_s=60)).json()
        state = telnyx.requests[0][1]["client_state"]
        hangup = {"call_control_id": "v3:control-1", "client_state": state, "hangup_cause": "user_busy",
                  "hangup_source": "callee", "sip_hangup_cause": "486"}
        # forged (another key), replayed (signed an hour ago), unsigned, or not a webhook: refused, and it rings on
        assert (await telnyx_webhook(host, "call.hangup", hangup, signer=Ed25519PrivateKey.generate())
                ).status_code == 403
        assert (await telnyx_webhook(host, "call.hangup", hangup, age_s=3600)).status_code == 403
        async with httpx.AsyncClient(timeout=10) as http:
            unsigned = await http.post(f"http://{host}/telnyx/events", json={"data": {"event_type": "call.hangup",
                                                                                       "payload": hangup}})
        assert unsigned.status_code == 403
        for stamp in ("\u00b2", "9" * 5000):  # a digit Python reads but int() does not; a number of any length
            async with httpx.AsyncClient(timeout=10) as http:
                odd = await http.post(f"http://{host}/telnyx/events", content=b"{}", headers={
                    "telnyx-timestamp": stamp.encode("latin-1"), "telnyx-signature-ed25519": "AAAA"})
            assert odd.status_code == 403
        bad = await telnyx_webhook(host, "call.hangup", "not a payload")  # type: ignore[arg-type]
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_event"
        assert (await placed(host, call["id"]))["status"] == "dialing" and len(runtime.sessions) == 1
        # events that change nothing, and calls this replica never placed, are acknowledged
        assert (await telnyx_webhook(host, "call.initiated", {"call_control_id": "v3:control-1",
                                                              "client_state": state})).status_code == 200
        assert (await telnyx_webhook(host, "call.hangup", {"call_control_id": "v3:elsewhere"})).status_code == 200
        assert (await placed(host, call["id"]))["status"] == "dialing"
        # Telnyx's signed call.hangup: the call ends at once with its cause, and its slot is free
        assert (await telnyx_webhook(host, "call.hangup", hangup)).status_code == 200
        status = await placed(host, call["id"])
        assert status["status"] == "failed" and status["detail"] == "user_busy (SIP 486)"
        assert runtime.sessions == {}
        # a stream that comes after all opens nothing
        stream = urlsplit(telnyx.requests[0][1]["stream_url"])
        with pytest.raises(InvalidStatus) as refused:
            await PhoneSim(f"ws://{host}{stream.path}?{stream.query}", provider="telnyx").connect()
        assert refused.value.response.status_code == 403
    assert telnyx.hangups == []  # Telnyx ended it: nothing to hang up


async def test_a_telnyx_stream_that_fails_to_open_ends_the_call_and_hangs_it_up(tmp_path: Path) -> None:
    telnyx = FakeTelnyx()
    async with served_api(telnyx.app) as api, server(tmp_path, api) as (host, runtime):
        call = (await place(host, to="+15550123456", transport="telnyx", ring_timeout_s=60)).json()
        failed = {"call_control_id": "v3:control-1", "failure_reason": "connection_failed",  # no client_state:
                  "stream_params": {"stream_url": "wss://voice.example.test/telnyx/media"}}  # found by call id
        assert (await telnyx_webhook(host, "streaming.failed", failed)).status_code == 200
        status = await placed(host, call["id"])
        assert status["status"] == "failed" and status["detail"] == "media stream failed: connection_failed"
        assert runtime.sessions == {}
        await until(lambda: _true(bool(telnyx.hangups)))
    assert telnyx.hangups == ["v3:control-1"]


async def test_a_call_out_whose_stream_never_comes_is_given_up_and_hung_up(tmp_path: Path) -> None:
    telnyx = FakeTelnyx()
    async with served_api(telnyx.app) as api, server(tmp_path, api, answer_grace_s=0.2) as (host, runtime):
        call = (await place(host, to="+15550123456", transport="telnyx", ring_timeout_s=5)).json()
        assert len(runtime.sessions) == 1
        await until(lambda: _status_is(host, call["id"], "failed"), 20)
        assert (await placed(host, call["id"]))["detail"] == "no media stream within 5.2 s"
        assert runtime.sessions == {}
        await until(lambda: _true(bool(telnyx.hangups)))
    assert telnyx.hangups == ["v3:control-1"]


async def _true(value: bool) -> bool:
    return value


async def test_a_server_that_stops_ends_the_calls_still_ringing_before_it_exits(tmp_path: Path) -> None:
    telnyx = FakeTelnyx()
    async with served_api(telnyx.app) as api:
        async with server(tmp_path, api) as (host, runtime):
            await place(host, to="+15550123456", transport="telnyx", ring_timeout_s=60)
            assert telnyx.hangups == []
        assert telnyx.hangups == ["v3:control-1"] and runtime.sessions == {}  # sent before the client closed


async def test_a_machine_that_answers_a_twilio_call_gets_the_message_after_its_beep(tmp_path: Path) -> None:
    """The callee's greeting goes to the answering-machine detector, not to the session: a long
    greeting (the fake VAD hears the loud stretch as speech) is a machine; once its beep is over the
    voicemail message is said, and the call hung up once it has played."""
    twilio = FakeTwilio()
    async with served_api(twilio.app) as api, server(tmp_path, api) as (host, _):
        call = (await place(host, to="+15550123456", transport="twilio", first_message=FIRST,
                            answering_machine="leave_message", voicemail_message=VOICEMAIL)).json()
        stream, parameters = parse_twiml(dict(twilio.requests[0][2])["Twiml"])
        sim = PhoneSim(f"ws://{host}/twilio/media", auth_token=AUTH_TOKEN, signed_url=stream, parameters=parameters)
        await sim.connect()
        greeting = np.full(8000 * 3, 12000, dtype=np.int16)  # 3 s of "speech"
        beep = (8000 * np.sin(2 * np.pi * 1000 * np.arange(4000) / 8000)).astype(np.int16)
        beeped = await sim.say(np.concatenate([greeting, np.zeros(2000, np.int16), beep]))
        await sim.wait_until(lambda: sim.closed, 20)
        status = await placed(host, call["id"])
    assert status["answered_by"] == "machine" and status["status"] == "ended", status
    assert status["detail"] == "voicemail_left"
    assert sim.first_media_after(0) is not None and sim.first_media_after(0) > beeped  # not before the beep ended
    assert len(sim.played_audio()) == 8 * 500  # the message (5 fake words), all played, and not the first message


async def test_calls_out_say_what_is_missing(tmp_path: Path) -> None:
    settings = Settings(server=ServerConfig(api_keys=[KEY]), storage=StorageConfig(enabled=False))  # type: ignore[list-item]
    app = create_app(settings, backends=Backends(FakeVad(), FakeRecognizer([]), FakeSynthesizer(),  # type: ignore[arg-type]
                                                 FakeLLM([])))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1",
                                 headers=HEADERS) as http:
        for transport in ("twilio", "telnyx"):
            answer = await http.post("/api/calls/outbound", json={"to": "+15550123456", "transport": transport})
            assert answer.status_code == 409, answer.text
            assert answer.json()["error"]["code"] == f"{transport}_not_configured"
            assert f"{transport}.public_url" in answer.json()["error"]["message"]


TRANSFER = ToolsConfig(transfer_targets={"front desk": "+15550100200", "billing": "sip:billing@10.0.0.20"})
LOUD = np.full(8000 * 3 // 5, 12000, dtype=np.int16)  # 0.6 s the fake VAD takes for speech


def transferring(target: str) -> FakeLLM:
    return FakeLLM([[ToolCall("call_tr", "transfer_call", json.dumps({"target": target}))],
                    "I am putting you through now."])


async def test_a_twilio_call_is_transferred_by_updating_it_with_a_dial(tmp_path: Path) -> None:
    twilio = FakeTwilio()
    async with served_api(twilio.app) as api, server(tmp_path, api, transferring("front desk"),
                                                     ["Can I talk to a person?"], TRANSFER,
                                                     transfer_calls=True) as (host, _):
        sim = await dial(f"http://{host}", f"ws://{host}", PUBLIC, AUTH_TOKEN)  # a call that came in
        await sim.say(LOUD)
        await sim.wait_until(lambda: sim.closed, 20)
    assert sim.close_code == 1000
    (sid, form), = twilio.updates  # the words were heard first, then the call was given a <Dial>
    assert sid == sim.call_sid and set(dict(form)) == {"Twiml"}
    assert "<Dial><Number>+15550100200</Number></Dial>" in dict(form)["Twiml"]
    assert len(sim.played_audio()) == 8 * 600  # "I am putting you through now.": 6 fake words, all played


async def test_a_telnyx_call_is_transferred_with_the_transfer_command(tmp_path: Path) -> None:
    telnyx = FakeTelnyx()
    async with served_api(telnyx.app) as api, server(tmp_path, api, transferring("billing"),
                                                     ["Billing, please."], TRANSFER,
                                                     transfer_calls=True) as (host, _):
        call = (await place(host, to="+15550123456", transport="telnyx")).json()
        parts = urlsplit(telnyx.requests[0][1]["stream_url"])
        sim = PhoneSim(f"ws://{host}{parts.path}?{parts.query}", provider="telnyx", call_sid="v3:control-1")
        await sim.connect()
        await sim.say(LOUD)
        await sim.wait_until(lambda: sim.closed, 20)
        await until(lambda: _status_is(host, call["id"], "ended"))
        assert (await placed(host, call["id"]))["detail"] == "transferred"
    assert telnyx.transfers == [("v3:control-1", {"to": "sip:billing@10.0.0.20"})]
