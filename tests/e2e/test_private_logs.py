"""A real phone call (the phone simulator, tests/phone_sim.py, against a real server with real
models) whose caller says a card number, a name and what they want, and keys in digits; the
server's INFO log, read afterwards, holds none of it, nor the caller's number
(server.log_caller_content at its default, "redacted"). The call store still has every word: the
log is not where a call is kept."""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Server, start_server, stop_server
from tests.phone_sim import dial
from tests.speech import speech_samples, words

pytestmark = pytest.mark.slow

PUBLIC = "https://voice.example.test"
TOKEN = "e2e-private-logs-token"
SAID = "My card number is 4 7 1 9. Please book a table for Margaret."  # the recognizer writes 4719
KEYS = "50731"
# what the log must not hold, however the recognizer wrote it (4719, 4 7 1 9, 4-7-1-9), and the keys; not
# part of another number ("0.4719", "14719.5")
PRIVATE = [re.compile(r"(?<![\w.])4[ ,-]{0,2}7[ ,-]{0,2}1[ ,-]{0,2}9(?!\w|\.\d)"),
           re.compile(r"(?<![\w.])5 ?0 ?7 ?3 ?1(?!\w|\.\d)")]


@pytest.fixture(scope="module")
def private_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("private")
    server, proc = start_server(tmp, env={
        "VOICE_AGENT_TWILIO__AUTH_TOKEN": TOKEN, "VOICE_AGENT_TWILIO__PUBLIC_URL": PUBLIC,
        "VOICE_AGENT_STORAGE__DATA_DIR": str(tmp / "data"),  # this server's calls only
        "VOICE_AGENT_SERVER__LOG_LEVEL": "info"})  # server.log_caller_content: the default
    yield server
    stop_server(proc)


async def stored_call(server: Server, until: Any, timeout: float = 90) -> dict[str, Any]:
    """The only call this server kept, once `until(call)` holds (call: GET /api/calls/{id})."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=server.base_url, timeout=5) as http:
        while True:
            listed = (await http.get("/api/calls")).json()["calls"]
            if listed:
                call: dict[str, Any] = (await http.get(f"/api/calls/{listed[0]['id']}")).json()
                if until(call):
                    return call
            assert time.monotonic() < deadline, f"not kept in time:\n{server.log()[-3000:]}"
            await asyncio.sleep(0.3)


def said(call: dict[str, Any], text: str) -> bool:
    return any(text in (turn["user_text"] or "").lower() for turn in call["turns"])


async def test_the_info_log_of_a_real_call_holds_no_callers_words_keys_or_number(
        private_server: Server, tmp_path: Path) -> None:
    number = "+1555" + "".join(secrets.choice("0123456789") for _ in range(7))
    start = len(private_server.log())
    sim = await dial(private_server.base_url, private_server.base_url.replace("http://", "ws://"), PUBLIC, TOKEN,
                     caller=number)
    await asyncio.sleep(0.4)
    await sim.say(speech_samples(SAID, tmp_path, 8000))
    # the first turn kept, whatever the recognizer made of it (once "Please look available for my address"):
    # what is checked below is that none of its words reach the log
    await stored_call(private_server, lambda call: any(turn["user_text"] for turn in call["turns"]))
    await sim.wait_until(sim.heard_everything, 60)
    for key in KEYS:
        await sim.dtmf(key)
        await asyncio.sleep(0.2)
    await stored_call(private_server, lambda call: said(call, "pressed"))
    await sim.hangup()
    call = await stored_call(private_server, lambda call: call["call"]["ended_at"] is not None)
    log = private_server.log()[start:]

    # the store has what was said and keyed in (and the number), so there was something to keep out
    transcript = " ".join(turn["user_text"] or "" for turn in call["turns"])
    assert "The caller pressed 5 0 7 3 1 on the phone keypad." in transcript, transcript
    assert call["call"]["caller"] == number
    # the log holds none of it
    spoken = {w for w in words(transcript) if len(w) >= 4} - {"caller", "pressed", "phone", "keypad"}
    assert len(spoken) >= 3, transcript  # words of the caller's own to keep out of the log
    for word in spoken:
        assert not re.search(rf"\b{re.escape(word)}\b", log, re.IGNORECASE), (word, log[-3000:])
    for pattern in PRIVATE:
        assert not pattern.search(log), (pattern.pattern, log[-3000:])
    assert number[2:-2] not in log and "+1********" in log  # masked: country code and the last two digits
    # and says that it happened, and how much
    assert re.search(r"caller: \[\d+ words\]", log) and "keys [5 keys]" in log, log[-3000:]
    assert log.count("response.done ") >= 2
