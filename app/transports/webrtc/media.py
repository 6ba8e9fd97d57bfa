"""The reply's audio over WebRTC (and SIP): a track the peer connection sends, paced here, 20 ms a
frame, by the injected clock. The caller's audio is read by app/transports/webrtc/caller.py.

What was heard is what the track handed to the sender: a barge-in drops the rest at once (`clear`),
and the session is told, as a phone's marks tell it, how much of each turn's reply went out
(`on_played`)."""

from __future__ import annotations

import asyncio
import fractions
from collections import deque
from collections.abc import Callable

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from core.clock import Clock

FRAME_S = 0.02  # the reply's frames: 20 ms, Opus's and G.711's usual packet
MAX_GAP_S = 1.0  # a sender this far behind its frame clock (a paused loop) starts the clock again


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
