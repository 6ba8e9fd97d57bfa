"""Bad input gets a clear error and never disturbs another caller (real server, real models)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from app.client import VoiceClient
from tests.e2e.conftest import Server, ask_once
from tests.speech import words

pytestmark = pytest.mark.slow


async def healthy_call(server: Server, tmp: Path) -> dict:
    client = await ask_once(server, "How many days are there in a week?", tmp)
    done = client.events("response.done")[0]
    await client.close()
    return done


async def misbehave(server: Server) -> list[dict]:
    client = VoiceClient(server.ws_url, 16000)
    await client.open()

    async def expect(code: str) -> dict:
        count = len(client.events("error"))
        await client.wait_for(lambda e: e["type"] == "error" and len(client.events("error")) > count, 10)
        error = client.events("error")[-1]
        assert error["code"] == code, error
        assert error["message"], error
        return error

    errors = []
    await client.send_raw(b"\x00\x01" * 160)
    errors.append(await expect("session_not_started"))
    await client.send_raw("{this is not json")
    errors.append(await expect("invalid_json"))
    await client.send_raw(json.dumps({"type": "dance"}))
    errors.append(await expect("unknown_type"))
    await client.send_raw(json.dumps({"type": "session.start", "audio": {"sample_rate": 44100}}))
    errors.append(await expect("unsupported_sample_rate"))
    # a corrected session.start is accepted on the same connection
    await client.send_raw(json.dumps({"type": "session.start", "audio": {"sample_rate": 16000}}))
    await client.wait_for(lambda e: e["type"] == "session.started", 10)
    await client.send_raw(b"\x00" * 321)
    errors.append(await expect("invalid_audio_frame"))
    await client.send_raw(b"\x00" * 64000)
    errors.append(await expect("frame_too_large"))
    await client.send_raw(json.dumps({"type": "session.start", "audio": {"sample_rate": 16000}}))
    errors.append(await expect("session_already_started"))
    await client.send_raw(json.dumps({"type": "session.end", "pad": "x" * 20000}))
    errors.append(await expect("message_too_large"))
    await client.send_raw(json.dumps({"type": "session.end", "extra": 1}))
    errors.append(await expect("invalid_message"))
    # still alive: good audio is still taken, and session.end closes cleanly
    await client.silence(0.2)
    await client.send_json({"type": "session.end"})
    assert await client.wait_closed(10) == 1000
    return errors


async def test_bad_input_gets_errors_and_other_callers_do_not_notice(server: Server, tmp_path: Path) -> None:
    done, errors = await asyncio.gather(healthy_call(server, tmp_path), misbehave(server))
    assert done["status"] == "completed"
    assert "seven" in words(done["text"]) or "7" in done["text"], done
    assert len(errors) == 9


async def test_too_many_bad_messages_close_the_session(server: Server) -> None:
    client = VoiceClient(server.ws_url, 16000)
    await client.open()
    for _ in range(60):
        await client.send_raw("nope")
    assert await client.wait_closed(10) == 1008
    assert client.events("error")[-1]["code"] == "too_many_errors"
