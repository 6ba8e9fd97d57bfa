"""Callers who hang up and dial again at once are let in (issue 35): the real server on its default
limits (server.max_sessions 8, server.max_calls_per_client 4, server.admission_wait_s 2), real
models, real sockets, each caller on a loopback address of its own (127.0.0.0/8 is all loopback on
Linux). Each call asks a spoken question, waits for its reply's response.done, and hangs up by
closing the socket (no session.end); its caller dials again at once. The server hears such a
hang-up after the caller has already redialled, so without a short wait for the place being given
back, the redial was refused (5 of 10 answered from one address, 8 of 20 from eight)."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest

from app.client import VoiceClient
from tests.e2e.conftest import Server
from tests.speech import speech_samples

QUESTION = "What color is the sky on a clear day?"
REPLY_WAIT_S = 300.0  # eight calls at once on two cores: a reply may take minutes


async def one_call(server: Server, source: str, speech: np.ndarray) -> str:
    """A call from `source`: the question, its reply, hang up. Returns how it went."""
    client = VoiceClient(server.ws_url, 16000, source_address=source)
    try:
        started = await client.connect()
        if started["type"] != "session.started":
            return f"refused: {started.get('code')}: {started.get('message')}"
        await client.stream(speech, realtime=False)
        # the line stays open while the caller listens: silence, in real time, as a phone sends it
        # (a caller who sends nothing is closed after server.idle_timeout_s, and a reply on a loaded
        # 2-core machine can take longer than that)
        listening = asyncio.create_task(client.silence(REPLY_WAIT_S))
        try:
            done = await client.wait_for(lambda e: e["type"] == "response.done", REPLY_WAIT_S)
        finally:
            listening.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # the socket may be closed under it
                await listening
        return "answered" if done["status"] == "completed" and done["text"].strip() else f"not answered: {done}"
    except ConnectionError as exc:  # closed before session.started: refused by the guard (1013)
        return f"refused: {client.close_reason or exc}"
    finally:
        await client.hang_up()


async def calls(server: Server, sources: list[str], total: int, speech: np.ndarray) -> list[str]:
    """`total` calls, one caller per entry of `sources`, each dialling again as soon as its call ends."""
    left = iter(range(total))
    outcomes: list[str] = []

    async def caller(source: str) -> None:
        for _ in left:
            outcomes.append(await one_call(server, source, speech))

    await asyncio.gather(*(caller(s) for s in sources))
    return outcomes


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    return speech_samples(QUESTION, tmp_path_factory.mktemp("redial"))


async def test_ten_calls_from_one_address_four_at_a_time_are_all_answered(server: Server, speech: np.ndarray) -> None:
    outcomes = await calls(server, ["127.0.0.71"] * 4, 10, speech)
    assert outcomes == ["answered"] * 10, outcomes


async def test_twenty_calls_from_eight_addresses_eight_at_a_time_are_all_answered(
        server: Server, speech: np.ndarray) -> None:
    outcomes = await calls(server, [f"127.0.0.{80 + n}" for n in range(8)], 20, speech)
    assert outcomes == ["answered"] * 20, outcomes
