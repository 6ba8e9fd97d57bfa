"""A caller on a speakerphone, for the end-to-end tests and bench/echo_calls.py: a fake of the caller's device (not
of the server). It plays the bot's reply audio as it arrives over /ws (each chunk once the one before has played,
as the browser page does; an interrupted reply's audio still queued is dropped), and its microphone hears that
audio again through a room, `delay_ms` later and `level_db` below what was played, on top of what the caller
says and of the room's own `noise` (float samples at the client's rate, looped; none by default). The microphone
is streamed to the server in real time, 20 ms a frame, from `start()` until `stop()`.

    phone = Speakerphone(client, level_db=-10, delay_ms=200)   # once the session has started
    phone.start()
    said_at = phone.say(question)   # queued after what is still being said; returns the clock time it begins
    ...
    await phone.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import numpy as np

from app.client import VoiceClient
from pipeline.audio import StreamResampler

FRAME_MS = 20


def room_response(rate: int, rt60_s: float, seed: int = 0) -> np.ndarray:
    """A small room's impulse response: the direct path, then diffuse reverberation (noise decaying 60 dB in
    `rt60_s`) about 6 dB below it in energy; unit energy in all."""
    rng = np.random.default_rng(seed)
    n = max(1, int(rt60_s * rate))
    t = np.arange(n) / rate
    tail = rng.standard_normal(n) * np.exp(-6.9 * t / rt60_s)
    tail[0] = 0.0
    tail *= np.sqrt(0.25 / max(float(np.sum(tail ** 2)), 1e-12))
    tail[0] = 1.0
    return (tail / np.sqrt(np.sum(tail ** 2))).astype(np.float32)


class Speakerphone:
    def __init__(self, client: VoiceClient, *, level_db: float = -10.0, delay_ms: float = 200.0,
                 rt60_s: float = 0.3, seed: int = 0, max_s: float = 600.0, noise: np.ndarray | None = None) -> None:
        self.client = client
        self.rate = client.sample_rate
        # the reply's audio comes at the session's output rate (session.started says which): played at the mic's
        self._resample = StreamResampler(client.session.get("output_audio", {}).get("sample_rate", self.rate),
                                         self.rate)
        self.frame = self.rate * FRAME_MS // 1000
        self.speaker = np.zeros(int(max_s * self.rate), dtype=np.float32)  # what it played, from t0
        self.rir = room_response(self.rate, rt60_s, seed) * np.float32(10 ** (level_db / 20)) if level_db > -200 \
            else np.zeros(1, dtype=np.float32)
        self.delay = int(delay_ms * self.rate / 1000)
        self.t0 = 0.0
        self.sent = 0  # microphone samples sent
        self._speech = np.zeros(0, dtype=np.float32)  # what the caller still has to say
        self._seen = 0  # client.received taken in so far
        self._play_end = 0.0  # clock time the audio queued so far ends playing
        self._task: asyncio.Task[None] | None = None
        self.noise = noise.astype(np.float32) if noise is not None and len(noise) else None

    def start(self) -> None:
        self.t0 = time.monotonic()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def say(self, samples: np.ndarray) -> float:
        """Queue the caller's words (int16 or float samples at the client's rate); the clock time they begin."""
        audio = samples.astype(np.float32) / (32768.0 if samples.dtype == np.int16 else 1.0)
        begins = self.t0 + (self.sent + len(self._speech)) / self.rate
        self._speech = np.concatenate([self._speech, audio])
        return begins

    def saying(self) -> bool:
        return len(self._speech) > 0

    def _index(self, at: float) -> int:
        return min(len(self.speaker), max(0, round((at - self.t0) * self.rate)))

    def _take_in(self) -> None:
        """Play what has arrived; drop the rest of a reply the server says was interrupted."""
        for r in self.client.received[self._seen:]:
            if r.audio:
                start = max(r.at, self._play_end)
                samples = self._resample(np.frombuffer(r.audio, dtype="<i2").astype(np.float32) / 32768.0)
                i = self._index(start)
                piece = samples[:len(self.speaker) - i]
                self.speaker[i:i + len(piece)] = piece
                self._play_end = start + len(samples) / self.rate
            elif r.event is not None and r.event.get("type") == "response.done" \
                    and r.event.get("status") == "interrupted" and self._play_end > r.at:
                self.speaker[self._index(r.at):self._index(self._play_end)] = 0.0
                self._play_end = r.at
        self._seen = len(self.client.received)

    def _echo(self, start: int, count: int) -> np.ndarray:
        """What the microphone hears of the loudspeaker over microphone samples [start, start + count)."""
        lo, hi = start - self.delay - len(self.rir) + 1, start - self.delay + count
        segment = np.zeros(hi - lo, dtype=np.float32)
        a, b = max(lo, 0), max(hi, 0)
        segment[a - lo:b - lo] = self.speaker[a:b]
        return np.convolve(segment, self.rir, mode="valid").astype(np.float32)

    async def _run(self) -> None:
        while not self.client.closed:
            due = self.t0 + (self.sent + self.frame) / self.rate  # the frame's last sample is heard then
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._take_in()
            mic = self._echo(self.sent, self.frame)
            said, self._speech = self._speech[:self.frame], self._speech[self.frame:]
            mic[:len(said)] += said
            if self.noise is not None:
                at = np.arange(self.sent, self.sent + self.frame) % len(self.noise)
                mic += self.noise[at]
            self.sent += self.frame
            with contextlib.suppress(Exception):
                await self.client.send_raw((np.clip(mic, -1, 1) * 32767).astype("<i2").tobytes())
