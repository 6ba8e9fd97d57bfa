"""The call's audio over WebRTC: the reply as a track the peer connection sends (paced here, 20 ms a
frame, by the injected clock), and the caller's track read into the session.

What was heard is what the track handed to the sender: a barge-in drops the rest at once (`clear`),
and the session is told, as a phone's marks tell it, how much of each turn's reply went out
(`on_played`). The caller's audio is put in the order of its RTP timestamps: a packet lost on the way
leaves silence of its own length, so the endpointing's clock stays the caller's."""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import logging
from collections import deque
from collections.abc import Awaitable, Callable

import av
import numpy as np
from aiortc import RTCPeerConnection
from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtp import RtpPacket

from core.clock import Clock
from models.protocols import Audio

log = logging.getLogger(__name__)
FRAME_S = 0.02  # the reply's frames: 20 ms, Opus's and G.711's usual packet
MAX_GAP_S = 1.0  # the longest stretch of lost packets filled with silence (a longer jump: the clock restarts)


class AsArrived:
    """The caller's RTP packets to the decoder as they arrive, for a receiver that is no player. aiortc's
    audio jitter buffer holds back 4 packets (80 ms) and, on a lost one, stalls until 16 more have come
    (320 ms): delay the session would add to every turn's end. Here only a repeated packet is dropped;
    CallerAudio puts the decoded frames back in order, waiting a little for a late one."""

    def __init__(self) -> None:
        self.recent: deque[int] = deque(maxlen=64)  # the sequence numbers passed on lately

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        """(whether to ask for a picture: never, for audio; the frame to decode, or None)."""
        if packet.sequence_number in self.recent:
            return False, None
        self.recent.append(packet.sequence_number)
        data: bytes = getattr(packet, "_data", b"")  # the receiver's depayloaded codec frame
        return False, JitterFrame(data=data, timestamp=packet.timestamp)


class UnwrappedTimestamps:
    """RTP timestamps from 0, unwrapped by the shortest way round: a packet older than the last one (out
    of order) gets a smaller one. aiortc's own mapper, made for packets in order, takes any older
    timestamp for a wrap of the 32-bit clock and moves every later one 2^32 on."""

    def __init__(self) -> None:
        self.origin: int | None = None
        self.last = 0  # the last timestamp as it came
        self.unwrapped = 0  # and unwrapped

    def map(self, timestamp: int) -> int:
        if self.origin is None:
            self.origin = self.last = self.unwrapped = timestamp
        else:
            step = (timestamp - self.last) % (1 << 32)
            self.unwrapped += step - (1 << 32) if step >= 1 << 31 else step
            self.last = timestamp
        return self.unwrapped - self.origin


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
            setattr(receiver, "_RTCRtpReceiver__timestamp_mapper", UnwrappedTimestamps())  # noqa: B010
        else:
            done = False
    if not done:
        log.warning("this aiortc has no audio jitter buffer to replace: the caller's audio comes 80 ms late")
    return done


class ReplyTrack(MediaStreamTrack):
    """The reply's audio as an outgoing track: `push` queues 16-bit PCM of a turn at `rate`, `recv`
    gives the sender one 20 ms frame every 20 ms (silence when nothing is queued), and `clear` drops
    what is queued. `on_played(turn_id, ms)`: how much of that turn's audio has gone out."""

    kind = "audio"

    def __init__(self, clock: Clock, rate: int, on_played: Callable[[int, float], None] | None = None) -> None:
        super().__init__()
        self.clock = clock
        self.rate = rate
        self.on_played = on_played
        self.frame = int(rate * FRAME_S)
        self.queue: deque[tuple[int, np.ndarray]] = deque()  # (turn id, int16 samples), in order
        self.queued = 0  # samples in `queue`
        self.sent: dict[int, int] = {}  # turn id -> its samples handed to the sender
        self.started: float | None = None  # the clock time frame 0 was due
        self.frames = 0  # frames given so far (the frame clock and the pts)
        self.drained = asyncio.Event()  # nothing queued
        self.drained.set()

    def push(self, pcm16: bytes, turn_id: int) -> None:
        samples = np.frombuffer(pcm16, dtype=np.int16)
        if len(samples):
            self.queue.append((turn_id, samples))
            self.queued += len(samples)
            self.drained.clear()

    def clear(self) -> int:
        """Drop the audio not yet sent (a barge-in): the samples dropped."""
        dropped = self.queued
        self.queue.clear()
        self.queued = 0
        self.drained.set()
        return dropped

    def stop(self) -> None:
        """The call is over: nothing more goes out (and nobody waits for the queue to drain)."""
        self.clear()
        super().stop()

    def turn_sent_ms(self, turn_id: int) -> float:
        return 1000 * self.sent.get(turn_id, 0) / self.rate

    async def recv(self) -> av.AudioFrame:
        pcm = await self.next_frame()
        frame = av.AudioFrame(format="s16", layout="mono", samples=self.frame)
        frame.planes[0].update(pcm.tobytes())
        frame.sample_rate = self.rate
        frame.pts = (self.frames - 1) * self.frame
        frame.time_base = fractions.Fraction(1, self.rate)
        return frame

    async def next_frame(self) -> np.ndarray:
        """The next 20 ms of int16 samples, when they are due (what `recv` wraps for aiortc; a SIP
        line sends it as it is)."""
        if self.readyState != "live":
            raise MediaStreamError
        now = self.clock.now()
        if self.started is None:
            self.started = now
        due = self.started + self.frames * FRAME_S
        if due > now:
            await self.clock.sleep(due - now)
        elif now - due > MAX_GAP_S:  # the sender stalled (a paused loop): start the frame clock again
            self.started, self.frames = now, 0
        pcm = self._take()
        self.frames += 1
        return pcm

    def _take(self) -> np.ndarray:
        """The next frame's samples: queued audio, then silence; counted per turn as sent."""
        out = np.zeros(self.frame, dtype=np.int16)
        filled = 0
        played: dict[int, None] = {}
        while filled < self.frame and self.queue:
            turn_id, samples = self.queue[0]
            n = min(self.frame - filled, len(samples))
            out[filled:filled + n] = samples[:n]
            filled += n
            self.queued -= n
            self.sent[turn_id] = self.sent.get(turn_id, 0) + n
            played[turn_id] = None
            if n == len(samples):
                self.queue.popleft()
            else:
                self.queue[0] = (turn_id, samples[n:])
        if not self.queue:
            self.drained.set()
        if self.on_played is not None:
            for turn_id in played:
                self.on_played(turn_id, self.turn_sent_ms(turn_id))
        return out


class CallerAudio:
    """Reads the caller's track into `feed` as float32 mono at `rate`, whatever the codec (Opus at
    48 kHz stereo, G.711 at 8 kHz), in the order of its RTP timestamps. A frame in its place goes on at
    once; one that comes early waits for the missing ones before it, until frames `reorder_s` past them
    have come: then the missing ones were lost, and their place is filled with silence of their length
    (one that comes after that is dropped)."""

    def __init__(self, track: MediaStreamTrack, feed: Callable[[Audio], Awaitable[None]], rate: int,
                 reorder_s: float = 0.2) -> None:
        self.track = track
        self.feed = feed
        self.rate = rate
        self.reorder_s = reorder_s
        self.resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
        self.next_pts: int | None = None  # where the next frame should start, in its own rate's samples
        self.waiting: dict[int, av.AudioFrame] = {}  # frames that came before a missing one, by pts
        self.filled_s = 0.0  # silence put in for lost packets, for the log
        self.frames = self.late = 0

    async def run(self) -> None:
        """Until the track ends."""
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await self.track.recv()
                if isinstance(frame, av.AudioFrame):
                    await self.take(frame)
        log.info("the caller's track ended after %d frames (%.2f s of lost packets filled, %d frames too late)",
                 self.frames, self.filled_s, self.late)

    async def take(self, frame: av.AudioFrame) -> None:
        self.frames += 1
        if frame.pts is None:
            return await self._play(frame)
        rate = frame.sample_rate
        if self.next_pts is None or abs(frame.pts - self.next_pts) > MAX_GAP_S * rate:
            # the first frame, or a jump (the sender's clock started again): placed from here
            for pts in sorted(self.waiting):
                await self._play(self.waiting.pop(pts))
            self.next_pts = frame.pts
        if frame.pts < self.next_pts:
            self.late += 1  # its place was filled already
            return
        self.waiting[frame.pts] = frame
        while self.waiting:
            if self.next_pts in self.waiting:
                await self._play(self.waiting.pop(self.next_pts))
                continue
            if (max(self.waiting) - self.next_pts) / rate < self.reorder_s:
                return  # the missing frame may still come
            first = min(self.waiting)
            gap = (first - self.next_pts) / rate
            self.filled_s += gap
            await self.feed(np.zeros(round(gap * self.rate), dtype=np.float32))
            self.next_pts = first

    async def _play(self, frame: av.AudioFrame) -> None:
        if frame.pts is not None:
            self.next_pts = frame.pts + frame.samples
        for out in self.resampler.resample(frame):
            samples = out.to_ndarray().reshape(-1).astype(np.float32) / 32768.0
            if len(samples):
                await self.feed(samples)
