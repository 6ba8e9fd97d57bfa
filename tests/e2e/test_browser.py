"""The browser page end to end: headless Chromium opens the real server's page, its fake microphone
plays a spoken question (a WAV made with espeak-ng), and the page must show the caller's transcript,
the agent's reply, play reply audio and fill the latency table: over WebRTC (the page's default; the
reply heard through a WebAudio tap on the track it plays) and over the WebSocket (?transport=ws).

Chromium loops the fake-capture file unless its path ends in `%noloop`; the test plays it once, so
the question is asked once, followed by silence (the padding in the file, then the digital silence
Chromium gives after its end). The number of turns is still not asserted.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.chromium import console, start_chromium
from tests.e2e.conftest import Server
from tests.speech import espeak_wav

pytestmark = [pytest.mark.browser, pytest.mark.slow]

QUESTION = "What is the capital of France?"
SILENCE_S = 4  # after the question, in the file: more than the endpointing silence
TIMEOUT_S = 90.0

# What the test reads from the page on each poll.
SNAPSHOT_JS = """
const va = window.voiceAgent;
const texts = (sel) => [...document.querySelectorAll(sel)].map((e) => e.textContent);
const cells = (tr) => [...tr.cells].map((td) => td.textContent);
return {
  state: va.state,
  events: va.events.map((e) => e.type),
  transport: va.transport,
  fallback: va.fallback,
  audioHeardMs: va.audioHeardMs,
  audioBytesReceived: va.audioBytesReceived,
  audioChunksPlayed: va.audioChunksPlayed,
  playbackFlushes: va.playbackFlushes,
  playedReports: va.playedReports,
  userFinal: texts("#transcript .user.final"),
  bot: texts("#transcript .bot"),
  latencyRows: [...document.querySelectorAll("#latency tbody tr")].map((tr) => cells(tr)),
  errors: texts("#errors p"),
  status: document.getElementById("status").textContent,
};
"""


@pytest.fixture
def question_wav(tmp_path: Path) -> Path:
    """The spoken question followed by silence, 16 kHz mono 16-bit PCM."""
    speech = espeak_wav(QUESTION, tmp_path / "question.wav", rate=16000)
    padded = tmp_path / "question_padded.wav"
    subprocess.run(["sox", "-D", str(speech), str(padded), "pad", "0", str(SILENCE_S)], check=True)
    return padded


@pytest.fixture
def browser(tmp_path: Path, question_wav: Path) -> Iterator[Any]:
    driver = start_chromium(
        tmp_path / "chromium-profile", "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={question_wav}%noloop", "--autoplay-policy=no-user-gesture-required")
    try:
        yield driver
    finally:
        driver.quit()


def _done(snap: dict[str, Any]) -> bool:
    heard = any("capital" in t.lower() and "france" in t.lower() for t in snap["userFinal"])
    replied = any(t.strip() for t in snap["bot"])
    played = (snap["audioHeardMs"] > 200 if snap["transport"] == "webrtc" else
              snap["audioBytesReceived"] > 0 and snap["audioChunksPlayed"] > 0)
    return heard and replied and played and len(snap["latencyRows"]) > 0


def _report(driver: Any, server: Server, snap: dict[str, Any] | None) -> str:
    return (f"page: {json.dumps(snap, indent=1)}\nbrowser console:\n{console(driver)}\n"
            f"server log (tail):\n{server.log()[-3000:]}")


@pytest.mark.parametrize("transport", ["webrtc", "ws"])
def test_browser_call(server: Server, browser: Any, transport: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get(server.base_url + ("/" if transport == "webrtc" else "/?transport=ws"))
    assert browser.execute_script("return window.voiceAgent.state") == "idle"
    browser.find_element(By.ID, "start").click()

    snap: dict[str, Any] | None = None
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        snap = browser.execute_script(SNAPSHOT_JS)
        assert snap is not None
        if snap["state"] == "closed" or _done(snap):
            break
        time.sleep(0.5)
    assert snap is not None and _done(snap), "the page did not complete a turn:\n" + _report(browser, server, snap)

    assert snap["transport"] == transport and snap["fallback"] is None, snap
    assert snap["state"] == "listening"
    assert snap["status"] == "listening"
    assert "session.started" in snap["events"]
    turn, status, *marks, tokens_per_s = snap["latencyRows"][0]
    assert turn.isdigit() and status in ("completed", "completed (preemptive)"), snap["latencyRows"]
    # ms after speech_end (a preemptive reply's LLM and TTS marks can come before it: negative)
    assert marks[0] == "0" and all(m.lstrip("-").isdigit() for m in marks), snap["latencyRows"]
    assert float(tokens_per_s) > 0, snap["latencyRows"]

    if transport == "ws":
        # the page reports what it has played, from its audio clock (output_audio.played), and the
        # server takes the reports without complaint (over WebRTC the server's track knows)
        deadline = time.monotonic() + 5
        while browser.execute_script(SNAPSHOT_JS)["playedReports"] == 0:
            assert time.monotonic() < deadline, "the page sent no output_audio.played:\n" + _report(browser, server,
                                                                                                    snap)
            time.sleep(0.2)
    assert not browser.execute_script(SNAPSHOT_JS)["errors"]

    browser.find_element(By.ID, "stop").click()
    deadline = time.monotonic() + 10
    while browser.execute_script("return window.voiceAgent.state") != "closed":
        assert time.monotonic() < deadline, "the page did not close after Stop:\n" + _report(browser, server, None)
        time.sleep(0.2)


# OpenAI's documented browser flow for the Realtime API over WebRTC, as an app on the server's origin
# runs it: the microphone as a track, the `oai-events` channel, the offer POSTed to /v1/realtime/calls
# (this server has no keys; with keys the app sends an ephemeral `ek_` key), the answer set; the reply's
# track is played by an <audio> element and tapped to hear it.
REALTIME_FLOW_JS = """
const done = arguments[arguments.length - 1];
(async () => {
  const flow = (window.realtimeFlow = { events: [], heardMs: 0, error: null });
  const pc = new RTCPeerConnection();
  const audio = document.createElement("audio");
  audio.autoplay = true;
  document.body.append(audio);
  pc.ontrack = (e) => {
    audio.srcObject = e.streams[0];
    const ctx = new AudioContext();
    const analyser = ctx.createAnalyser();
    ctx.createMediaStreamSource(e.streams[0]).connect(analyser);
    const samples = new Float32Array(analyser.fftSize);
    setInterval(() => {
      analyser.getFloatTimeDomainData(samples);
      if (samples.some((s) => Math.abs(s) > 0.01)) flow.heardMs += 20;
    }, 20);
  };
  const mic = await navigator.mediaDevices.getUserMedia({ audio: true });
  pc.addTrack(mic.getTracks()[0]);
  const dc = pc.createDataChannel("oai-events");
  dc.addEventListener("message", (e) => flow.events.push(JSON.parse(e.data)));
  const offer = await pc.createOffer();
  await pc.setLocalDescription(offer);
  const response = await fetch("/v1/realtime/calls", {
    method: "POST", body: offer.sdp,
    headers: { Authorization: "Bearer not-needed-here", "Content-Type": "application/sdp" },
  });
  flow.status = response.status;
  await pc.setRemoteDescription({ type: "answer", sdp: await response.text() });
})().then(() => done(true), (err) => { window.realtimeFlow.error = String(err); done(false); });
"""


def test_openais_browser_flow_calls_the_realtime_webrtc_endpoint(server: Server, browser: Any) -> None:
    browser.get(server.base_url + "/")
    browser.set_script_timeout(30)
    started = browser.execute_async_script(REALTIME_FLOW_JS)
    flow: dict[str, Any] = {}
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        flow = browser.execute_script("return window.realtimeFlow")
        if flow["error"] or (any(e["type"] == "response.done" for e in flow["events"]) and flow["heardMs"] > 200):
            break
        time.sleep(0.5)
    report = f"{json.dumps({**flow, 'events': [e['type'] for e in flow['events']]})}\n{console(browser)}"
    assert started and flow["status"] == 201 and not flow["error"], report
    kinds = [e["type"] for e in flow["events"]]
    assert kinds[0] == "session.created", report
    heard = [e["transcript"] for e in flow["events"]
             if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert any("capital" in t.lower() and "france" in t.lower() for t in heard), report
    done = next(e for e in flow["events"] if e["type"] == "response.done")
    assert done["response"]["status"] == "completed", report
    assert "output_audio_buffer.started" in kinds and flow["heardMs"] > 200, report  # the reply heard on the track
