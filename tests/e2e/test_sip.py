"""SIP end to end: a real server (real models) with SIP on, called by real SIP stacks (baresip as a
phone with a WAV for a microphone and a recording for an ear, SIPp as a trunk), and calling them.

The line carries no text, so what each turn kept is read where the service records it: the
`response.done` line it logs for every turn (server.log_caller_content "info"), and the call's record
(GET /api/calls/{id})."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from models.config import AsrConfig
from models.speech.asr_faster_whisper import FasterWhisperRecognizer
from pipeline.audio import resample
from tests.e2e.conftest import Server, start_server, stop_server
from tests.phone_sim import call_records
from tests.sip_phone import Baresip, Heard, free_udp_port, kamailio_edge, sipp, write_wav
from tests.speech import flite_samples, words

pytestmark = pytest.mark.slow

KEY = "e2e-sip-key"
TRUNK_USER, TRUNK_PASSWORD = "trunk7", "e2e-digest-password"
QUESTION = "What is the capital of France?"
FIRST_MESSAGE = "Hello, this is the dental clinic calling to remind you of your appointment tomorrow at nine."


DESK_PORT = free_udp_port()  # where the front desk's phone answers (a transfer target)
BILLING_PORT = free_udp_port()  # where billing's phone answers (a warm transfer's target)


@pytest.fixture(scope="module")
def sip_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, int]]:
    port = free_udp_port()
    server, proc = start_server(tmp_path_factory.mktemp("sip"), env={
        "VOICE_AGENT_SIP__ENABLED": "true", "VOICE_AGENT_SIP__HOST": "127.0.0.1", "VOICE_AGENT_SIP__PORT": str(port),
        # 127.0.0.1 is a trusted trunk; a phone on 127.0.0.2 must authenticate
        "VOICE_AGENT_SIP__TRUSTED_ADDRESSES": '["127.0.0.1/32"]',
        "VOICE_AGENT_SIP__USERNAME": TRUNK_USER, "VOICE_AGENT_SIP__PASSWORD": TRUNK_PASSWORD,
        "VOICE_AGENT_SERVER__API_KEYS": f'["{KEY}"]',
        # a trunk of ten channels: every call of it answered (the default, 8, is what this 2-core machine
        # serves talking at once; docs/sip.md)
        "VOICE_AGENT_SERVER__MAX_SESSIONS": "10",
        "VOICE_AGENT_TOOLS__TRANSFER_TARGETS": f'{{"front desk": "sip:desk@127.0.0.1:{DESK_PORT}", '
                                               f'"billing": "sip:billing@127.0.0.1:{BILLING_PORT}"}}',
        "VOICE_AGENT_TOOLS__WARM_TRANSFERS": '["billing"]',
        "VOICE_AGENT_SERVER__LOG_CALLER_CONTENT": "info"})
    yield server, port
    stop_server(proc)


@pytest.fixture(scope="module")
def recognizer() -> FasterWhisperRecognizer:
    return FasterWhisperRecognizer(AsrConfig())


def microphone(tmp: Path, text: str | None, after_s: float) -> Path:
    """A phone's microphone: half a second of silence, `text` in flite's voice, then `after_s` of
    silence (the call lasts as long as the file)."""
    rate = 8000
    parts = [np.zeros(rate // 2, np.float32)]
    if text:
        parts.append(flite_samples(text, tmp, rate).astype(np.float32) / 32768)
    parts.append(np.zeros(int(after_s * rate), np.float32))
    return write_wav(tmp / f"mic_{abs(hash((text, after_s)))}.wav", np.concatenate(parts))


def calls_in_log(server: Server) -> list[str]:
    """The ids of the SIP calls the server logged, in order."""
    return list(dict.fromkeys(re.findall(r"(sip_[0-9a-f]{16}): (?:a call from|calling)", server.log())))


async def until(http: httpx.AsyncClient, path: str, over: Callable[[dict], bool]) -> dict:
    """GET `path` until `over` holds for its JSON (the service writes records and states as calls end)."""
    deadline = asyncio.get_running_loop().time() + 20
    while not over(body := (await http.get(path)).json()):
        assert asyncio.get_running_loop().time() < deadline, body
        await asyncio.sleep(0.2)
    return body


def record_ended(body: dict) -> bool:
    return bool(body.get("call", {}).get("ended_at"))


def call_over(body: dict) -> bool:
    return body.get("status") in ("ended", "failed")


def heard_words(recognizer: FasterWhisperRecognizer, audio: np.ndarray) -> list[str]:
    """The words in a phone's 8 kHz recording, heard stretch by stretch: split where it is quiet for 0.5 s or
    more. One pass over a long recording with sparse speech (Whisper's 30 s windows, no timestamps) once
    heard nothing of a sentence that, transcribed alone, was clear."""
    audio = resample(audio, 8000, 16000)
    frame = 320  # 20 ms
    count = len(audio) // frame
    loud = np.sqrt(np.mean(audio[:count * frame].reshape(count, frame) ** 2, axis=1)) > 0.003  # -50 dBFS
    stretches: list[list[int]] = []
    for k in np.flatnonzero(loud):
        if stretches and k - stretches[-1][1] <= 25:
            stretches[-1][1] = int(k)
        else:
            stretches.append([int(k), int(k)])
    heard: list[str] = []
    for first, last in stretches:
        start, end = max(0, first - 10) * frame, min(count, last + 11) * frame  # 0.2 s either side
        for piece in range(start, end, 25 * 16000):  # Whisper's window holds 30 s
            heard += words(recognizer.transcribe(audio[piece:min(end, piece + 25 * 16000)]))
    return heard


async def test_a_sip_call_is_answered_and_the_question_gets_a_spoken_answer(
        sip_server: tuple[Server, int], tmp_path: Path, recognizer: FasterWhisperRecognizer) -> None:
    server, port = sip_server
    phone = Baresip(tmp_path / "phone", microphone(tmp_path, QUESTION, after_s=14))
    before = calls_in_log(server)
    heard = await phone.run(30, dial=f"sip:agent@127.0.0.1:{port}")

    assert heard.established, heard.log[-2000:]
    (call_id,) = [c for c in calls_in_log(server) if c not in before]
    asked = call_records(server.log(), call_id, "caller")
    assert asked and {"capital", "france"} <= set(words(asked[0]["text"])), asked
    (done,) = call_records(server.log(), call_id)
    assert done["status"] == "completed" and "paris" in words(done["text"]), done
    # the reply went out as RTP and the phone heard it: its recording says the reply's words
    said = set(words(done["text"]))
    assert len(said & set(heard_words(recognizer, heard.audio()))) / len(said) >= 0.6
    # the call's record: transport sip, ended by the caller's BYE
    async with httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {KEY}"}) as http:
        record = await until(http, f"/api/calls/{call_id}", record_ended)
    assert record["call"]["transport"] == "sip" and record["call"]["end_reason"] == "hangup", record["call"]
    assert len(record["turns"]) == 1


async def test_an_outbound_call_reaches_the_phone_and_says_its_first_message(
        sip_server: tuple[Server, int], tmp_path: Path, recognizer: FasterWhisperRecognizer) -> None:
    server, _ = sip_server
    phone = Baresip(tmp_path / "callee", microphone(tmp_path, None, after_s=12))
    ringing = await phone.answering(14)
    async with httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {KEY}"}) as http:
        placed = await http.post("/api/calls/outbound", json={
            "to": phone.uri, "first_message": FIRST_MESSAGE, "reason": "appointment reminder"})
        assert placed.status_code == 201, placed.text
        body = placed.json()
        assert body["status"] == "dialing" and body["transport"] == "sip" and body["to"] != phone.uri  # masked
        heard = await ringing
        state = await until(http, f"/api/calls/outbound/{body['id']}", call_over)
        assert state["status"] == "ended" and state["detail"] == "hangup", state
        record = (await http.get(f"/api/calls/{body['call_id']}")).json()
    assert heard.established, heard.log[-2000:]
    said = set(words(FIRST_MESSAGE))
    assert len(said & set(heard_words(recognizer, heard.audio()))) / len(said) >= 0.6
    placed_by = record["call"]["settings"]["placed"]
    assert placed_by["reason"] == "appointment reminder" and placed_by["by"].startswith("key:"), placed_by
    # what the callee heard joined the history: the first message is the call's first turn
    (first,) = call_records(server.log(), body["call_id"])
    assert words(first["text"]) == words(FIRST_MESSAGE), first


async def test_placing_calls_needs_a_key_and_a_reachable_destination(sip_server: tuple[Server, int]) -> None:
    server, _ = sip_server
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        assert (await http.post("/api/calls/outbound", json={"to": "sip:x@127.0.0.1"})).status_code == 401
        authed = {"Authorization": f"Bearer {KEY}"}
        bad = await http.post("/api/calls/outbound", json={"to": "+15550001111"}, headers=authed)
        assert bad.status_code == 400 and "sip.trunk.address" in bad.json()["error"]["message"], bad.text
        unknown = await http.post("/api/calls/outbound", json={"to": "sip:x@127.0.0.1", "colour": "red"},
                                  headers=authed)
        assert unknown.status_code == 400, unknown.text


async def test_ten_sip_calls_at_once_are_all_answered_where_the_server_takes_ten(
        sip_server: tuple[Server, int], tmp_path: Path) -> None:
    _, port = sip_server
    status, output = await sipp(f"127.0.0.1:{port}", "uac", calls=10, limit=10, rate=20, hold_ms=4000,
                                folder=tmp_path / "sipp")
    assert status == 0, output
    assert re.search(r"Successful call\s*\|\s*\d+\s*\|\s*10\b", output), output


async def test_a_trunk_call_in_a_law_with_keypad_events_reaches_the_session(
        sip_server: tuple[Server, int], tmp_path: Path) -> None:
    server, port = sip_server
    before = calls_in_log(server)
    status, output = await sipp(f"127.0.0.1:{port}", "uac_pcap", folder=tmp_path / "sipp", hold_ms=1000)
    assert status == 0, output
    (call_id,) = [c for c in calls_in_log(server) if c not in before]
    log = server.log()
    assert re.search(rf"{call_id}: connected \(PCMA,", log), log[-3000:]
    assert re.search(rf"{call_id}: key pressed: 1", log), log[-3000:]  # SIPp's RFC 4733 recording is key 1


async def test_a_trunk_call_over_tcp_through_the_kamailio_edge_is_answered_with_its_media(
        sip_server: tuple[Server, int], tmp_path: Path) -> None:
    """SIP over TCP (docs/sip.md): the trunk reaches Kamailio (deploy/kamailio/edge.cfg) over TCP, which
    relays the INVITE, ACK and BYE to the service over UDP; the RTP goes straight to the service."""
    server, port = sip_server
    before = calls_in_log(server)
    async with kamailio_edge(tmp_path / "kamailio", port) as edge:
        status, output = await sipp(f"127.0.0.1:{edge}", "uac_pcap", folder=tmp_path / "sipp", hold_ms=1000, tcp=True)
        # no open relay: a call sent to the edge for somewhere else is refused
        relayed, refusal = await sipp(f"127.0.0.1:{free_udp_port()}", "uac", folder=tmp_path / "relay", tcp=True,
                                      send_to=f"127.0.0.1:{edge}", timeout=10)
    assert status == 0, output + (tmp_path / "kamailio" / "kamailio.log").read_text()[-3000:]
    assert relayed != 0 and "403 Forbidden" in refusal, refusal
    (call_id,) = [c for c in calls_in_log(server) if c not in before]
    log = server.log()
    assert re.search(rf"{call_id}: connected \(PCMA,", log), log[-3000:]
    assert re.search(rf"{call_id}: key pressed: 1", log), log[-3000:]  # the call's RTP reached the session
    assert re.search(r"INVITE from tcp:127\.0\.0\.1:\d+ to sip:\S+ via sip:127\.0\.0\.1:" + str(port),
                     (tmp_path / "kamailio" / "kamailio.log").read_text())  # it came over TCP


async def test_a_caller_from_an_untrusted_address_must_authenticate(
        sip_server: tuple[Server, int], tmp_path: Path) -> None:
    _, port = sip_server
    quiet = microphone(tmp_path, None, after_s=3)
    wrong = await Baresip(tmp_path / "wrong", quiet, host="127.0.0.2", auth=(TRUNK_USER, "not-the-password")).run(
        8, dial=f"sip:agent@127.0.0.1:{port}")
    assert not wrong.established, wrong.log[-2000:]
    stranger = await Baresip(tmp_path / "stranger", quiet, host="127.0.0.2").run(8, dial=f"sip:agent@127.0.0.1:{port}")
    assert not stranger.established, stranger.log[-2000:]
    right = await Baresip(tmp_path / "right", quiet, host="127.0.0.2", auth=(TRUNK_USER, TRUNK_PASSWORD)).run(
        8, dial=f"sip:agent@127.0.0.1:{port}")
    assert right.established, right.log[-2000:]


async def test_a_caller_who_asks_for_the_front_desk_is_transferred_there(
        sip_server: tuple[Server, int], tmp_path: Path) -> None:
    server, port = sip_server
    desk = Baresip(tmp_path / "desk", microphone(tmp_path, None, after_s=40), port=DESK_PORT, user="desk")
    answering = await desk.answering(45)
    caller = Baresip(tmp_path / "caller", microphone(tmp_path, "Please transfer me to the front desk.", after_s=25))
    before = calls_in_log(server)
    heard = await caller.run(35, dial=f"sip:agent@127.0.0.1:{port}")
    assert heard.established, heard.log[-2000:]
    (call_id,) = [c for c in calls_in_log(server) if c not in before]
    log = server.log()
    assert re.search(rf"{call_id}: transferring the call to sip:\S+ \(REFER\)", log), log[-4000:]
    answered = await answering
    # the caller's phone followed the REFER: the desk's phone was called by it and answered
    assert re.search(r"desk@127\.0\.0\.1: Call established: sip:tester@", answered.log), answered.log[-3000:]
    turns = call_records(log, call_id)
    assert [t["status"] for t in turns] == ["tool_calls", "completed"], turns
    async with httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {KEY}"}) as http:
        record = await until(http, f"/api/calls/{call_id}", record_ended)
    assert record["call"]["end_reason"] == "transferred", record["call"]
    (tool_call,) = record["turns"][0]["tool_calls"]
    assert tool_call["name"] == "transfer_call" and "front desk" in tool_call["arguments"], tool_call


async def test_a_caller_put_through_to_billing_is_announced_to_them_then_joined(
        sip_server: tuple[Server, int], tmp_path: Path, recognizer: FasterWhisperRecognizer) -> None:
    server, port = sip_server
    rate = 8000
    # billing's phone: silent while it hears who is calling, then the person speaks twice (once the calls
    # are surely joined)
    said = flite_samples("This is Sam in billing.", tmp_path, rate).astype(np.float32) / 32768
    person_mic = write_wav(tmp_path / "billing.wav", np.concatenate(
        [np.zeros(18 * rate, np.float32), said, np.zeros(6 * rate, np.float32), said,
         np.zeros(15 * rate, np.float32)]))
    person = Baresip(tmp_path / "billing", person_mic, port=BILLING_PORT, user="billing")
    answering = await person.answering(60)
    caller = Baresip(tmp_path / "caller", microphone(tmp_path, "Please transfer me to billing.", after_s=45))
    before = calls_in_log(server)
    heard = await caller.run(55, dial=f"sip:agent@127.0.0.1:{port}")
    person_heard = await answering
    assert heard.established and person_heard.established, heard.log[-2000:] + person_heard.log[-2000:]
    (call_id,) = [c for c in calls_in_log(server) if c not in before]
    log = server.log()
    assert re.search(rf"{call_id}: warm transfer: billing answered and was told", log), log[-4000:]
    assert re.search(rf"{call_id}: joined to billing", log), log[-4000:]
    # billing heard who was calling before anything else; the caller heard the agent, then billing's person
    told = heard_words(recognizer, person_heard.audio())
    assert {"virtual", "assistant"} <= set(told), told  # tools.warm_transfer_message, its first words
    caller_heard = heard_words(recognizer, heard.audio())
    assert "sam" in caller_heard, caller_heard
    async with httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {KEY}"}) as http:
        record = await until(http, f"/api/calls/{call_id}", record_ended)
    assert record["call"]["end_reason"] == "transferred", record["call"]
    (tool_call,) = record["turns"][0]["tool_calls"]
    assert tool_call["name"] == "transfer_call" and "billing" in tool_call["arguments"], tool_call


VOICEMAIL = "Hello Jordan, this is the dental clinic. Your appointment is tomorrow at nine. Goodbye."


async def place_screened(server: Server, phone: Baresip, seconds: float) -> tuple[dict, Heard]:
    """A call out to `phone` with answering-machine detection leaving VOICEMAIL; (its state at the
    end, what the phone heard)."""
    ringing = await phone.answering(seconds)
    async with httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {KEY}"}) as http:
        placed = await http.post("/api/calls/outbound", json={
            "to": phone.uri, "first_message": FIRST_MESSAGE, "answering_machine": "leave_message",
            "voicemail_message": VOICEMAIL})
        assert placed.status_code == 201, placed.text
        heard = await ringing
        state = await until(http, f"/api/calls/outbound/{placed.json()['id']}", call_over)
    return state, heard


def speech_onsets(audio: np.ndarray, rate: int = 8000) -> list[float]:
    """Seconds at which sound starts after at least 300 ms of quiet (20 ms frames)."""
    frames = audio[: len(audio) // 160 * 160].reshape(-1, 160)
    loud = np.sqrt((frames ** 2).mean(axis=1)) > 0.02
    onsets, quiet = [], 15
    for i, is_loud in enumerate(loud):
        if is_loud and quiet >= 15:
            onsets.append(i * 160 / rate)
        quiet = 0 if is_loud else quiet + 1
    return onsets


async def test_a_machine_that_answers_a_call_out_gets_the_message_after_its_beep(
        sip_server: tuple[Server, int], tmp_path: Path, recognizer: FasterWhisperRecognizer) -> None:
    server, _ = sip_server
    rate = 8000
    greeting = flite_samples("Hi, you have reached Jordan. I can't take your call right now. Please leave a "
                             "message after the tone.", tmp_path, rate, voice="rms").astype(np.float32) / 32768
    beep = (0.3 * np.sin(2 * np.pi * 1000 * np.arange(int(0.5 * rate)) / rate)).astype(np.float32)
    lead, gap = np.zeros(int(0.4 * rate), np.float32), np.zeros(int(0.5 * rate), np.float32)
    machine = write_wav(tmp_path / "machine.wav", np.concatenate([lead, greeting, gap, beep,
                                                                  np.zeros(14 * rate, np.float32)]))
    beep_over_s = (len(lead) + len(greeting) + len(gap) + len(beep)) / rate
    state, heard = await place_screened(server, Baresip(tmp_path / "machine", machine), 22)

    assert state["answered_by"] == "machine" and state["machine_detection"]["at_s"] <= 5.0, state
    assert state["status"] == "ended" and state["detail"] == "voicemail_left", state
    audio = heard.audio()
    first_words = speech_onsets(audio)
    assert first_words and first_words[0] >= beep_over_s - 0.1, (first_words, beep_over_s)  # nothing over the greeting
    said = set(words(VOICEMAIL))
    assert len(said & set(heard_words(recognizer, audio))) / len(said) >= 0.6


async def test_a_person_who_answers_a_screened_call_hears_the_first_message(
        sip_server: tuple[Server, int], tmp_path: Path, recognizer: FasterWhisperRecognizer) -> None:
    server, _ = sip_server
    person = microphone(tmp_path, "Hello?", after_s=14)
    state, heard = await place_screened(server, Baresip(tmp_path / "person", person), 16)

    assert state["answered_by"] == "human" and state["machine_detection"]["at_s"] <= 3.0, state
    assert state["status"] == "ended" and state["detail"] == "hangup", state  # the person hung up
    said = set(words(FIRST_MESSAGE))
    assert len(said & set(heard_words(recognizer, heard.audio()))) / len(said) >= 0.6
