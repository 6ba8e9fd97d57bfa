"""Benchmark: voice-to-voice latency through /ws, as a caller experiences it.

Streams spoken questions to the service in real time in 20 ms frames, each on a fresh call, and
prints per-stage p50/p95 of the turn's latency marks (ms since the server's speech_end) and the
true voice-to-voice latency: from the end of speech in the input audio to the first reply audio
byte received by the client. The caller's voice is hibari's (a neural voice, the closest to a
person's here), espeak-ng's (robotic; `--voice espeak`), or any voice of bench/voices.py by name
(`--voice piper-joe`, `--voice flite-awb`, `--voice flite-rms-phone`: voices the end-of-turn
settings were not chosen on, see bench/turn_set.py).

    .venv/bin/python bench/voice_latency.py                 # starts its own server (defaults)
    .venv/bin/python bench/voice_latency.py --url ws://127.0.0.1:8000/ws --repeat 3
    .venv/bin/python bench/voice_latency.py --url container=ws://127.0.0.1:8001/ws --url direct=ws://127.0.0.1:8000/ws

With --baseline, a second server runs with those settings as well, and every question goes to
both (taking turns at going first), so the two are compared side by side in one run:

    .venv/bin/python bench/voice_latency.py \
        --baseline VOICE_AGENT_TURN__ENGINE=off,VOICE_AGENT_SESSION__PREEMPTIVE=false

With --concurrency, N callers talk at once (each starting `--stagger` s after the one before, each
doing `--turns` turns on one call: a question, then silence until the reply is done, then the
next), for each N in the list, once per LLM scheduling policy (llm.schedule edf and fifo: one server
per policy, started side by side; the runs take turns). Per N and policy it prints voice-to-voice
p50/p95, deadline misses (first audio later than session.first_audio_budget_ms after the end of
speech) and playback underruns (gaps in reply audio once it started), as the server counted them.

    .venv/bin/python bench/voice_latency.py --concurrency 1,2,4,8 --turns 3 --json out.json

With --transport twilio, the caller phones in instead: the phone simulator (tests/phone_sim.py)
places a Twilio call (the signed webhook, then the Media Stream), says the question at 8 kHz mu-law
in real time and plays the reply back; the turn's marks come from the server's log of the call.
With --transport realtime, the caller is the official `openai` SDK on /v1/realtime (GA events,
24 kHz PCM in 20 ms appends, in real time); the marks come from `response.done`'s `voice_agent`.
With --transport webrtc, the caller is an aiortc peer calling as the page does (POST /webrtc/calls,
Opus both ways, the native protocol's events on the data channel: the same wire as /ws); the reply
is heard at its first audible sample out of the caller's track. A comma-separated list puts every question to one server
over each path, taking turns at going first (`both` is ws,twilio):

    .venv/bin/python bench/voice_latency.py --transport realtime,ws --repeat 2
    .venv/bin/python bench/voice_latency.py --transport webrtc,ws --voice flite-awb --repeat 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.client import VoiceClient, read_wav
from models import cpu
from pipeline.audio import resample
from pipeline.turns import MARKS
from tests.e2e.conftest import Server, start_server, stop_server
from tests.phone_sim import call_records, dial
from tests.speech import espeak_wav

QUESTIONS = [
    "What is the capital of France?",
    "How many days are there in a week?",
    "Can you book a table for two at eight tonight?",
    "What time do you open on Sunday?",
    "I would like to order a large pepperoni pizza.",
    "What is the weather usually like in London in spring?",
    "Tell me a fun fact about octopuses.",
    "How do I reset my password?",
]
FRAME_MS = 20


def speech_end_s(samples: np.ndarray, rate: int) -> float:
    """Seconds into the clip where the last sound above -40 dBFS ends."""
    loud = np.flatnonzero(np.abs(samples.astype(np.float32)) > 32768 * 0.01)
    return (loud[-1] + 1) / rate if len(loud) else 0.0


VOICE = "hibari"  # the caller's voice: set from --voice


_SPOKEN: dict[tuple[str, int], np.ndarray] = {}


def question_audio(question: str, tmp: Path, rate: int, tag: str = "") -> np.ndarray:
    """The question spoken in VOICE, as int16 samples at `rate` (made once: never while calls run)."""
    if (question, rate) not in _SPOKEN:
        _SPOKEN[question, rate] = _speak(question, tmp, rate, tag)
    return _SPOKEN[question, rate]


def _speak(question: str, tmp: Path, rate: int, tag: str) -> np.ndarray:
    if VOICE not in ("hibari", "espeak"):
        from bench.turn_set import pick_voices
        from bench.voices import Renderer, families

        picked = pick_voices(families(), [VOICE])
        if not picked:
            raise SystemExit(f"no voice {VOICE!r} here: see `.venv/bin/python bench/voices.py` for the voices")
        audio = resample(Renderer().say(picked[0], question), 16000, rate)
        return (np.clip(audio, -1, 1) * 32767).astype(np.int16)
    if VOICE == "espeak":
        samples, _ = read_wav(espeak_wav(question, tmp / f"q{abs(hash(question))}{tag}.wav", rate))
        return samples
    from hibari import SAMPLE_RATE, Hibari

    audio = np.concatenate([np.asarray(c, dtype=np.float32) for c in Hibari().stream(question)])
    audio = resample(audio, int(SAMPLE_RATE), rate)
    return (np.clip(audio, -1, 1) * 32767).astype(np.int16)


AUDIBLE_DBFS = -40.0  # the first reply sample this loud is the first the caller hears (speech's end: the same level)


def first_audible(chunks: list[tuple[float, bytes]], rate: int, dbfs: float = AUDIBLE_DBFS) -> float | None:
    """When the caller hears the reply's first audible sample: the reply plays from its first chunk's
    arrival, each chunk as soon as it has arrived and the one before has played (a chunk late
    delays the rest); leading silence or padding counts as waiting. `chunks`: (arrival time, PCM16)."""
    level = 32768 * 10 ** (dbfs / 20)
    clock = None  # when the next chunk's first sample plays
    for at, data in chunks:
        samples = np.frombuffer(data, dtype="<i2")
        clock = at if clock is None else max(clock, at)
        loud = np.flatnonzero(np.abs(samples.astype(np.int32)) >= level)
        if len(loud):
            return clock + float(loud[0]) / rate
        clock += len(samples) / rate
    return None


def gaps_heard(pieces: list[tuple[float, float]]) -> dict[str, float]:
    """The gaps a caller hears in a reply played as it arrives (the /ws page: the server sends it up to
    session.output_lead_ms ahead): `pieces` (arrival time, seconds of audio) in order, each played as
    soon as it has arrived and the one before has played; a wait over 10 ms for a late piece is a gap."""
    waits: list[float] = []
    clock: float | None = None
    for at, seconds in pieces:
        if clock is not None and at > clock + 0.01:
            waits.append(at - clock)
        clock = at + seconds if clock is None else max(clock, at) + seconds
    return {"gaps": len(waits), "gap_ms": round(1000 * sum(waits), 1)}


def timeline(true_end: float, received: list[Any], done: dict, rate: int) -> dict[str, float | None]:
    """One turn in ms from the true end of speech: the pause heard, its words known and weighed, the
    decision (speech.stopped sent), the first reply audio sent (the server's marks) and received,
    and its first audible sample as played (the headline)."""
    audio = [(r.at, r.audio) for r in received if r.audio and r.at > true_end]
    stopped = next((r.at for r in received if r.event and r.event.get("type") == "speech.stopped"
                    and r.at > true_end - 1), None)
    heard = first_audible(audio, rate)
    return {
        **server_timeline(done),
        "decision_received": None if stopped is None else round((stopped - true_end) * 1000, 1),
        "first_audio_received": round((audio[0][0] - true_end) * 1000, 1) if audio else None,
        "first_audible": None if heard is None else round((heard - true_end) * 1000, 1),
    }


def server_timeline(done: dict) -> dict[str, float | None]:
    """The turn's marks from the native `response.done`, in ms since the true end of speech as the server
    estimates it (by the caller's audio): the pause heard, the words weighed, the decision, the first
    reply audio sent."""
    marks, decision = done.get("latency_ms", {}), done.get("endpointing_ms", {})
    server_end = done.get("voice_to_voice_ms")
    # the server's clock: speech_end is decision 0; its estimate of the true end is first_audio_sent - v2v
    offset = (marks["first_audio_sent"] - server_end
              if server_end is not None and "first_audio_sent" in marks else None)

    def since_true_end(name: str, table: dict) -> float | None:
        return None if offset is None or name not in table else round(table[name] - offset, 1)

    return {
        "pause_heard": since_true_end("pause_heard", decision),
        "words_weighed": since_true_end("words_weighed", decision),
        "decided": None if offset is None else round(-offset, 1),
        "first_audio_sent": since_true_end("first_audio_sent", marks),
    }


async def one_call(url: str, question: str, tmp: Path, rate: int, noisy: bool = False) -> dict:
    """One question on a fresh call: after LEAD_S of silence, or with --noise (`noisy`) of the noise, which goes on
    under the question and after it until the reply is done."""
    samples = question_audio(question, tmp, rate)
    lead_s = NOISE_LEAD_S if NOISE is not None else 0.3  # with --noise, the clean calls wait as long
    lead = np.zeros(int(lead_s * rate), dtype=np.int16)
    audio = np.concatenate([lead, samples])
    end_in_clip = len(lead) / rate + speech_end_s(samples, rate)
    tail = np.zeros(int(20 * rate), dtype=np.int16)
    if noisy:
        audio, tail = with_noise(samples, len(lead), len(tail), rate)
    client = VoiceClient(url, rate)
    await client.connect()
    start = time.monotonic()
    # the frame holding the last speech sample leaves at this frame's start time
    true_end = start + int(end_in_clip * 1000) // FRAME_MS * FRAME_MS / 1000
    await client.stream(audio, FRAME_MS)
    trailing = asyncio.create_task(client.stream(tail, FRAME_MS))
    done = await client.wait_for(lambda e: e["type"] == "response.done", 120)
    trailing.cancel()
    first_audio = next((r.at for r in client.received if r.audio), None)
    heard_gaps = gaps_heard([(r.at, len(r.audio) / 2 / rate) for r in client.received if r.audio and r.at > true_end])
    final = client.events("transcript.final")
    stopped = client.events("speech.stopped")
    await client.close()
    return {
        "noise": f"{NOISE[0]}@{NOISE[1]:g}" if noisy and NOISE is not None else None,
        "ended_by": stopped[-1].get("ended_by") if stopped else None,
        "preemptive": done.get("preemptive", False),
        "discarded": done.get("discarded", 0),
        "question": question,
        "heard": final[0]["text"] if final else "",
        "reply": done["text"],
        "status": done["status"],
        "marks": done["latency_ms"],
        "server_v2v": done.get("voice_to_voice_ms"),
        "true_v2v": (first_audio - true_end) * 1000 if first_audio else None,
        "tokens_per_second": done.get("llm", {}).get("tokens_per_second"),
        "timeline": timeline(true_end, client.received, done, rate),
        **heard_gaps,
    }


NOISE: tuple[str, float] | None = None  # --noise: (family, SNR dB)
NOISE_LEAD_S = 3.0  # noise before the question: the line's background, as the VAD's noise floor learns it
_NOISE_TRACK: list[np.ndarray] = []  # two minutes of it at 16 kHz, RMS 1, made before the calls
_NOISE_CALLS = [0]


def make_noise_track() -> None:
    """The --noise family's track, made once before any call (rendering babble takes a while)."""
    from bench.noise_set import noise
    from bench.voices import Renderer

    assert NOISE is not None
    _NOISE_TRACK.append(noise(NOISE[0], 120.0, 0, Renderer()).astype(np.float32))


def with_noise(question: np.ndarray, lead: int, tail: int, rate: int) -> tuple[np.ndarray, np.ndarray]:
    """(the noise with the question in it from `lead`, the noise that goes on after it for `tail` samples), int16
    at `rate`: the noise at --noise's SNR below the question's active RMS, from a part of the track each call."""
    from bench.noise_set import active_rms

    assert NOISE is not None and _NOISE_TRACK
    speech = question.astype(np.float64) / 32768.0
    length = lead + len(speech) + tail
    track = resample(_NOISE_TRACK[0], 16000, rate) if rate != 16000 else _NOISE_TRACK[0]
    start = (_NOISE_CALLS[0] * 7919 * rate // 1000) % max(1, len(track) - length)
    _NOISE_CALLS[0] += 1
    line = track[start:start + length].astype(np.float64) * active_rms(speech) * 10 ** (-NOISE[1] / 20)
    line[lead:lead + len(speech)] += speech
    pcm = (np.clip(line, -1, 1) * 32767).astype(np.int16)
    return pcm[:lead + len(speech)], pcm[lead + len(speech):]


def caller_address(index: int) -> str:
    """Callers at once are people apart: each calls from an address of its own on loopback
    (127.0.0.2, 127.0.0.3, ...), so the server's per-client limits apply as they would, at their
    defaults."""
    return f"127.0.0.{2 + index % 250}"

PHONE_RATE = 8000
PUBLIC_URL = "https://voice.example.test"  # the public URL Twilio would call; the simulator signs for it
AUTH_TOKEN = "bench-twilio-auth-token"
# the phone call's words are read from the server's log, which names them only where it is told to
PHONE_ENV = {"VOICE_AGENT_TWILIO__AUTH_TOKEN": AUTH_TOKEN, "VOICE_AGENT_TWILIO__PUBLIC_URL": PUBLIC_URL,
             "VOICE_AGENT_SERVER__LOG_CALLER_CONTENT": "info"}


async def one_phone_call(server: Server, question: str, tmp: Path, noisy: bool = False) -> dict:
    """A question over the phone path: a signed Twilio call, 8 kHz mu-law both ways, in real time; with `noisy`,
    in --noise's noise as one_call has it."""
    samples = question_audio(question, tmp, PHONE_RATE)
    lead = np.zeros(int((NOISE_LEAD_S if NOISE is not None else 0.3) * PHONE_RATE), dtype=np.int16)
    audio = np.concatenate([lead, samples])
    tail = np.zeros(0, dtype=np.int16)
    if noisy:
        audio, tail = with_noise(samples, len(lead), 20 * PHONE_RATE, PHONE_RATE)
    after_end = len(audio) / PHONE_RATE - (len(lead) / PHONE_RATE + speech_end_s(samples, PHONE_RATE))
    sim = await dial(server.base_url, server.base_url.replace("http://", "ws://"), PUBLIC_URL, AUTH_TOKEN)
    trailing: asyncio.Task[float] | None = None
    try:
        spoke_until = await sim.say(audio)  # when the last frame left; the speech ended `after_end` before
        if len(tail):
            trailing = asyncio.create_task(sim.say(tail, PHONE_RATE))
        true_end = spoke_until - int(after_end * 1000) // FRAME_MS * FRAME_MS / 1000
        deadline = time.monotonic() + 120
        while not (done := call_records(server.log(), sim.call_sid)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no reply on the phone call {sim.call_sid}")
            await asyncio.sleep(0.05)
        first_audio = sim.first_media_after(0.0)  # the server says nothing before its reply
    finally:
        if trailing is not None:
            trailing.cancel()
        await sim.hangup()
    reply, heard = done[0], call_records(server.log(), sim.call_sid, "caller")
    return {
        "ended_by": None, "preemptive": reply.get("preemptive", False), "discarded": reply.get("discarded", 0),
        "noise": f"{NOISE[0]}@{NOISE[1]:g}" if noisy and NOISE is not None else None,
        "question": question, "heard": heard[0]["text"] if heard else "", "reply": reply["text"],
        "status": reply["status"], "marks": reply["latency_ms"], "server_v2v": reply.get("voice_to_voice_ms"),
        "true_v2v": (first_audio - true_end) * 1000 if first_audio else None,
        "tokens_per_second": reply.get("llm", {}).get("tokens_per_second"),
    }


SIP_CALLER: Any = None  # bench/sip_caller.py's SipCaller, made with the first SIP call
SIP_PORTS: dict[str, int] = {}  # the SIP port of each server this script starts (--transport sip), by its base URL


async def one_sip_call(server: Server, question: str, tmp: Path) -> dict:
    """A question over SIP as a trunk places it (bench/sip_caller.py): 8 kHz mu-law RTP both ways in
    real time, every reply packet timestamped on arrival; the reply is heard at its first audible
    sample, each packet played on arrival (a phone's smallest jitter buffer)."""
    global SIP_CALLER
    from bench.sip_caller import SipCaller

    if SIP_CALLER is None:
        SIP_CALLER = SipCaller()
    samples = question_audio(question, tmp, PHONE_RATE)
    clip = np.concatenate([np.zeros(int(0.3 * PHONE_RATE), dtype=np.int16), samples])
    end_in_clip = 0.3 + speech_end_s(samples, PHONE_RATE)
    before = set(re.findall(r"(sip_[0-9a-f]{16}): a call from", server.log()))
    start, received = await SIP_CALLER.call(("127.0.0.1", SIP_PORTS[server.base_url]), clip, after_s=14.0)
    true_end = start + end_in_clip
    ids = [c for c in dict.fromkeys(re.findall(r"(sip_[0-9a-f]{16}): a call from", server.log())) if c not in before]
    if not ids:
        raise RuntimeError("the server logged no SIP call")
    deadline = time.monotonic() + 20
    while not (done := call_records(server.log(), ids[0])):
        if time.monotonic() > deadline:  # counted as a turn without a reply, and shown
            lines = [line for line in server.log().splitlines() if ids[0] in line]
            print(f"  no reply on the SIP call {ids[0]}:\n    " + "\n    ".join(lines[-8:]), flush=True)
            return {"ended_by": None, "question": question, "heard": "", "reply": "", "status": "no_reply",
                    "marks": {}, "server_v2v": None, "true_v2v": None, "tokens_per_second": None}
        await asyncio.sleep(0.05)
    after = [(at, pcm) for at, pcm in received.packets if at > true_end]
    audible = first_audible(after, PHONE_RATE)
    arrived = next((at for at, pcm in after if np.frombuffer(pcm, dtype="<i2").any()), None)
    reply, heard = done[0], call_records(server.log(), ids[0], "caller")
    return {
        "ended_by": None, "preemptive": reply.get("preemptive", False), "discarded": reply.get("discarded", 0),
        "question": question, "heard": heard[0]["text"] if heard else "", "reply": reply["text"],
        "status": reply["status"], "marks": reply["latency_ms"], "server_v2v": reply.get("voice_to_voice_ms"),
        "true_v2v": (audible - true_end) * 1000 if audible else None,
        "tokens_per_second": reply.get("llm", {}).get("tokens_per_second"),
        "timeline": {**server_timeline(reply),
                     "first_audio_received": None if arrived is None else round((arrived - true_end) * 1000, 1),
                     "first_audible": None if audible is None else round((audible - true_end) * 1000, 1)},
    }


REALTIME_RATE = 24000


async def one_realtime_call(server: Server, question: str, tmp: Path) -> dict:
    """A question through /v1/realtime with the official SDK: 24 kHz PCM appends in real time."""
    import base64

    from openai import AsyncOpenAI

    samples = question_audio(question, tmp, REALTIME_RATE)
    lead = np.zeros(int(0.3 * REALTIME_RATE), dtype=np.int16)
    audio = np.concatenate([lead, samples])
    end_in_clip = len(lead) / REALTIME_RATE + speech_end_s(samples, REALTIME_RATE)
    frame = REALTIME_RATE * FRAME_MS // 1000
    silence = base64.b64encode(np.zeros(frame, dtype="<i2").tobytes()).decode()
    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key="bench")
    async with client.realtime.connect(model="gpt-realtime") as connection:
        events: list[tuple[float, object]] = []

        async def read() -> None:
            async for event in connection:
                events.append((time.monotonic(), event))

        reader = asyncio.create_task(read())
        session: Any = {"type": "realtime", "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": REALTIME_RATE}, "turn_detection": {"type": "server_vad"}},
            "output": {"format": {"type": "audio/pcm", "rate": REALTIME_RATE}}}}
        await connection.session.update(session=session)
        start = time.monotonic()
        true_end = start + int(end_in_clip * 1000) // FRAME_MS * FRAME_MS / 1000
        sent = 0
        for i in range(0, len(audio), frame):  # paced like VoiceClient.stream: frame i leaves at start + i/rate
            await asyncio.sleep(max(0.0, start + i / REALTIME_RATE - time.monotonic()))
            await connection.input_audio_buffer.append(
                audio=base64.b64encode(audio[i:i + frame].astype("<i2").tobytes()).decode())
            sent += 1
        deadline = time.monotonic() + 120
        while not any(getattr(e, "type", "") == "response.done" for _, e in events):
            if time.monotonic() > deadline or reader.done():
                raise TimeoutError(f"no response.done on /v1/realtime for {question!r}")
            await asyncio.sleep(max(0.0, start + sent * FRAME_MS / 1000 - time.monotonic()))
            await connection.input_audio_buffer.append(audio=silence)
            sent += 1
        reader.cancel()
    first_audio = next((at for at, e in events if getattr(e, "type", "") == "response.output_audio.delta"), None)
    done = next(e for _, e in events if getattr(e, "type", "") == "response.done").model_dump()["response"]
    heard = [e for _, e in events if getattr(e, "type", "").endswith("input_audio_transcription.completed")]
    ours = done.get("voice_agent", {})
    return {
        "ended_by": None, "preemptive": ours.get("preemptive", False), "discarded": ours.get("discarded", 0),
        "question": question, "heard": getattr(heard[0], "transcript", "") if heard else "",
        "reply": done["output"][0]["content"][0].get("transcript", "") if done.get("output") else "",
        "status": done["status"], "marks": ours.get("latency_ms", {}), "server_v2v": ours.get("voice_to_voice_ms"),
        "true_v2v": (first_audio - true_end) * 1000 if first_audio else None,
        "tokens_per_second": ours.get("llm", {}).get("tokens_per_second"),
    }


def webrtc_playout(heard: Any, true_end: float, level: float, frame_s: float = 0.02) -> dict[str, Any]:
    """The reply as a browser's jitter buffer plays it (`heard`: tests/webrtc_caller.Heard). Frame k plays
    at its place in the stream (its RTP time) plus the link's offset and a delay that covers the link's
    jitter as the buffer learnt it on the 2 s of the stream before the reply (the server sends silence
    between replies): the 95th percentile of how much later than the earliest the frames came. A
    frame of the reply that comes after its time, or never, is concealed: a gap heard."""
    frames = [(at, s, p) for (at, s), p in zip(heard.frames, heard.pts, strict=True) if p is not None]
    reply = [(at, s, p) for at, s, p in frames if at > true_end and np.abs(s).max(initial=0) > level]
    if not reply:
        return {"first_audible": None, "gaps": 0, "gap_ms": 0.0, "buffer_ms": None}
    first_at = min(at for at, _, _ in reply)
    before = sorted(at - p for at, _, p in frames if first_at - 2.0 <= at < first_at)
    base = before[0] if before else min(at - p for at, _, p in reply)
    buffer = before[round(0.95 * (len(before) - 1))] - base if before else 0.0
    arrivals = {round(p, 3): at for at, _, p in frames}
    start, end = min(p for _, _, p in reply), max(p for _, _, p in reply)
    at, samples, _ = next(f for f in reply if f[2] == start)
    loud = np.flatnonzero(np.abs(samples) > level)
    audible = max(start + base + buffer, at) + float(loud[0]) / heard.rate
    gaps, gap_s, in_gap = 0, 0.0, False
    for k in range(round((end - start) / frame_s) + 1):
        place = start + k * frame_s
        came = arrivals.get(round(place, 3))
        bad = came is None or came > place + base + buffer + 0.001
        gaps += bad and not in_gap
        gap_s += frame_s if bad else 0.0
        in_gap = bad
    return {"first_audible": audible, "gaps": gaps, "gap_ms": round(1000 * gap_s, 1),
            "buffer_ms": round(1000 * buffer, 1)}


WEBRTC_AS_ARRIVED = True  # --webrtc-jitter-buffer aiortc: the caller holds 4 packets before playing, as aiortc does


async def one_webrtc_call(server: Server, question: str, tmp: Path) -> dict:
    """A question over WebRTC with an aiortc caller (tests/webrtc_caller.py) as the page makes it: POST
    /webrtc/calls, Opus both ways, the native protocol's events on the data channel (the same wire as
    /ws, so only the transport differs). The reply is heard at its first audible sample as a jitter
    buffer plays it (webrtc_playout)."""
    from tests.webrtc_caller import MIC_RATE, WebRTCCaller

    samples = question_audio(question, tmp, MIC_RATE)
    audio = np.concatenate([np.zeros(int(0.3 * MIC_RATE), dtype=np.int16), samples])
    end_in_clip = 0.3 + speech_end_s(samples, MIC_RATE)
    caller = WebRTCCaller(server.base_url, channel="events", as_arrived=WEBRTC_AS_ARRIVED)
    try:
        answer = await caller.call(path="/webrtc/calls")
        if answer.status_code != 201:
            raise RuntimeError(f"/webrtc/calls answered {answer.status_code}: {answer.text[:200]}")
        await asyncio.wait_for(caller.opened.wait(), 30)
        caller.send(type="session.start", audio={"sample_rate": MIC_RATE})
        await caller.wait_for("session.started", 30)
        clip_end = caller.mic.say(audio)
        true_end = clip_end - (len(audio) / MIC_RATE - end_in_clip)
        done = await caller.wait_for("response.done", 120)
        final = [e for e in caller.events if e["type"] == "transcript.final"]
        await asyncio.sleep(0.5)  # the rest of the reply's first words arrive
        played = webrtc_playout(caller.heard, true_end, 10 ** (AUDIBLE_DBFS / 20))
        audible = played["first_audible"]
        received = next((at for at, s in caller.heard.frames if at > true_end and s.any()), None)
    finally:
        await caller.close()
    return {
        "ended_by": None, "preemptive": done.get("preemptive", False), "discarded": done.get("discarded", 0),
        "question": question, "heard": final[0]["text"] if final else "", "reply": done["text"],
        "status": done["status"], "marks": done["latency_ms"], "server_v2v": done.get("voice_to_voice_ms"),
        "true_v2v": (audible - true_end) * 1000 if audible else None,
        "tokens_per_second": done.get("llm", {}).get("tokens_per_second"), "underruns": done.get("underruns"),
        "timeline": {**server_timeline(done),
                     "first_audio_received": None if received is None else round((received - true_end) * 1000, 1),
                     "first_audible": None if audible is None else round((audible - true_end) * 1000, 1)},
        "gaps": played["gaps"], "gap_ms": played["gap_ms"], "jitter_buffer_ms": played["buffer_ms"],
    }


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run(urls: dict[str, Any], repeat: int, rate: int
              ) -> dict[str, list[dict]]:
    """Every question on every target (named: a /ws URL, a server called by phone, or ("realtime",
    server)), taking turns at going first."""
    results: dict[str, list[dict]] = {name: [] for name in urls}
    names = list(urls)
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(repeat):
            for i, question in enumerate(QUESTIONS):
                shift = (round_ * len(QUESTIONS) + i) % len(names)
                for name in names[shift:] + names[:shift]:
                    target = urls[name]
                    if isinstance(target, str):
                        r = await one_call(target, question, Path(tmp), rate)
                    elif isinstance(target, tuple) and isinstance(target[1], str):  # ("noise", a /ws URL)
                        r = await one_call(target[1], question, Path(tmp), rate, noisy=True)
                    elif isinstance(target, tuple) and target[0] == "phone-noise":
                        r = await one_phone_call(target[1], question, Path(tmp), noisy=True)
                    elif isinstance(target, tuple) and target[0] == "webrtc":
                        r = await one_webrtc_call(target[1], question, Path(tmp))
                    elif isinstance(target, tuple) and target[0] == "sip":
                        r = await one_sip_call(target[1], question, Path(tmp))
                    elif isinstance(target, tuple):
                        r = await one_realtime_call(target[1], question, Path(tmp))
                    else:
                        r = await one_phone_call(target, question, Path(tmp))
                    results[name].append(r)
                    print(f"  {name:8s} {r['true_v2v'] or float('nan'):6.0f} ms  heard {r['heard']!r} -> "
                          f"{r['reply'][:60]!r}", flush=True)
    for name, turns in results.items():
        report(name, turns)
    if len(names) == 2:
        a, b = (statistics.median(v) if (v := [r["true_v2v"] for r in results[n] if r["true_v2v"]]) else None
                for n in names)
        if a and b:
            print(f"\ntrue voice-to-voice median: {names[0]} {a:.0f} ms, {names[1]} {b:.0f} ms, "
                  f"difference {a - b:+.0f} ms, ratio {a / b:.2f}")
        heard = [[t["timeline"]["first_audible"] for t in results[n] if t.get("timeline", {}).get("first_audible")]
                 for n in names]
        if all(heard):
            (a50, b50), (a90, b90) = ((statistics.median(h) for h in heard), (pct(h, 0.9) for h in heard))
            print(f"to the first audible reply sample, p50 / p90: {names[0]} {a50:.0f} / {a90:.0f} ms, "
                  f"{names[1]} {b50:.0f} / {b90:.0f} ms; p50 difference {a50 - b50:+.0f} ms, ratio {a50 / b50:.2f}")
        same = sum(x["heard"] == y["heard"] for x, y in zip(results[names[0]], results[names[1]], strict=True))
        print(f"the same transcript over both: {same} of {len(results[names[0]])} questions")
    return results


def report(name: str, results: list[dict]) -> None:
    print(f"\n[{name}] {len(results)} turns; ms since speech_end (the server's end-of-turn decision)")
    print(f"{'stage':22s} {'p50':>7} {'p95':>7}")
    for mark in MARKS[1:]:
        values = [r["marks"][mark] for r in results if mark in r["marks"]]
        if values:
            print(f"{mark:22s} {statistics.median(values):7.0f} {pct(values, 0.95):7.0f}")
    for name, key in (("voice-to-voice (true)", "true_v2v"), ("voice-to-voice (server)", "server_v2v")):
        values = [r[key] for r in results if r[key] is not None]
        if values:
            print(f"{name:22s} {statistics.median(values):7.0f} {pct(values, 0.95):7.0f}")
    lines = [r["timeline"] for r in results if r.get("timeline")]
    if lines:
        print("timeline, ms since the true end of speech (p50 / p90; pause and words by the server's clock):")
        for key in ("pause_heard", "words_weighed", "decided", "decision_received", "first_audio_sent",
                    "first_audio_received", "first_audible"):
            values = [t[key] for t in lines if t.get(key) is not None]
            if values:
                print(f"  {key:22s} {statistics.median(values):7.0f} {pct(values, 0.9):7.0f}")
    # Every call here is a fresh call, so each turn is a call's first turn.
    after_final = [r["marks"]["llm_first_token"] - r["marks"]["asr_final"] for r in results
                   if "llm_first_token" in r["marks"] and "asr_final" in r["marks"]]
    if after_final:
        print(f"{'first token - final':22s} {statistics.median(after_final):7.0f} {pct(after_final, 0.95):7.0f}"
              "   (a call's first turn: ms from the final transcript to the first LLM token)")
    tps = [r["tokens_per_second"] for r in results if r["tokens_per_second"]]
    if tps:
        print(f"LLM tokens/s median {statistics.median(tps):.1f}")
    ended = [r["ended_by"] for r in results if r.get("ended_by")]
    if ended:
        print("turn ended by: " + ", ".join(f"{k} {ended.count(k)}" for k in sorted(set(ended))))
    preempted = sum(bool(r.get("preemptive")) for r in results)
    discarded = sum(int(r.get("discarded", 0)) for r in results)
    print(f"preemptive replies used {preempted}, dropped {discarded}")


async def caller(url: str, index: int, turns: int, stagger: float, tmp: Path, rate: int) -> list[dict]:
    """One call: after index * stagger s, `turns` questions, each followed by silence until its
    reply is done (the caller streams audio all along, as a phone does)."""
    await asyncio.sleep(index * stagger)
    client = VoiceClient(url, rate, source_address=caller_address(index))
    await client.connect()
    results = []
    trailing: asyncio.Task[None] | None = None
    try:
        for turn in range(turns):
            question = QUESTIONS[(index * 3 + turn) % len(QUESTIONS)]
            samples = question_audio(question, tmp, rate, f"-{index}")
            lead = np.zeros(int(0.3 * rate), dtype=np.int16)
            audio = np.concatenate([lead, samples])
            end_in_clip = len(lead) / rate + speech_end_s(samples, rate)
            if trailing is not None:
                trailing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await trailing
            mark = len(client.received)
            start = time.monotonic()
            true_end = start + int(end_in_clip * 1000) // FRAME_MS * FRAME_MS / 1000
            await client.stream(audio, FRAME_MS)
            trailing = asyncio.create_task(client.silence(600))
            try:
                done = await client.wait_for(lambda e: e["type"] == "response.done", 180, after=mark)
            except (TimeoutError, ConnectionError) as exc:
                print(f"  caller {index} turn {turn}: no reply ({type(exc).__name__})", flush=True)
                results.append({"caller": index, "turn": turn, "question": question, "status": "no reply",
                                "true_v2v": None, "deadline_missed": True, "underruns": 0, "underrun_ms": 0.0,
                                "tokens_per_second": None})
                break
            first_audio = next((r.at for r in client.received[mark:] if r.audio and r.at > true_end), None)
            results.append({
                "caller": index, "turn": turn, "question": question, "reply": done["text"],
                "status": done["status"], "marks": done["latency_ms"],
                "true_v2v": (first_audio - true_end) * 1000 if first_audio else None,
                "server_v2v": done.get("voice_to_voice_ms"),
                "deadline_missed": bool(done.get("deadline_missed")),
                "underruns": int(done.get("underruns", 0)), "underrun_ms": float(done.get("underrun_ms", 0.0)),
                "tokens_per_second": done.get("llm", {}).get("tokens_per_second"),
            })
            await asyncio.sleep(0.5)  # the caller takes a breath before the next question
    finally:
        if trailing is not None:
            trailing.cancel()
        await client.close()
    return results


async def run_concurrent(url: str, n: int, turns: int, stagger: float, rate: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        for question in QUESTIONS:  # synthesized before the calls, so the caller's TTS never competes with them
            question_audio(question, Path(tmp), rate)
        calls = await asyncio.gather(*(caller(url, i, turns, stagger, Path(tmp), rate) for i in range(n)))
    return [turn for call in calls for turn in call]


def summarize(turns: list[dict]) -> dict:
    v2v = [t["true_v2v"] for t in turns if t["true_v2v"] is not None]
    return {
        "turns": len(turns),
        "failed": sum(t["status"] != "completed" for t in turns),
        "v2v_p50": statistics.median(v2v) if v2v else None,
        "v2v_p95": pct(v2v, 0.95) if v2v else None,
        "deadline_misses": sum(t["deadline_missed"] for t in turns),
        "underruns": sum(t["underruns"] for t in turns),
        "underrun_ms": round(sum(t["underrun_ms"] for t in turns)),
        "tokens_per_second": statistics.median(tps) if (tps := [t["tokens_per_second"] for t in turns
                                                                 if t["tokens_per_second"]]) else None,
    }


def print_concurrency(runs: list[dict]) -> None:
    print(f"\n{'N':>3} {'policy':6} {'turns':>5} {'not ok':>6} {'v2v p50':>8} {'v2v p95':>8} {'late':>9} "
          f"{'underruns':>9} {'gap ms':>7} {'tok/s':>6}")

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    for run in runs:
        s = run["summary"]
        late = f"{s['deadline_misses']}/{s['turns']}"
        tps = "-" if s["tokens_per_second"] is None else f"{s['tokens_per_second']:.1f}"
        print(f"{run['n']:>3} {run['schedule']:6} {s['turns']:>5} {s['failed']:>6} {ms(s['v2v_p50']):>8} "
              f"{ms(s['v2v_p95']):>8} {late:>9} {s['underruns']:>9} {s['underrun_ms']:>7} {tps:>6}")
    print("v2v: ms from the true end of speech to the first reply audio received; late: first audio after "
          "session.first_audio_budget_ms; underruns/gap ms: gaps in reply audio once it started, and their total")


def concurrency_main(args: argparse.Namespace) -> None:
    counts = [int(n) for n in args.concurrency.split(",")]
    schedules = args.schedules.split(",")
    runs: list[dict] = []
    env: dict[str, str] = {}
    if args.url:
        for n in counts:
            print(f"N={n} against {args.url[0]}", flush=True)
            turns = asyncio.run(run_concurrent(args.url[0], n, args.turns, args.stagger, args.rate))
            runs.append({"n": n, "schedule": "server's", "summary": summarize(turns), "turns": turns})
    else:
        env = {"VOICE_AGENT_LLM__TEMPERATURE": "0.7",
               "VOICE_AGENT_SERVER__MAX_SESSIONS": str(max(8, *counts)), **dict(s.split("=", 1) for s in args.set)}
        print("server settings:", env)
        with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
            servers = {}
            for schedule in schedules:  # all up at once, so the policies take turns per N on the same machine
                server, proc = start_server(Path(tmp), env={**env, "VOICE_AGENT_LLM__SCHEDULE": schedule})
                stack.callback(stop_server, proc)
                servers[schedule] = server
            for n in counts:
                for schedule in schedules:
                    print(f"N={n} llm.schedule={schedule}", flush=True)
                    turns = asyncio.run(run_concurrent(servers[schedule].ws_url, n, args.turns, args.stagger,
                                                       args.rate))
                    runs.append({"n": n, "schedule": schedule, "summary": summarize(turns), "turns": turns})
    print_concurrency(runs)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), "settings": env, "turns_per_call": args.turns,
                                               "stagger_s": args.stagger, "runs": runs}, indent=1))
        print(f"wrote {args.json}")


def with_noisy(urls: dict[str, Any]) -> dict[str, Any]:
    """With --noise, each /ws and phone target beside its twin in noise."""
    if NOISE is None:
        return urls
    out: dict[str, Any] = {}
    for name, target in urls.items():
        out[name] = target
        if isinstance(target, str):
            out[f"{name}+{NOISE[0]}@{NOISE[1]:g}"] = ("noise", target)
        elif isinstance(target, Server):
            out[f"{name}+{NOISE[0]}@{NOISE[1]:g}"] = ("phone-noise", target)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", action="append", default=[], metavar="[LABEL=]URL",
                        help="a running service's /ws URL (default: start one); several (label=url each) are asked "
                        "every question side by side, taking turns at going first")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--rate", type=int, default=16000)
    parser.add_argument("--set", action="append", default=[], metavar="VOICE_AGENT_X=Y",
                        help="a setting for the server this script starts (repeatable)")
    parser.add_argument("--json", help="also write every turn to this file")
    parser.add_argument("--voice", default="hibari",
                        help="the caller's voice: hibari, espeak, or a voice of bench/voices.py by name")
    parser.add_argument("--baseline", metavar="VOICE_AGENT_X=Y,...",
                        help="also run a server with these settings added, side by side")
    parser.add_argument("--concurrency", nargs="?", const="1,2,4,8", metavar="N,N,...",
                        help="callers at once, a comma-separated list (default 1,2,4,8): the concurrency mode")
    parser.add_argument("--turns", type=int, default=3, help="concurrency mode: turns per call")
    parser.add_argument("--stagger", type=float, default=0.7, help="concurrency mode: seconds between callers' starts")
    parser.add_argument("--schedules", default="edf,fifo", help="concurrency mode: llm.schedule policies to compare")
    parser.add_argument("--noise", metavar="FAMILY@SNR",
                        help="also ask every /ws and phone question in noise (a family of bench/noise_set.py at SNR dB "
                        "below the voice, from 3 s before the question until the reply is done), side by side with "
                        "the same question clean on the same server (whose calls then also wait 3 s before it)")
    parser.add_argument("--transport", default="ws",
                        help="the caller's path: ws (the native socket), twilio (a phone call), realtime (the OpenAI "
                        "Realtime API with the official SDK), webrtc (an aiortc caller on /webrtc/calls), or "
                        "several, comma-separated, side by side (both: ws,twilio)")
    parser.add_argument("--webrtc-jitter-buffer", choices=("none", "aiortc"), default="none",
                        help="the WebRTC caller plays the reply's packets as they arrive (none: as the /ws caller "
                        "is measured, at arrival), or after aiortc's own buffer of 4 packets (80 ms)")
    args = parser.parse_args()
    global WEBRTC_AS_ARRIVED
    WEBRTC_AS_ARRIVED = args.webrtc_jitter_buffer == "none"
    transports = ["ws", "twilio"] if args.transport == "both" else args.transport.split(",")
    if not transports or set(transports) - {"ws", "twilio", "realtime", "webrtc", "sip"}:
        parser.error(f"--transport {args.transport!r}: ws, twilio, realtime, webrtc, sip, or a comma-separated list")
    global VOICE, NOISE
    VOICE = args.voice
    print(f"CPU: {cpu.describe()}; caller voice: {VOICE}")
    if args.noise:
        family, _, snr = args.noise.partition("@")
        NOISE = (family, float(snr or 10))
        make_noise_track()
        print(f"noise: {family} at {NOISE[1]:g} dB SNR")
    if args.concurrency:
        concurrency_main(args)
        return
    env: dict[str, str] = {}
    baseline = dict(s.split("=", 1) for s in args.baseline.split(",")) if args.baseline else {}
    if args.url:
        if transports != ["ws"]:
            parser.error("--url takes --transport ws only (a phone call needs the bench's auth token, and "
                         "realtime a server started here)")
        named = dict(u.split("=", 1) if "=" in u.split("://", 1)[0] else ("server", u) for u in args.url)
        if len(named) != len(args.url):
            parser.error("several --url need a label each: --url container=ws://... --url direct=ws://...")
        results = asyncio.run(run(with_noisy(dict(named)), args.repeat, args.rate))
    else:
        with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
            env = {"VOICE_AGENT_LLM__TEMPERATURE": "0.7", **dict(s.split("=", 1) for s in args.set)}
            if "twilio" in transports:
                env.update(PHONE_ENV)
            if "sip" in transports:
                env.update({"VOICE_AGENT_SIP__ENABLED": "true", "VOICE_AGENT_SIP__HOST": "127.0.0.1",
                            "VOICE_AGENT_SIP__TRUSTED_ADDRESSES": '["127.0.0.1"]',
                            "VOICE_AGENT_SERVER__LOG_CALLER_CONTENT": "info"})
            print("server settings:", env, "baseline adds:", baseline)
            urls: dict[str, str | Server | tuple[str, Server]] = {}
            for name, extra in (("defaults", {}), ("baseline", baseline)) if baseline else (("defaults", {}),):
                sip_port = 0
                if "sip" in transports:
                    from bench.sip_caller import _free_port

                    sip_port = _free_port()
                    extra = {**extra, "VOICE_AGENT_SIP__PORT": str(sip_port)}
                server, proc = start_server(Path(tmp), env={**env, **extra})
                stack.callback(stop_server, proc)
                if sip_port:
                    SIP_PORTS[server.base_url] = sip_port
                suffix = f"-{name}" if baseline else ""
                for transport in transports:
                    label = transport + suffix if len(transports) > 1 else name
                    urls[label] = (server.ws_url if transport == "ws" else server if transport == "twilio"
                                   else (transport, server))
            results = asyncio.run(run(with_noisy(urls), args.repeat, args.rate))
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), "voice": VOICE, "noise": args.noise,
                                               "settings": env,
                                               "baseline": baseline, "transport": ",".join(transports),
                                               "turns": results}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
