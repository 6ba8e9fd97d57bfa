"""The caller's audio on a WebRTC call: their RTP packets put back in sequence order, decoded here, and
fed to the session as float32 mono at the session's rate.

aiortc's own receiver decodes packets as its jitter buffer hands them over; its audio jitter buffer
holds 4 packets (80 ms) on every turn's end and stalls 320 ms on a lost one, delay the session would
add to every turn. So the server's receiver gets a `PacketTap` in its place, which passes every packet
here as it arrives and none to aiortc's decoder, and `CallerAudio` does the rest:
- a packet in its place is decoded at once; one that comes early waits for the ones missing before it,
  until packets `reorder_s` past them have come: then the missing ones were lost;
- packets are decoded in sequence order, never as they arrived: Opus decodes each packet with the
  state the one before left, and packets decoded as they arrived, reordered by 40 ms of jitter, came
  out at a median 3.2 dB SNR against the same packets decoded in order (bench/opus_order.py);
- a lost packet's place is concealed (pipeline/conceal.py), or silence with `webrtc.conceal_loss` off;
  a stretch the caller sent no packets for (discontinuous transmission: the sequence goes on, the
  timestamp jumps) is silence. Either way the session's clock stays the caller's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import av
import numpy as np
from aiortc import RTCPeerConnection, RTCRtpCodecParameters
from aiortc.codecs import get_decoder
from aiortc.codecs.base import Decoder
from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtp import RtpPacket

from models.protocols import Audio
from pipeline.conceal import Concealer

log = logging.getLogger(__name__)
MAX_GAP_S = 1.0  # a longer jump in the caller's timestamps: their clock started again
LATE_PACKETS = 50  # a packet this many behind the one due is late; further either way, a jump. Also the most
# that wait behind a missing one before it is given up, whatever their timestamps say
QUEUED_PACKETS = 500  # 10 s of 20 ms packets waiting to be decoded: beyond that the newest are dropped


class Unwrapped:
    """RTP sequence numbers (16 bits) or timestamps (32 bits) from 0, unwrapped by the shortest way round:
    a packet older than the last one (out of order) gets a smaller number. aiortc's own timestamp mapper,
    made for packets in order, takes any older timestamp for a wrap and moves every later one 2^32 on."""

    def __init__(self, bits: int) -> None:
        self.size = 1 << bits
        self.origin: int | None = None
        self.last = 0  # the last value as it came
        self.unwrapped = 0  # and unwrapped

    def map(self, value: int) -> int:
        if self.origin is None:
            self.origin = self.last = self.unwrapped = value
        else:
            step = (value - self.last) % self.size
            self.unwrapped += step - self.size if step >= self.size // 2 else step
            self.last = value
        return self.unwrapped - self.origin


class PacketTap:
    """In place of aiortc's audio jitter buffer on the server's receiver (see the module doc): each packet,
    with its codec, onto `packets` as it arrives; nothing to aiortc's decoder."""

    def __init__(self) -> None:
        self.packets: asyncio.Queue[tuple[RtpPacket, RTCRtpCodecParameters] | None] = asyncio.Queue(
            maxsize=QUEUED_PACKETS)
        self.codecs: dict[int, RTCRtpCodecParameters] = {}  # payload type -> codec (the receiver's own dict)
        self.dropped = 0

    def add(self, packet: RtpPacket) -> tuple[bool, None]:
        """aiortc's jitter buffer's call: (no picture to ask for, no frame for its decoder)."""
        codec = self.codecs.get(packet.payload_type)
        if codec is not None:
            try:
                self.packets.put_nowait((packet, codec))
            except asyncio.QueueFull:  # the session is 10 s behind: the newest audio is dropped, counted
                self.dropped += 1
        return False, None


def tap_packets(pc: RTCPeerConnection, tap: PacketTap) -> bool:
    """Put `tap` in place of the audio receiver's jitter buffer (a private attribute: aiortc has no setting
    for it). False where this aiortc has none to replace: then the caller's audio cannot be read."""
    for transceiver in pc.getTransceivers():
        receiver = transceiver.receiver
        if transceiver.kind != "audio":
            continue
        if not all(hasattr(receiver, f"_RTCRtpReceiver__{name}") for name in ("jitter_buffer", "codecs")):
            return False
        tap.codecs = getattr(receiver, "_RTCRtpReceiver__codecs")  # noqa: B009 (filled as the receiver starts)
        setattr(receiver, "_RTCRtpReceiver__jitter_buffer", tap)  # noqa: B010 (a private name)
        return True
    return False


class CallerAudio:
    """Reads the tap's packets into `feed` as float32 mono at `rate` (see the module doc), until the
    caller's track ends."""

    def __init__(self, track: MediaStreamTrack | None, tap: PacketTap, feed: Callable[[Audio], Awaitable[None]],
                 rate: int, reorder_s: float = 0.2, conceal: bool = True) -> None:
        self.track = track
        self.tap = tap
        self.feed = feed
        self.rate = rate
        self.reorder_s = reorder_s
        self.concealer = Concealer(rate) if conceal else None
        self.decoders: dict[str, Decoder] = {}  # codec name -> aiortc's decoder for it
        self.resamplers: dict[str, av.AudioResampler] = {}  # codec name -> its decoded frames to mono at `rate`
        self.sequence, self.timestamp = Unwrapped(16), Unwrapped(32)
        self.next_sequence: int | None = None  # the packet due next
        self.next_at = 0  # where its audio starts, in the codec's clock (unwrapped timestamp)
        self.waiting: dict[int, tuple[int, bytes, RTCRtpCodecParameters]] = {}  # sequence -> (timestamp, data,
        # codec): the packets that came before one missing
        self.filled_s = 0.0  # stretches put in for lost packets, for the log
        self.packets = self.late = self.undecodable = self.failed = 0

    async def run(self) -> None:
        """Until the track ends (or the tap is closed with None)."""
        watcher = asyncio.create_task(self._until_the_track_ends())
        try:
            while (item := await self.tap.packets.get()) is not None:
                try:
                    await self.take(*item)
                except Exception:  # one packet the reader cannot place must not leave the call deaf
                    self.failed += 1
                    if self.failed == 1:
                        log.exception("a packet of the caller's could not be read; it is skipped (and any more)")
        finally:
            watcher.cancel()
        log.info("the caller's track ended after %d packets (%.2f s of lost packets filled, %d too late, %d not "
                 "decodable, %d dropped as 10 s behind, %d failed)", self.packets, self.filled_s, self.late,
                 self.undecodable, self.tap.dropped, self.failed)

    async def _until_the_track_ends(self) -> None:
        if self.track is not None:
            with contextlib.suppress(MediaStreamError):
                while True:
                    await self.track.recv()  # no frame ever comes (the tap keeps the packets): only the end
        await self.tap.packets.put(None)

    async def take(self, packet: RtpPacket, codec: RTCRtpCodecParameters) -> None:
        self.packets += 1
        data: bytes = getattr(packet, "_data", b"")  # the receiver depayloaded it
        sequence, at = self.sequence.map(packet.sequence_number), self.timestamp.map(packet.timestamp)
        clock = int(codec.clockRate)
        if self.next_sequence is not None and 0 < self.next_sequence - sequence <= LATE_PACKETS:
            self.late += 1  # its place was filled already
            return
        if (self.next_sequence is None or abs(sequence - self.next_sequence) > LATE_PACKETS
                or abs(at - self.next_at) > MAX_GAP_S * clock):
            for waiting in sorted(self.waiting):  # the first packet, or a jump: what waited goes on as it is
                await self._decode(*self.waiting.pop(waiting))
            self.next_sequence, self.next_at = sequence, at
        if sequence in self.waiting or not data:
            return  # a repeat; or no audio in it (aiortc's decoder would take an empty packet for the stream's end)
        self.waiting[sequence] = (at, data, codec)
        while self.waiting:
            if self.next_sequence in self.waiting:
                at, data, codec = self.waiting.pop(self.next_sequence)
                if at > self.next_at:  # the sequence goes on but the time jumped: nothing was sent (DTX)
                    await self._fill(round((at - self.next_at) * self.rate / clock), conceal=False)
                self.next_sequence += 1
                await self._decode(at, data, codec)
                continue
            newest = max(a for a, _, _ in self.waiting.values())
            if (newest - self.next_at) / clock < self.reorder_s and len(self.waiting) < LATE_PACKETS:
                return  # the missing packet may still come
            first = min(self.waiting)  # the missing ones were lost: their place filled
            lost = max(0, round((self.waiting[first][0] - self.next_at) * self.rate / clock))
            self.filled_s += lost / self.rate
            await self._fill(lost, conceal=True)
            self.next_sequence, self.next_at = first, self.waiting[first][0]

    async def _fill(self, count: int, conceal: bool) -> None:
        """`count` samples in a place no packet filled: the audio before it first (what the resamplers
        still hold), then concealment (a loss) or silence (nothing sent)."""
        for name in list(self.resamplers):
            await self._feed_resampled(self.resamplers.pop(name).resample(None))  # flushed: a new one follows
        if count > 0:
            fill = self.concealer.fill(count) if conceal and self.concealer is not None else None
            await self.feed(fill if fill is not None else np.zeros(count, dtype=np.float32))

    async def _decode(self, at: int, data: bytes, codec: RTCRtpCodecParameters) -> None:
        decoder = self.decoders.get(codec.name)
        if decoder is None:
            decoder = self.decoders[codec.name] = get_decoder(codec)
        try:
            frames = decoder.decode(JitterFrame(data=data, timestamp=at))
        except av.FFmpegError:
            self.undecodable += 1  # its place is filled as nothing sent when the next packet comes
            return
        resampler = self.resamplers.get(codec.name)
        if resampler is None:
            resampler = self.resamplers[codec.name] = av.AudioResampler(format="s16", layout="mono", rate=self.rate)
        for frame in frames:
            if not isinstance(frame, av.AudioFrame):
                continue
            self.next_at = at = at + round(frame.samples * int(codec.clockRate) / frame.sample_rate)
            await self._feed_resampled(resampler.resample(frame))

    async def _feed_resampled(self, frames: list[av.AudioFrame]) -> None:
        for out in frames:
            samples = out.to_ndarray().reshape(-1).astype(np.float32) / 32768.0
            if len(samples):
                if self.concealer is not None:
                    self.concealer.heard(samples)
                await self.feed(samples)
