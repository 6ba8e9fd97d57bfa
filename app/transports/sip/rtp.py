"""A SIP call's media: RTP over UDP (RFC 3550), G.711 mu-law or A-law, RFC 4733 keypad events.

The caller's packets are put back in timestamp order (a packet up to `reorder_ms` late still takes
its place; after that its place is concealed, pipeline/conceal.py, or silence with `sip.conceal_loss`
off) and decoded to float32 at 8 kHz. The
reply goes out as one 20 ms packet every 20 ms, paced by the injected clock (`ReplyTrack`, as on a
WebRTC call), silence between replies: what went out is what the caller heard.

Media goes where the caller's packets come from once the first one arrives (symmetric RTP, which
gets through the caller's NAT), and to the SDP's address and port until then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from app.transports.webrtc.media import ReplyTrack
from models.protocols import Audio
from pipeline.audio import alaw_to_pcm16, mulaw_to_float, pcm16_to_alaw, pcm16_to_float, pcm16_to_mulaw
from pipeline.conceal import Concealer

log = logging.getLogger(__name__)

SAMPLE_RATE = 8000
FRAME_SAMPLES = 160  # 20 ms
PCMU, PCMA = 0, 8  # RTP's static payload types for G.711 mu-law and A-law
CODEC_NAMES = {PCMU: "PCMU", PCMA: "PCMA"}
DTMF_EVENTS = "0123456789*#ABCD"  # RFC 4733 events 0-15
HEADER = struct.Struct("!BBHII")
MAX_GAP_SAMPLES = SAMPLE_RATE  # a jump over 1 s of timestamps: the stream restarted, no silence is made up


@dataclass(frozen=True)
class RtpPacket:
    payload_type: int
    marker: bool
    sequence: int
    timestamp: int
    ssrc: int
    payload: bytes


def parse_rtp(data: bytes) -> RtpPacket | None:
    """An RTP packet, or None for anything else (RTCP, STUN, too short, another version)."""
    if len(data) < HEADER.size:
        return None
    first, second, sequence, timestamp, ssrc = HEADER.unpack_from(data)
    if first >> 6 != 2:
        return None
    payload_type = second & 0x7F
    if 72 <= payload_type <= 76:  # RTCP sent to the RTP port (rtcp-mux)
        return None
    start = HEADER.size + 4 * (first & 0x0F)
    if first & 0x10:  # a header extension: 4 bytes, then its length in 32-bit words
        if len(data) < start + 4:
            return None
        start += 4 + 4 * struct.unpack_from("!H", data, start + 2)[0]
    end = len(data)
    if first & 0x20 and end > start:  # padding: its length is the last byte
        end -= data[-1]
    if end < start:
        return None
    return RtpPacket(payload_type, bool(second & 0x80), sequence, timestamp, ssrc, data[start:end])


def rtp_header(payload_type: int, sequence: int, timestamp: int, ssrc: int, marker: bool = False) -> bytes:
    return HEADER.pack(0x80, (0x80 if marker else 0) | payload_type, sequence & 0xFFFF, timestamp & 0xFFFFFFFF, ssrc)


def decode(payload_type: int, payload: bytes) -> Audio:
    if payload_type == PCMU:
        return mulaw_to_float(payload)
    return pcm16_to_float(alaw_to_pcm16(payload))


def encode(payload_type: int, pcm16: bytes) -> bytes:
    return pcm16_to_mulaw(pcm16) if payload_type == PCMU else pcm16_to_alaw(pcm16)


class CallerStream:
    """The caller's packets in timestamp order (see the module doc): `add` returns the audio that can
    go on now, in order, concealed (or silent) in the places of packets given up for lost."""

    def __init__(self, payload_type: int, reorder_ms: int, conceal: bool = True) -> None:
        self.payload_type = payload_type
        self.reorder = reorder_ms * SAMPLE_RATE // 1000
        self.concealer = Concealer(SAMPLE_RATE) if conceal else None  # else lost packets are silence
        self.next: int | None = None  # the timestamp the next audio starts at (unwrapped)
        self.last_raw = 0
        self.unwrapped = 0
        self.waiting: dict[int, Audio] = {}  # unwrapped timestamp -> audio not yet in order

    def _unwrap(self, timestamp: int) -> int:
        delta = (timestamp - self.last_raw) & 0xFFFFFFFF
        if delta >= 0x80000000:
            delta -= 0x100000000
        self.last_raw = timestamp
        self.unwrapped += delta
        return self.unwrapped

    def add(self, packet: RtpPacket) -> list[Audio]:
        if packet.payload_type != self.payload_type or not packet.payload:
            return []
        if self.next is None:
            self.last_raw = self.unwrapped = packet.timestamp
        at = self._unwrap(packet.timestamp)
        if self.next is None or abs(at - self.next) > MAX_GAP_SAMPLES:
            self.next, self.waiting = at, {}
        if at < self.next or at in self.waiting:
            return []  # too late (its place was given up) or a duplicate
        self.waiting[at] = decode(packet.payload_type, packet.payload)
        out: list[Audio] = []
        while self.waiting:
            if self.next in self.waiting:
                audio = self.waiting.pop(self.next)
                out.append(audio)
                if self.concealer is not None:
                    self.concealer.heard(audio)
                self.next += len(audio)
                continue
            if max(self.waiting) - self.next < self.reorder:
                break
            first = min(self.waiting)  # the missing packets are given up: concealed (or silence) in their place
            lost = first - self.next
            out.append(self.concealer.fill(lost) if self.concealer is not None else np.zeros(lost, dtype=np.float32))
            self.next = first
        return out


class KeypadEvents:
    """RFC 4733 telephone-events: each key once (its packets repeat and share a timestamp)."""

    def __init__(self, payload_type: int | None) -> None:
        self.payload_type = payload_type
        self.seen: set[int] = set()

    def add(self, packet: RtpPacket) -> str | None:
        if self.payload_type is None or packet.payload_type != self.payload_type or len(packet.payload) < 4:
            return None
        event = packet.payload[0]
        if event >= len(DTMF_EVENTS) or packet.timestamp in self.seen:
            return None
        self.seen.add(packet.timestamp)
        if len(self.seen) > 64:
            self.seen = {packet.timestamp}
        return DTMF_EVENTS[event]


class RtpSession(asyncio.DatagramProtocol):
    """One call's RTP socket: the caller's audio and keys in (`on_audio`, `on_key`), the reply out
    (`track`). `last_packet_at`: when the caller's last packet came (the clock's time)."""

    def __init__(self, track: ReplyTrack, reorder_ms: int, on_audio: Callable[[Audio], Awaitable[None]],
                 on_key: Callable[[str], Awaitable[None]], conceal: bool = True) -> None:
        self.track = track
        self.clock = track.clock
        self.reorder_ms = reorder_ms
        self.conceal = conceal
        self.payload_type = PCMU  # the codec agreed (`start`)
        self.stream = CallerStream(PCMU, reorder_ms, conceal)
        self.keys = KeypadEvents(None)
        self.on_audio, self.on_key = on_audio, on_key
        self.transport: asyncio.DatagramTransport | None = None
        self.remote: tuple[str, int] | None = None  # where media goes
        self.latched = False
        self.inbox: asyncio.Queue[RtpPacket | None] = asyncio.Queue(maxsize=500)  # 10 s of 20 ms packets
        self.last_packet_at = self.clock.now()
        self.dropped = 0  # packets dropped because the pipeline was 10 s behind (logged at the end)
        self.ssrc = secrets.randbits(32)
        self.tasks: list[asyncio.Task[None]] = []

    @property
    def port(self) -> int:
        assert self.transport is not None
        return int(self.transport.get_extra_info("sockname")[1])

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not asyncio's class, but its kind

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        packet = parse_rtp(data)
        if packet is None or not self.tasks:  # nothing is taken before the codec is agreed
            return
        if not self.latched:
            self.remote, self.latched = (addr[0], addr[1]), True
        elif (addr[0], addr[1]) != self.remote:
            return  # not the caller's stream
        self.last_packet_at = self.clock.now()
        try:
            self.inbox.put_nowait(packet)
        except asyncio.QueueFull:  # the pipeline is far behind: the newest audio is dropped, counted
            self.dropped += 1

    def start(self, remote: tuple[str, int], payload_type: int, dtmf_type: int | None) -> None:
        """Media flows: the codec and the keys' payload type agreed, to `remote` until the caller's
        first packet says where it is."""
        self.payload_type = payload_type
        self.stream = CallerStream(payload_type, self.reorder_ms, self.conceal)
        self.keys = KeypadEvents(dtmf_type)
        self.last_packet_at = self.clock.now()  # sip.rtp_timeout_s counts from here
        if not self.latched:
            self.remote = remote
        self.tasks = [asyncio.create_task(self._send_loop()), asyncio.create_task(self._receive_loop())]

    async def _receive_loop(self) -> None:
        while (packet := await self.inbox.get()) is not None:
            key = self.keys.add(packet)
            if key is not None:
                await self.on_key(key)
                continue
            for audio in self.stream.add(packet):
                await self.on_audio(audio)

    async def _send_loop(self) -> None:
        sequence = secrets.randbits(16)
        timestamp = secrets.randbits(32)
        first = True
        while self.track.readyState == "live":
            pcm = await self.track.next_frame()
            if self.transport is not None and self.remote is not None and not self.transport.is_closing():
                header = rtp_header(self.payload_type, sequence, timestamp, self.ssrc, marker=first)
                self.transport.sendto(header + encode(self.payload_type, pcm.tobytes()), self.remote)
                first = False
            sequence += 1
            timestamp += len(pcm)

    async def close(self) -> None:
        self.track.stop()
        with contextlib.suppress(asyncio.QueueFull):
            self.inbox.put_nowait(None)
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.dropped:
            log.warning("%d of the caller's RTP packets were dropped: the pipeline was over 10 s behind",
                        self.dropped)
        if self.transport is not None:
            self.transport.close()


async def open_rtp(host: str, ports: tuple[int, int], make: Callable[[], RtpSession]) -> RtpSession:
    """An RTP socket on `host`, on the first free even port in `ports` (0, 0: any port the system
    gives)."""
    loop = asyncio.get_running_loop()
    low, high = ports
    candidates = [0] if low == 0 else list(range(low + low % 2, high + 1, 2))
    if low:
        offset = secrets.randbelow(len(candidates))
        candidates = candidates[offset:] + candidates[:offset]
    last: OSError | None = None
    for port in candidates:
        try:
            _, protocol = await loop.create_datagram_endpoint(make, local_addr=(host, port))
            return protocol
        except OSError as exc:
            last = exc
    raise OSError(f"no free RTP port in {low}-{high} (sip.rtp_port_min/max): {last}")
