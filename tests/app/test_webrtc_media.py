"""The WebRTC call's audio pieces on their own (app/transports/webrtc/media.py), with a fake clock, and
the bad-network bench's netlink messages (bench/lossy_link.py)."""

from __future__ import annotations

import fractions
import struct
from collections.abc import Callable

import av
import numpy as np
import pytest
from aiortc import RTCRtpCodecParameters
from aiortc.codecs.opus import OpusEncoder
from aiortc.rtp import RtpPacket

from app.transports.webrtc.caller import CallerAudio, PacketTap, Unwrapped
from app.transports.webrtc.media import ReplyTrack
from bench.lossy_link import HEADER, NFGEN, NFNL_SUBSYS_QUEUE, NFQNL_MSG_PACKET, Impairment, _attribute, _packet_ids
from core.clock import FakeClock
from pipeline.audio import float_to_mulaw
from tests.webrtc_caller import AsArrived


def packet(sequence: int, timestamp: int) -> RtpPacket:
    p = RtpPacket(payload_type=111, sequence_number=sequence, timestamp=timestamp)
    p._data = b"opus"  # type: ignore[attr-defined]  # as the receiver depayloads it
    return p


def test_packets_pass_as_they_arrive_and_repeated_ones_are_dropped() -> None:
    buffer = AsArrived()
    passed = [buffer.add(packet(s, 960 * s))[1] for s in (1, 2, 4, 3, 4, 5)]
    assert [f.timestamp if f else None for f in passed] == [960, 1920, 3840, 2880, None, 4800]
    assert passed[0] is not None and passed[0].data == b"opus"


def test_timestamps_and_sequence_numbers_out_of_order_stay_in_place_and_a_wrap_is_unwrapped() -> None:
    mapper = Unwrapped(32)
    raw = [(1 << 32) - 1920, (1 << 32) - 960, 960, 0, 1920]  # across the 32-bit wrap, one packet out of order
    assert [mapper.map(t) for t in raw] == [0, 960, 2880, 1920, 3840]
    sequence = Unwrapped(16)
    assert [sequence.map(n) for n in (65534, 65535, 1, 0, 2)] == [0, 1, 3, 2, 4]


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


PCMU_CODEC = RTCRtpCodecParameters(mimeType="audio/PCMU", clockRate=8000, payloadType=0)
OPUS_CODEC = RTCRtpCodecParameters(mimeType="audio/opus", clockRate=48000, channels=2, payloadType=111)


def voiced(seconds: float, rate: int, start: int = 0) -> np.ndarray:
    t = (start + np.arange(round(seconds * rate))) / rate
    return (0.3 * np.sin(2 * np.pi * 150 * t) + 0.1 * np.sin(2 * np.pi * 450 * t)).astype(np.float32)


def pcmu_packet(k: int, sequence0: int = 65530, timestamp0: int = 0) -> RtpPacket:
    """Packet k of a G.711 caller: 20 ms of a vowel, its sequence number from `sequence0` (wrapping)."""
    p = RtpPacket(payload_type=0, sequence_number=(sequence0 + k) % 65536, timestamp=timestamp0 + 160 * k)
    p._data = float_to_mulaw(voiced(0.02, 8000, start=160 * k))  # type: ignore[attr-defined]
    return p


async def fed_from(order: list[int], conceal: bool = True, packets: Callable[[int], RtpPacket] = pcmu_packet,
                   codec: RTCRtpCodecParameters = PCMU_CODEC) -> tuple[list[np.ndarray], CallerAudio]:
    """What CallerAudio feeds at 16 kHz for packets arriving in `order`, and the reader."""
    fed: list[np.ndarray] = []

    async def feed(samples: np.ndarray) -> None:
        fed.append(samples)

    caller = CallerAudio(None, PacketTap(), feed, 16000, reorder_s=0.06, conceal=conceal)
    for k in order:
        await caller.take(packets(k), codec)
    return fed, caller


def level(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(samples ** 2))) if len(samples) else 0.0


@pytest.mark.parametrize("conceal", [True, False])
async def test_a_lost_packet_is_filled_to_its_length_once_later_ones_have_come(conceal: bool) -> None:
    _, caller = await fed_from([0, 1, 3, 4], conceal)
    assert caller.filled_s == 0  # packet 2 may still come: packets 60 ms past it have not
    fed, caller = await fed_from([0, 1, 3, 4, 5, 6], conceal)  # the third never came
    assert caller.filled_s == 0.02
    ends = np.cumsum([len(f) for f in fed])
    at = int(np.flatnonzero(ends == 2 * 320)[0])  # packets 0 and 1 all out (the resampler flushed)...
    fill = fed[at + 1]  # ...then the lost one's place
    assert len(fill) == 320
    assert level(fill) > 0.1 if conceal else level(fill) == 0  # the vowel carried on, or silence


async def test_a_packet_that_comes_a_little_late_is_put_back_in_its_place() -> None:
    fed, caller = await fed_from([0, 1, 3, 2, 4, 5])
    assert caller.late == 0 and caller.filled_s == 0
    in_order, _ = await fed_from([0, 1, 2, 3, 4, 5])
    assert np.array_equal(np.concatenate(fed), np.concatenate(in_order))
    _, caller = await fed_from([0, 1, 3, 4, 5, 6, 2, 7])  # past the window: its place was filled already
    assert caller.filled_s == 0.02 and caller.late == 1


async def test_a_stretch_sent_as_no_packets_is_silence_at_once() -> None:
    def dtx(k: int) -> RtpPacket:  # packet 3 carries on the sequence 200 ms later: nothing was sent between
        p = pcmu_packet(k)
        p.timestamp += 1600 if k >= 3 else 0
        return p

    fed, caller = await fed_from([0, 1, 2, 3], packets=dtx)
    silent = [f for f in fed if len(f) and level(f) == 0]
    assert [len(f) for f in silent] == [3200] and caller.filled_s == 0  # not a loss: nothing concealed


async def test_repeats_empty_packets_and_a_restarted_clock_leave_the_audio_whole() -> None:
    in_order, _ = await fed_from([0, 1, 2, 3, 4, 5])
    repeated, caller = await fed_from([0, 1, 3, 3, 2, 2, 4, 5])
    assert np.array_equal(np.concatenate(repeated), np.concatenate(in_order)) and caller.filled_s == 0

    def with_an_empty_one(k: int) -> RtpPacket:
        p = pcmu_packet(k)
        if k == 2:
            p._data = b""  # type: ignore[attr-defined]  # a packet with no audio in it (padding only)
        return p

    fed, caller = await fed_from([0, 1, 2, 3, 4, 5], packets=with_an_empty_one)
    assert sum(len(f) for f in fed) >= 5 * 320 - 64 and caller.undecodable == 0  # the rest still decoded

    def restarted(k: int) -> RtpPacket:  # the sender's clock jumps 5 s on at packet 3
        p = pcmu_packet(k)
        p.timestamp += 40000 if k >= 3 else 0
        return p

    fed, caller = await fed_from([0, 1, 2, 3, 4, 5], packets=restarted)
    assert sum(len(f) for f in fed) <= 6 * 320 + 64 and caller.filled_s == 0  # placed from there: no 5 s filled


def opus_packets(seconds: float) -> list[bytes]:
    encoder = OpusEncoder()
    pcm = (voiced(seconds, 48000) * 32767).astype(np.int16)
    out: list[bytes] = []
    for k in range(0, len(pcm), 960):
        frame = av.AudioFrame.from_ndarray(pcm[k:k + 960].reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = 48000, k, fractions.Fraction(1, 48000)
        out += encoder.encode(frame)[0]
    return out


async def test_opus_packets_out_of_order_are_decoded_in_sequence() -> None:
    """Opus decodes each packet with the state the one before left: packets decoded as they arrived came out
    distorted. In sequence, what is fed is exactly what packets in order give."""
    data = opus_packets(0.6)

    def opus(k: int) -> RtpPacket:
        p = RtpPacket(payload_type=111, sequence_number=k, timestamp=960 * k)
        p._data = data[k]  # type: ignore[attr-defined]
        return p

    in_order, _ = await fed_from(list(range(len(data))), packets=opus, codec=OPUS_CODEC)
    jumbled = [0, 2, 1, 3, 5, 4, 6, 7, 9, 8, 10, 12, 11, *range(13, len(data))]
    reordered, caller = await fed_from(jumbled, packets=opus, codec=OPUS_CODEC)
    assert caller.late == 0 and caller.filled_s == 0
    assert np.array_equal(np.concatenate(reordered), np.concatenate(in_order))


def test_the_tap_passes_each_packet_with_its_codec_and_nothing_to_the_decoder() -> None:
    tap = PacketTap()
    tap.codecs[0] = PCMU_CODEC
    assert tap.add(pcmu_packet(0)) == (False, None)
    assert tap.add(RtpPacket(payload_type=96)) == (False, None)  # a payload type not negotiated: not passed
    packet, codec = tap.packets.get_nowait() or (None, None)
    assert codec is PCMU_CODEC and packet is not None and tap.packets.empty()


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
