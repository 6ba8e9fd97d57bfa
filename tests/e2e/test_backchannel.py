"""While the bot talks, a noise or a backchannel ("yeah") does not interrupt it: real audio (a
non-speech noise burst made with sox, espeak-ng's "yeah") streamed over a real socket. The noise is
not speech to the VAD at all; the "yeah" is, and the reply's audio pauses while the server finds out
what was said, then goes on, and the turn completes. (A sound the VAD takes for speech but that
holds no words is tested with fake engines in tests/pipeline/test_session.py.)"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from app.client import VoiceClient, read_wav
from tests.e2e.conftest import Server
from tests.speech import speech_samples

pytestmark = pytest.mark.slow

TELLER = ("You are a storyteller on a phone call. Answer with a story of exactly five short sentences, "
          "then stop.")


def noise_burst(tmp: Path, seconds: float = 0.25) -> np.ndarray:
    """A short burst of loud brown noise: a sound that is not speech (a cough, a knock); the same in every run
    (sox -R)."""
    path = tmp / "burst.wav"
    subprocess.run(["sox", "-R", "-n", "-r", "16000", "-b", "16", "-c", "1", str(path), "synth", str(seconds),
                    "brownnoise", "vol", "0.6"], check=True)
    return read_wav(path)[0]


async def reply_audio_s(client: VoiceClient, rate: int) -> float:
    return sum(len(r.audio) for r in client.received if r.audio) / 2 / rate


@pytest.mark.parametrize("sound", ["noise", "yeah"])
async def test_a_cough_or_a_backchannel_does_not_interrupt(server: Server, tmp_path: Path, sound: str) -> None:
    client = VoiceClient(server.ws_url, 16000)
    await client.connect(instructions=TELLER)
    rate = client.session["output_audio"]["sample_rate"]
    await client.stream(speech_samples("Tell me a story about a lighthouse.", tmp_path))
    background = asyncio.create_task(client.silence(5))
    deadline = time.monotonic() + 90
    while await reply_audio_s(client, rate) < 1.0:
        assert time.monotonic() < deadline, "no reply audio arrived"
        await asyncio.sleep(0.05)
    background.cancel()

    mark = len(client.received)
    audio = noise_burst(tmp_path) if sound == "noise" else speech_samples("Yeah.", tmp_path)
    await client.stream(audio)
    trailing = asyncio.create_task(client.silence(60))
    done = await client.wait_for(lambda e: e["type"] == "response.done" and e["turn_id"] == 1, 90, after=mark)
    trailing.cancel()
    assert done["status"] == "completed", done
    # the sound made no turn of its own that got a reply
    assert not [e for e in client.events("response.done") if e["turn_id"] != 1]
    after = [r.event for r in client.received[mark:] if r.event]
    # "yeah" was heard as speech, and let go; the noise was never taken for speech
    assert any(e["type"] == "speech.started" for e in after) == (sound == "yeah"), after
    await client.close()
