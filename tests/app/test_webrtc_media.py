"""The WebRTC call's audio pieces on their own (app/transports/webrtc/media.py), with a fake clock, and
the bad-network bench's netlink messages (bench/lossy_link.py)."""

from __future__ import annotations

import fractions
import struct

import av
import numpy as np
from aiortc.rtp import RtpPacket

from app.transports.webrtc.media import AsArrived, CallerAudio, ReplyTrack, UnwrappedTimestamps
from bench.lossy_link import HEADER, NFGEN, NFNL_SUBSYS_QUEUE, NFQNL_MSG_PACKET, Impairment, _attribute, _packet_ids
from core.clock import FakeClock


def packet(sequence: int, timestamp: int) -> RtpPacket:
    p = RtpPacket(payload_type=111, sequence_number=sequence, timestamp=timestamp)
    p._data = b"opus"  # type: ignore[attr-defined]  # as the receiver depayloads it
    return p


def test_packets_pass_as_they_arrive_and_repeated_ones_are_dropped() -> None:
    buffer = AsArrived()
    passed = [buffer.add(packet(s, 960 * s))[1] for s in (1, 2, 4, 3, 4, 5)]
    assert [f.timestamp if f else None for f in passed] == [960, 1920, 3840, 2880, None, 4800]
    assert passed[0] is not None and passed[0].data == b"opus"


def test_timestamps_out_of_order_stay_in_place_and_a_wrap_is_unwrapped() -> None:
    mapper = UnwrappedTimestamps()
    raw = [(1 << 32) - 1920, (1 << 32) - 960, 960, 0, 1920]  # across the 32-bit wrap, one packet out of order
    assert [mapper.map(t) for t in raw] == [0, 960, 2880, 1920, 3840]


async def test_the_reply_track_sends_20_ms_frames_on_the_clock_and_reports_what_went_out() -> None:
    clock = FakeClock()
    played: list[tuple[int, float]] = []
    track = ReplyTrack(clock, 24000, lambda turn, ms: played.append((turn, ms)))
    track.push((np.ones(720, dtype=np.int16) * 1000).tobytes(), 3)  # 30 ms of turn 3
    start = clock.now()
    first, second, third = [await track.recv() for _ in range(3)]
    assert abs(clock.now() - start - 0.04) < 1e-9  # frame k leaves at start + k * 20 ms
    assert [f.pts for f in (first, second, third)] == [0, 480, 960] and first.samples == 480
    assert first.to_ndarray().min() == 1000
    assert second.to_ndarray()[0, 239] == 1000 and second.to_ndarray()[0, 240] == 0  # 10 ms, then silence
    assert not third.to_ndarray().any()
    assert played == [(3, 20.0), (3, 30.0)] and track.drained.is_set()


async def test_a_barge_in_drops_what_the_track_still_holds() -> None:
    track = ReplyTrack(FakeClock(), 24000)
    track.push(bytes(2 * 24000), 1)  # 1 s
    await track.recv()
    assert track.clear() == 24000 - 480 and track.drained.is_set()
    assert not (await track.recv()).to_ndarray().any()
    assert track.turn_sent_ms(1) == 20.0


def frame(pts: int, samples: int = 960, rate: int = 48000, level: int = 8000) -> av.AudioFrame:
    f = av.AudioFrame(format="s16", layout="mono", samples=samples)
    f.planes[0].update((np.ones(samples, dtype=np.int16) * level).tobytes())
    f.sample_rate, f.pts, f.time_base = rate, pts, fractions.Fraction(1, rate)
    return f


async def fed_from(pts_order: list[int]) -> tuple[list[tuple[int, bool]], CallerAudio]:
    """What CallerAudio feeds for frames of 20 ms at 48 kHz arriving in `pts_order` (in frames): (samples at
    16 kHz, silence or not), and the reader."""
    fed: list[tuple[int, bool]] = []

    async def feed(samples: np.ndarray) -> None:
        fed.append((len(samples), not samples.any()))

    caller = CallerAudio(None, feed, 16000, reorder_s=0.06)  # type: ignore[arg-type]
    for k in pts_order:
        await caller.take(frame(960 * k, level=1000 * (k + 1)))
    return fed, caller


async def test_a_lost_packet_becomes_silence_of_its_length_once_later_ones_have_come() -> None:
    fed, caller = await fed_from([0, 1, 3, 4, 5, 6])  # the third never came
    assert [length for length, silent in fed if silent] == [320] and caller.filled_s == 0.02
    silent_at = next(i for i, (_, silent) in enumerate(fed) if silent)
    assert sum(length for length, _ in fed[:silent_at]) <= 2 * 320  # in its place: after frames 0 and 1


async def test_a_packet_that_comes_a_little_late_is_put_back_in_its_place() -> None:
    fed, caller = await fed_from([0, 1, 3, 2, 4, 5])
    assert not any(silent for _, silent in fed) and caller.late == 0 and caller.filled_s == 0
    fed, caller = await fed_from([0, 1, 3, 4, 5, 6, 2, 7])  # past the window: its place was filled already
    assert caller.filled_s == 0.02 and caller.late == 1


def test_the_queue_messages_are_read_for_their_packet_ids() -> None:
    body = NFGEN.pack(2, 0, 7) + _attribute(1, struct.pack("!IHB", 41, 0x0800, 3)) + _attribute(9, b"xy")
    message = HEADER.pack(HEADER.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET, 0, 0, 0) + body
    assert _packet_ids(message + message.replace(struct.pack("!I", 41), struct.pack("!I", 42))) == [41, 42]


def test_an_impairment_drops_its_share_and_delays_the_rest_the_same_way_each_run() -> None:
    links = [Impairment(loss=0.1, delay_ms=40, jitter_ms=10, seed=5) for _ in range(2)]
    runs = [[link.verdict() for _ in range(2000)] for link in links]
    assert runs[0] == runs[1] and links[0].dropped == runs[0].count(None)
    dropped = runs[0].count(None)
    assert 150 < dropped < 250
    held = sorted(v for v in runs[0] if v is not None)
    assert 0.035 < held[len(held) // 2] < 0.045 and held[0] >= 0
