"""A bad network for benchmarks, without netem: packets lost and delayed in user space.

These machines' kernels have no netem (`CONFIG_NET_SCH_NETEM is not set`: `tc qdisc add ... netem`
says "Specified qdisc kind is unknown"), so the bench does what netem does itself. An iptables rule
sends the chosen packets to an NFQUEUE (in the kernel here: `CONFIG_NETFILTER_XT_TARGET_NFQUEUE`,
`CONFIG_NETFILTER_NETLINK_QUEUE`), and this module, bound to that queue over netlink (no library:
the nfnetlink_queue messages are a few structs), gives each packet its verdict. A packet is dropped
with probability `loss`; else it is accepted after a delay drawn from a normal distribution
(`delay_ms` mean, `jitter_ms` standard deviation, never below 0). As with netem, packets whose delays
differ by more than their spacing come out of order. The kernel's TCP sees real loss (retransmits,
head-of-line blocking) and the RTP stack real loss and jitter.

It is meant to run in a network namespace of its own (`unshare --net`, as root), where the server and
the callers talk over loopback and the rules vanish with the namespace. There every packet crosses
loopback once, so both directions of the caller's link are impaired.

    with lossy(port=8000, loss=0.05, delay_ms=40, jitter_ms=40): ...   # inside asyncio, in the namespace
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS = 1, 2
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NF_DROP, NF_ACCEPT = 0, 1
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
NFGEN = struct.Struct("!BBH")  # nfgenmsg: family, version, resource id (the queue), big-endian


def _attribute(kind: int, payload: bytes) -> bytes:
    data = struct.pack("=HH", 4 + len(payload), kind) + payload
    return data + b"\0" * (-len(data) % 4)


def _message(kind: int, queue: int, attributes: bytes, sequence: int = 0) -> bytes:
    body = NFGEN.pack(socket.AF_UNSPEC, 0, queue) + attributes
    return HEADER.pack(HEADER.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, NLM_F_REQUEST, sequence, 0) + body


def _packet_ids(data: bytes) -> list[int]:
    """The packet ids of the NFQNL_MSG_PACKET messages in one netlink read."""
    ids: list[int] = []
    offset = 0
    while offset + HEADER.size <= len(data):
        length, kind, _, _, _ = HEADER.unpack_from(data, offset)
        if length < HEADER.size:
            break
        if kind == NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", data, offset + HEADER.size)
            if code:
                raise OSError(-code, f"nfnetlink_queue refused a message: {-code}")
        elif kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            at = offset + HEADER.size + NFGEN.size
            end = offset + length
            while at + 4 <= end:
                size, attribute = struct.unpack_from("=HH", data, at)
                if size < 4:
                    break
                if attribute & 0x7FFF == NFQA_PACKET_HDR:
                    ids.append(struct.unpack_from("!I", data, at + 4)[0])
                at += size + (-size % 4)
        offset += length + (-length % 4)
    return ids


@dataclass
class Impairment:
    loss: float = 0.0  # the chance a packet is dropped
    delay_ms: float = 0.0  # mean one-way delay added
    jitter_ms: float = 0.0  # its standard deviation
    seed: int = 0
    passed: int = 0
    dropped: int = 0
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def verdict(self) -> float | None:
        """None: drop the packet; else the seconds to hold it."""
        if self.loss and self.rng.random() < self.loss:
            self.dropped += 1
            return None
        self.passed += 1
        return max(0.0, self.rng.gauss(self.delay_ms, self.jitter_ms)) / 1000 if self.delay_ms or self.jitter_ms else 0

    def describe(self) -> str:
        return f"loss {100 * self.loss:g} %, delay {self.delay_ms:g} ms, jitter {self.jitter_ms:g} ms"


class Queue:
    """One NFQUEUE, bound on this event loop: every packet queued to it gets `impairment`'s verdict."""

    def __init__(self, number: int, impairment: Impairment) -> None:
        self.number = number
        self.impairment = impairment
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.bind((0, 0))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.loop = asyncio.get_running_loop()

    def open(self) -> None:
        cmd = _attribute(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, socket.AF_INET))
        params = _attribute(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
        self.sock.send(_message(NFQNL_MSG_CONFIG, self.number, cmd))
        self.sock.send(_message(NFQNL_MSG_CONFIG, self.number, params))
        self.sock.setblocking(False)
        self.loop.add_reader(self.sock.fileno(), self._read)

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except BlockingIOError:
                return
            for packet_id in _packet_ids(data):
                hold = self.impairment.verdict()
                if hold is None:
                    self._verdict(packet_id, NF_DROP)
                elif hold == 0:
                    self._verdict(packet_id, NF_ACCEPT)
                else:
                    self.loop.call_later(hold, self._verdict, packet_id, NF_ACCEPT)

    def _verdict(self, packet_id: int, verdict: int) -> None:
        with contextlib.suppress(OSError):  # the queue was closed meanwhile
            self.sock.send(_message(NFQNL_MSG_VERDICT, self.number,
                                    _attribute(NFQA_VERDICT_HDR, struct.pack("!II", verdict, packet_id))))

    def close(self) -> None:
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()


def rules(port: int, queue: int) -> list[list[str]]:
    """The packets to impair on loopback: the server's TCP port both ways, and every UDP packet (the
    WebRTC media and data channel, on ephemeral ports)."""
    target = ["-j", "NFQUEUE", "--queue-num", str(queue)]
    return [["-o", "lo", "-p", "udp", *target],
            ["-o", "lo", "-p", "tcp", "--dport", str(port), *target],
            ["-o", "lo", "-p", "tcp", "--sport", str(port), *target]]


@contextlib.asynccontextmanager
async def lossy(port: int, impairment: Impairment, queue: int = 7) -> AsyncIterator[Impairment]:
    """The link impaired while inside (in this process's network namespace; needs root)."""
    handler = Queue(queue, impairment)
    handler.open()
    added: list[list[str]] = []
    try:
        for rule in rules(port, queue):
            subprocess.run(["iptables", "-I", "OUTPUT", *rule], check=True)
            added.append(rule)
        yield impairment
    finally:
        for rule in added:
            subprocess.run(["iptables", "-D", "OUTPUT", *rule], check=False)
        handler.close()
