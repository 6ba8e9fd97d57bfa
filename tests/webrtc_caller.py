"""A WebRTC caller made with aiortc, as OpenAI's documented browser flow makes one: a microphone track
and an `oai-events` data channel in the offer, the offer POSTed to /v1/realtime/calls, the answer
set, events on the channel, the reply heard on the server's track. Its microphone plays what
`say` is given, in real time, and silence between."""

from __future__ import annotations

import asyncio
import fractions
import json
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import av
import httpx
import numpy as np
from aiortc import RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtp import RtpPacket

from app.transports.webrtc.caller import Unwrapped

log = logging.getLogger(__name__)
MIC_RATE = 16000
FRAME = MIC_RATE // 50  # 20 ms


class AsArrived:
    """The server's RTP packets to the caller's decoder as they arrive, in place of aiortc's audio jitter
    buffer, which holds back 4 packets (80 ms) and stalls 320 ms on a lost one. Only a repeated packet is
    dropped: the caller records each decoded frame with its arrival time and timestamp, and the benchmark
    models a browser's jitter buffer from those (bench/voice_latency.py, webrtc_playout)."""

    def __init__(self) -> None:
        self.recent: deque[int] = deque(maxlen=64)  # the sequence numbers passed on lately

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        """(whether to ask for a picture: never, for audio; the frame to decode, or None)."""
        if packet.sequence_number in self.recent:
            return False, None
        self.recent.append(packet.sequence_number)
        data: bytes = getattr(packet, "_data", b"")  # the receiver's depayloaded codec frame
        return False, JitterFrame(data=data, timestamp=packet.timestamp)


def play_as_arrived(pc: RTCPeerConnection) -> bool:
    """Give `pc`'s audio receivers AsArrived instead of aiortc's jitter buffer, and timestamps that
    allow for packets out of order (through their private attributes: aiortc has no setting for them).
    False, and the defaults kept, where those attributes are not there (another aiortc version)."""
    done = True
    for transceiver in pc.getTransceivers():
        receiver = transceiver.receiver
        if transceiver.kind != "audio":
            continue
        if all(hasattr(receiver, f"_RTCRtpReceiver__{name}") for name in ("jitter_buffer", "timestamp_mapper")):
            setattr(receiver, "_RTCRtpReceiver__jitter_buffer", AsArrived())  # noqa: B010 (a private name)
            setattr(receiver, "_RTCRtpReceiver__timestamp_mapper", Unwrapped(32))  # noqa: B010
        else:
            done = False
    if not done:
        log.warning("this aiortc has no audio jitter buffer to replace: the caller's audio comes 80 ms late")
    return done


class Microphone(MediaStreamTrack):
    """Plays queued 16 kHz float audio, 20 ms a frame in real time, then silence."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self.pending = np.zeros(0, dtype=np.float32)
        self.frames = 0
        self.start: float | None = None
        self.said_at: float | None = None  # when the last `say` ran out (the true end of the caller's speech)

    def say(self, samples: np.ndarray) -> float:
        """Queue speech (float in [-1, 1], or int16 as read from a WAV); the time (monotonic) it will have
        played out."""
        scale = 32768.0 if np.issubdtype(samples.dtype, np.integer) else 1.0
        self.pending = np.concatenate([self.pending, samples.astype(np.float32) / scale])
        if self.start is None:
            return time.monotonic() + len(self.pending) / MIC_RATE
        # frame k leaves at start + k * 20 ms; the queue starts with the next frame
        return self.start + (self.frames * FRAME + len(self.pending)) / MIC_RATE

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self.start is None:
            self.start = time.monotonic()
        wait = self.start + self.frames * FRAME / MIC_RATE - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        piece = np.zeros(FRAME, dtype=np.float32)
        n = min(FRAME, len(self.pending))
        piece[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        frame = av.AudioFrame(format="s16", layout="mono", samples=FRAME)
        frame.planes[0].update((np.clip(piece, -1, 1) * 32767).astype(np.int16).tobytes())
        frame.sample_rate = MIC_RATE
        frame.pts = self.frames * FRAME
        frame.time_base = fractions.Fraction(1, MIC_RATE)
        self.frames += 1
        return frame


@dataclass
class Heard:
    """The server's track as it arrived: (monotonic time, mono float samples at `rate`)."""

    rate: int = 48000
    frames: list[tuple[float, np.ndarray]] = field(default_factory=list)
    pts: list[float | None] = field(default_factory=list)  # each frame's place in the stream, s (RTP-based)

    def loud_since(self, since: float, level: float = 0.01) -> float | None:
        """When the first frame after `since` with sound (peak over `level`) arrived."""
        for at, samples in self.frames:
            if at >= since and len(samples) and float(np.max(np.abs(samples))) > level:
                return at
        return None

    def seconds_loud(self, since: float, level: float = 0.01) -> float:
        return sum(len(s) for at, s in self.frames if at >= since and len(s) and np.max(np.abs(s)) > level) / self.rate


class WebRTCCaller:
    """`channel`: "oai-events" for /v1/realtime/calls, "events" for the native /webrtc/calls."""

    def __init__(self, base_url: str, key: str | None = None, channel: str = "oai-events",
                 as_arrived: bool = False, codec: str | None = None) -> None:
        self.base_url = base_url
        self.as_arrived = as_arrived  # play the reply's packets as they arrive, not after aiortc's 80 ms buffer
        self.codec = codec  # offer only this audio codec ("audio/PCMU": a SIP-style peer), or all aiortc has
        self.key = key
        self.label = channel
        self.pc = RTCPeerConnection()
        self.mic = Microphone()
        self.events: list[dict[str, Any]] = []
        self.heard = Heard()
        self.tasks: list[asyncio.Task[None]] = []
        self.answer: httpx.Response | None = None

    async def call(self, session: dict[str, Any] | None = None, path: str = "/v1/realtime/calls") -> httpx.Response:
        """Offer, POST, answer. The HTTP response (201 with SDP when the call is taken)."""
        sender = self.pc.addTrack(self.mic)
        if self.codec is not None:
            transceiver = next(t for t in self.pc.getTransceivers() if t.sender is sender)
            codecs = RTCRtpSender.getCapabilities("audio").codecs
            transceiver.setCodecPreferences([c for c in codecs if c.mimeType == self.codec])
        if self.as_arrived:
            play_as_arrived(self.pc)
        channel = self.pc.createDataChannel(self.label)
        self.channel = channel

        @channel.on("message")
        def on_message(message: str) -> None:
            self.events.append(json.loads(message))

        @self.pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            self.tasks.append(asyncio.create_task(self._listen(track)))

        await self.pc.setLocalDescription(await self.pc.createOffer())
        headers = {"authorization": f"Bearer {self.key}"} if self.key else {}
        async with httpx.AsyncClient(base_url=self.base_url, timeout=30) as http:
            if session is None:
                reply = await http.post(path, content=self.pc.localDescription.sdp,
                                        headers={**headers, "content-type": "application/sdp"})
            else:
                reply = await http.post(path, headers=headers, files={"sdp": (None, self.pc.localDescription.sdp),
                                                                      "session": (None, json.dumps(session))})
        self.answer = reply
        if reply.status_code == 201:
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=reply.text, type="answer"))
            self.opened = asyncio.Event()
            if channel.readyState == "open":
                self.opened.set()
            channel.on("open", self.opened.set)
        return reply

    async def _listen(self, track: MediaStreamTrack) -> None:
        resampler = av.AudioResampler(format="s16", layout="mono", rate=self.heard.rate)
        try:
            while True:
                frame = await track.recv()
                now = time.monotonic()
                place = None if frame.pts is None else frame.pts / frame.sample_rate
                pieces = [out.to_ndarray().reshape(-1).astype(np.float32) / 32768 for out in resampler.resample(frame)]
                samples = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
                self.heard.frames.append((now, samples))
                self.heard.pts.append(place)
        except MediaStreamError:
            pass

    def send(self, **event: Any) -> None:
        self.channel.send(json.dumps(event))

    async def wait_for(self, kind: str, timeout: float, after: int = 0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events[after:]:
                if event["type"] == kind:
                    return event
            assert time.monotonic() < deadline, f"no {kind} within {timeout} s: {[e['type'] for e in self.events]}"
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await self.pc.close()
