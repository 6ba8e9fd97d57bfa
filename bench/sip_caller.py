"""A SIP caller for bench/voice_latency.py --transport sip: it places a call to the server's SIP
port as a trunk would (an INVITE with a G.711 offer, sippy's stack on its own thread in the bench
process), sends the question as 20 ms mu-law RTP packets in real time, and timestamps every reply
packet as it arrives, so the reply's first audible sample is known to the millisecond on the
bench's own clock.

The SIP side is the service's own signalling module used as a client; the interoperability of the
service with other SIP stacks is tested with baresip and SIPp (tests/e2e/test_sip.py), not here."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.settings import SipConfig
from app.transports.sip import sdp
from app.transports.sip.endpoint import Invite, Progress, Signalling
from app.transports.sip.rtp import PCMU, encode, parse_rtp, rtp_header
from pipeline.audio import mulaw_to_pcm16

RATE = 8000
FRAME = 160  # 20 ms


@dataclass
class Received:
    packets: list[tuple[float, bytes]] = field(default_factory=list)  # (arrival, PCM16 of one packet)


class _Media(asyncio.DatagramProtocol):
    def __init__(self, received: Received) -> None:
        self.received = received
        self.transport: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        packet = parse_rtp(data)
        if packet is not None and packet.payload_type == PCMU:
            self.received.packets.append((time.monotonic(), mulaw_to_pcm16(packet.payload)))


class SipCaller:
    """One process-wide SIP client (sippy's stack is a singleton): `call` places a call and plays a
    clip into it."""

    def __init__(self) -> None:
        self.signalling: Signalling | None = None
        self.progress: asyncio.Queue[Progress] = asyncio.Queue()

    async def start(self) -> None:
        if self.signalling is None:
            loop = asyncio.get_running_loop()
            with_socket = SipConfig(host="127.0.0.1", port=_free_port())
            self.signalling = Signalling(with_socket, loop, self._refuse, lambda dialog, why: None,
                                         self.progress.put_nowait)
            await self.signalling.start()

    def _refuse(self, invite: Invite) -> None:
        assert self.signalling is not None
        self.signalling.run(Signalling.refuse, invite.dialog, 403, "Forbidden")

    async def call(self, target: tuple[str, int], clip: np.ndarray, after_s: float) -> tuple[float, Received]:
        """Call `target`, play `clip` (int16 at 8 kHz) from the answer on in real time, then `after_s` of
        silence; returns (when the clip's first sample was spoken, what was received) on the bench's
        monotonic clock: sample i was spoken at start + i / 8000."""
        await self.start()
        assert self.signalling is not None and self.signalling.reactor is not None
        received = Received()
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: _Media(received), local_addr=("127.0.0.1", 0))
        port = transport.get_extra_info("sockname")[1]
        offer = sdp.write("127.0.0.1", port, (PCMU,), None)
        dialog = await asyncio.to_thread(self.signalling.reactor.call_sync, self.signalling.dial, target, "agent",
                                         offer)
        try:
            while True:
                progress = await asyncio.wait_for(self.progress.get(), 30)
                if progress.dialog is dialog and progress.state == "answered":
                    break
                if progress.dialog is dialog and progress.state == "failed":
                    raise RuntimeError(f"the SIP call failed: {progress.code} {progress.reason}")
            remote = sdp.parse(progress.sdp)
            pcm = np.concatenate([clip, np.zeros(int(after_s * RATE), dtype=np.int16)])
            start = time.monotonic()
            for n, offset in enumerate(range(0, len(pcm) - FRAME + 1, FRAME)):
                due = start + (offset + FRAME) / RATE  # a phone sends each packet once its 20 ms are captured
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                payload = encode(PCMU, pcm[offset:offset + FRAME].astype("<i2").tobytes())
                transport.sendto(rtp_header(PCMU, n, offset, 0x5151) + payload, (remote.address, remote.port))
            return start, received
        finally:
            self.signalling.run(Signalling.hang_up, dialog)
            transport.close()


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
