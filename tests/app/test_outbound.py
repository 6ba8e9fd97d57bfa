"""POST /api/calls/outbound's refusals, with fake engines (named as fakes) and SIP off: a key is
required even where the API is open, bad requests say what is wrong, SIP off says so. Calls that
are placed are tested for real in tests/e2e/test_sip.py (SIP) and tests/app/test_outbound_phone.py
(Twilio, Telnyx)."""

from __future__ import annotations

import httpx

from tests.app.live import fake_app

KEY = "k-outbound-0123456789"
PATH = "/api/calls/outbound"


def client(**server: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=fake_app(**server)), base_url="http://127.0.0.1")


async def test_placing_calls_is_refused_without_keys_even_where_the_api_is_open() -> None:
    async with client() as http:
        answer = await http.post(PATH, json={"to": "sip:bob@127.0.0.1"})
    assert answer.status_code == 403 and answer.json()["error"]["code"] == "keys_required"


async def test_a_call_out_needs_a_valid_key() -> None:
    async with client(api_keys=[KEY]) as http:
        assert (await http.post(PATH, json={"to": "sip:bob@127.0.0.1"})).status_code == 401
        wrong = await http.post(PATH, json={"to": "sip:bob@127.0.0.1"}, headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401


async def test_bad_requests_say_what_is_wrong() -> None:
    headers = {"authorization": f"Bearer {KEY}"}
    async with client(api_keys=[KEY]) as http:
        cases = (({}, "to"), ({"to": "x", "transport": "carrier-pigeon"}, "transport"),
                 ({"to": "x", "ring_timeout_s": 1}, "ring_timeout_s"), ({"to": "x", "colour": "red"}, "colour"))
        for body, field in cases:
            answer = await http.post(PATH, json=body, headers=headers)
            assert answer.status_code == 400, body
            assert answer.json()["error"]["message"].startswith(field), answer.text
        broken = await http.post(PATH, content=b"{not json", headers=headers)
        assert broken.status_code == 400
        voicemail = await http.post(PATH, json={"to": "x", "answering_machine": "leave_message"}, headers=headers)
        assert voicemail.status_code == 400 and "voicemail_message" in voicemail.json()["error"]["message"]


async def test_sip_off_and_unconfigured_carriers_are_refused_with_the_reason() -> None:
    headers = {"authorization": f"Bearer {KEY}"}
    async with client(api_keys=[KEY]) as http:
        off = await http.post(PATH, json={"to": "sip:bob@127.0.0.1"}, headers=headers)
        assert off.status_code == 409 and "sip.enabled" in off.json()["error"]["message"]
        twilio = await http.post(PATH, json={"to": "+15550001111", "transport": "twilio"}, headers=headers)
        assert twilio.status_code == 409 and "twilio.account_sid" in twilio.json()["error"]["message"]
        unknown = await http.get(PATH + "/out_nothing", headers=headers)
        assert unknown.status_code == 404
