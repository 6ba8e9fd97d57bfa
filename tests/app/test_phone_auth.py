"""The phone endpoints' doors, through the app (Starlette's test client, fake engines): Twilio's
webhook answers TwiML only to a valid X-Twilio-Signature (SHA-1, or SHA-256 when the settings header
asks), the media socket refuses an unsigned upgrade, Telnyx's one without the token. A refused
upgrade is closed before it is accepted, which a server answers with HTTP 403 (the test client
raises WebSocketDisconnect instead; tests/app/test_phone_sim.py sees the 403 over a real socket)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from starlette.websockets import WebSocketDisconnect
from twilio.request_validator import RequestValidator

from app.main import create_app
from app.security.phone_tokens import mint_token
from app.settings import ServerConfig, Settings, TelnyxConfig, TwilioConfig
from app.transports.phone.twilio import stream_url, twiml
from pipeline.session import Backends
from tests.phone_sim import parse_twiml, twilio_signature
from tests.pipeline.fakes import FakeLLM, FakeRecognizer, FakeSynthesizer, FakeVad

TOKEN = "twilio-test-token"
PUBLIC = "https://voice.example.test"
PARAMS = {"CallSid": "CA123", "From": '+1 "<Bob & Alice>"', "To": "+15550002222", "AccountSid": "AC1"}


def client_for(**sections: Any) -> TestClient:
    """The app as the provider reaches it: at the public host (and the test client's WebSocket host, testserver)."""
    settings = Settings(**{"server": ServerConfig(allowed_hosts=["voice.example.test", "testserver"]), **sections})
    backends = Backends(FakeVad(), FakeRecognizer([]), FakeSynthesizer(), FakeLLM([]))
    return TestClient(create_app(settings, backends=backends), base_url="http://voice.example.test")


@pytest.fixture
def client() -> Iterator[TestClient]:
    with client_for(twilio=TwilioConfig(auth_token=TOKEN, public_url=PUBLIC, shared_keys={"KS1": "shared-secret"}),
                    telnyx=TelnyxConfig(stream_token="telnyx-secret")) as c:
        yield c


def post(client: TestClient, signature: str | None, query: str = "", **headers: str) -> Any:
    if signature is not None:
        headers["X-Twilio-Signature"] = signature
    return client.post("/twilio/voice" + query, data=PARAMS, headers=headers)


def test_a_signed_webhook_gets_twiml_that_connects_the_call(client: TestClient) -> None:
    response = post(client, twilio_signature(TOKEN, PUBLIC + "/twilio/voice", PARAMS))
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/xml")
    url, parameters = parse_twiml(response.text)
    assert url == "wss://voice.example.test/twilio/media"
    nonce = parameters.pop("nonce")  # one-use, for the stream's `start` (tests/app/test_phone.py)
    assert parameters == {"CallSid": "CA123", "From": '+1 "<Bob & Alice>"', "To": "+15550002222"}
    assert len(nonce) >= 32 and nonce != parse_twiml(post(client, twilio_signature(
        TOKEN, PUBLIC + "/twilio/voice", PARAMS)).text)[1]["nonce"]  # a new one for every answer
    assert "&lt;Bob &amp; Alice&gt;" in response.text  # escaped, not raw markup


def test_the_signature_covers_the_query_string(client: TestClient) -> None:
    signed = twilio_signature(TOKEN, PUBLIC + "/twilio/voice?lang=en", PARAMS)
    assert post(client, signed, "?lang=en").status_code == 200
    assert post(client, signed).status_code == 403


@pytest.mark.parametrize("signature", [
    None,  # missing
    "",
    "bm90IGEgc2lnbmF0dXJl",  # wrong
    twilio_signature("another-token", PUBLIC + "/twilio/voice", PARAMS),  # another account's
    twilio_signature(TOKEN, "https://elsewhere.example.test/twilio/voice", PARAMS),  # another URL
    twilio_signature(TOKEN, PUBLIC + "/twilio/voice", {**PARAMS, "To": "+19990000000"}),  # other parameters
])
def test_a_webhook_without_a_valid_signature_gets_403_and_nothing_else(client: TestClient,
                                                                       signature: str | None) -> None:
    response = post(client, signature)
    assert response.status_code == 403 and response.content == b""


def test_the_sha256_variant_when_the_settings_header_asks_for_it(client: TestClient) -> None:
    url = PUBLIC + "/twilio/voice"
    header = {"X-Twilio-Webhooks-Signature-Settings": "key=KS1,algorithm=HMAC_SHA256"}
    sha256 = RequestValidator("shared-secret").compute_signature(url, PARAMS, "HMAC_SHA256")
    assert post(client, sha256, **header).status_code == 200
    # the SHA-1 signature, or a SHA-256 one under another key, is not what that header announces
    assert post(client, RequestValidator("shared-secret").compute_signature(url, PARAMS), **header).status_code == 403
    assert post(client, RequestValidator(TOKEN).compute_signature(url, PARAMS, "HMAC_SHA256"),
                **header).status_code == 403
    # a key the server does not know: the auth token is the key
    unknown = {"X-Twilio-Webhooks-Signature-Settings": "key=KS9,algorithm=HMAC_SHA256"}
    assert post(client, RequestValidator(TOKEN).compute_signature(url, PARAMS, "HMAC_SHA256"),
                **unknown).status_code == 200


def test_the_media_socket_needs_the_signature_over_its_public_wss_url(client: TestClient) -> None:
    for headers in ({}, {"X-Twilio-Signature": "bm9wZQ=="},
                    {"X-Twilio-Signature": twilio_signature(TOKEN, "ws://voice.example.test/twilio/media")}):
        with pytest.raises(WebSocketDisconnect) as denied, client.websocket_connect("/twilio/media",
                                                                                      headers=headers):
            pass
        assert denied.value.code == 1008
    signed = {"X-Twilio-Signature": twilio_signature(TOKEN, "wss://voice.example.test/twilio/media")}
    with client.websocket_connect("/twilio/media", headers=signed) as socket:
        socket.send_json({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        socket.send_json({"event": "stop", "streamSid": "MZ1"})
        assert socket.receive()["type"] == "websocket.close"


def test_the_telnyx_socket_needs_a_fresh_token_minted_with_the_secret(client: TestClient) -> None:
    def refused(path: str, headers: dict[str, str] | None = None) -> bool:
        try:
            with client.websocket_connect(path, headers=headers or {}) as socket:
                socket.send_json({"event": "stop", "stream_id": "S1"})
                assert socket.receive()["type"] == "websocket.close"
        except WebSocketDisconnect as denied:
            assert denied.code == 1008
            return True
        return False

    now = time.time()
    forged = mint_token("another-secret", 60, now)
    expired = mint_token("telnyx-secret", 60, now - 120)
    assert refused("/telnyx/media") and refused("/telnyx/media?token=guess")
    assert refused("/telnyx/media", {"x-telnyx-streaming-auth-token": "guess"})
    assert refused(f"/telnyx/media?token={forged}") and refused(f"/telnyx/media?token={expired}")
    assert refused("/telnyx/media?token=telnyx-secret")  # the secret itself opens nothing: replayable
    fresh = client.post("/api/phone/telnyx-stream").json()
    assert fresh["url"].startswith("ws://voice.example.test/telnyx/media?token=") and fresh["expires_in"] == 60
    assert not refused(fresh["url"].removeprefix("ws://voice.example.test"))
    assert refused(fresh["url"].removeprefix("ws://voice.example.test"))  # once only: a replay is refused
    header = mint_token("telnyx-secret", 60, now)
    assert not refused("/telnyx/media", {"x-telnyx-streaming-auth-token": header})
    assert refused("/telnyx/media", {"x-telnyx-streaming-auth-token": header})


def test_the_static_telnyx_secret_opens_the_socket_only_when_allowed() -> None:
    with client_for(telnyx=TelnyxConfig(stream_token="telnyx-secret", allow_static_token=True)) as allowing:
        for _ in range(2):
            with allowing.websocket_connect("/telnyx/media?token=telnyx-secret") as socket:
                socket.send_json({"event": "stop", "stream_id": "S1"})
                assert socket.receive()["type"] == "websocket.close"


def test_without_an_auth_token_twilio_is_refused_and_unchecked_mode_answers_anyone() -> None:
    with client_for(twilio=TwilioConfig(public_url=PUBLIC)) as unconfigured:
        assert post(unconfigured, twilio_signature("", PUBLIC + "/twilio/voice", PARAMS)).status_code == 403
        with pytest.raises(WebSocketDisconnect), unconfigured.websocket_connect("/twilio/media"):
            pass
    with client_for(twilio=TwilioConfig(check_signatures=False)) as local:
        response = post(local, None)
        assert response.status_code == 200
        assert parse_twiml(response.text)[0] == "ws://voice.example.test/twilio/media"  # the host it was asked on


def test_twiml_and_stream_urls() -> None:
    assert stream_url("https://voice.example.com/") == "wss://voice.example.com/twilio/media"
    assert stream_url("http://localhost:8000/agent") == "ws://localhost:8000/agent/twilio/media"
    text = twiml("wss://h/twilio/media", {"a": "x\"'<>&"})
    assert parse_twiml(text) == ("wss://h/twilio/media", {"a": "x\"'<>&"})
    assert text.startswith('<?xml version="1.0" encoding="UTF-8"?><Response><Connect><Stream url="wss://h/twilio/media">')


def test_a_public_url_must_be_an_http_url() -> None:
    with pytest.raises(ValidationError):
        TwilioConfig(public_url="voice.example.com")
    with pytest.raises(ValidationError):
        TwilioConfig(public_url="https://voice.example.com/?x=1")
    assert TwilioConfig(public_url="https://voice.example.com/").public_url == "https://voice.example.com"
