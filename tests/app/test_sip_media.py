"""SIP media and signalling logic without a network: RTP packets, the caller's stream put back in
order, RFC 4733 keys, SDP offers and answers, who may call in, where a call out goes."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from app.settings import SipConfig, SipTrunk
from app.transports.sip import sdp
from app.transports.sip.endpoint import local_address, trusted
from app.transports.sip.rtp import (
    PCMA,
    PCMU,
    CallerStream,
    KeypadEvents,
    encode,
    parse_rtp,
    rtp_header,
)
from pipeline.audio import float_to_pcm16


def packet(sequence: int, timestamp: int, payload: bytes, payload_type: int = PCMU) -> bytes:
    return rtp_header(payload_type, sequence, timestamp, 0x1234) + payload


def tone(samples: int, level: float) -> bytes:
    return encode(PCMU, float_to_pcm16(np.full(samples, level, dtype=np.float32)))


def test_an_rtp_packet_is_read_past_its_csrcs_extension_and_padding() -> None:
    body = b"\x55" * 160
    header = bytearray(rtp_header(PCMA, 7, 1600, 99, marker=True))
    header[0] |= 0x20 | 0x10 | 0x01  # padding, an extension, one CSRC
    data = bytes(header) + b"CSRC" + struct.pack("!HH", 0xBEDE, 1) + b"EXT1" + body + b"\x00\x00\x03"
    parsed = parse_rtp(data)
    assert parsed is not None
    assert (parsed.payload_type, parsed.marker, parsed.sequence, parsed.timestamp, parsed.ssrc) == (PCMA, True, 7,
                                                                                                     1600, 99)
    assert parsed.payload == body


@pytest.mark.parametrize("data", [b"", b"\x80" * 5, b"\x40" + b"\x00" * 20, rtp_header(72, 1, 1, 1)])
def test_what_is_not_rtp_is_not_taken_for_it(data: bytes) -> None:
    assert parse_rtp(data) is None  # too short, version 1, RTCP on the RTP port


def test_the_callers_packets_go_on_in_order_and_a_late_one_takes_its_place() -> None:
    stream = CallerStream(PCMU, reorder_ms=60)
    out = stream.add(parse_rtp(packet(1, 0, tone(160, 0.1))))
    assert [len(a) for a in out] == [160]
    assert stream.add(parse_rtp(packet(3, 320, tone(160, 0.3)))) == []  # waits for 2
    out = stream.add(parse_rtp(packet(2, 160, tone(160, 0.2))))
    assert [round(float(a.mean()), 1) for a in out] == [0.2, 0.3]


def test_a_lost_packet_is_concealed_to_its_length_once_the_window_has_passed() -> None:
    vowel = 0.3 * np.sin(2 * np.pi * 150 * np.arange(480) / 8000)
    stream = CallerStream(PCMU, reorder_ms=40)  # sip.conceal_loss on, the default
    stream.add(parse_rtp(packet(1, 0, encode(PCMU, float_to_pcm16(vowel[:160].astype(np.float32))))))
    assert stream.add(parse_rtp(packet(3, 320, encode(PCMU, float_to_pcm16(vowel[320:].astype(np.float32)))))) == []
    out = stream.add(parse_rtp(packet(4, 480, tone(160, 0.4))))
    assert [len(a) for a in out] == [160, 160, 160]  # packet 2's place, then 3 and 4
    assert np.corrcoef(out[0], vowel[160:320])[0, 1] > 0.9  # the vowel carried on through the lost packet


def test_a_lost_packet_becomes_silence_of_its_length_once_the_window_has_passed() -> None:
    stream = CallerStream(PCMU, reorder_ms=40, conceal=False)  # 320 samples
    stream.add(parse_rtp(packet(1, 0, tone(160, 0.1))))
    assert stream.add(parse_rtp(packet(3, 320, tone(160, 0.3)))) == []
    out = stream.add(parse_rtp(packet(4, 480, tone(160, 0.4))))
    assert [len(a) for a in out] == [160, 160, 160] and not out[0].any()  # packet 2's place, then 3 and 4
    assert stream.add(parse_rtp(packet(2, 160, tone(160, 0.2)))) == []  # too late now
    assert stream.add(parse_rtp(packet(4, 480, tone(160, 0.4)))) == []  # a duplicate


def test_timestamps_that_wrap_around_go_on_in_order() -> None:
    stream = CallerStream(PCMU, reorder_ms=60)
    start = 2**32 - 160
    total = 0
    for n in range(4):
        total += sum(len(a) for a in stream.add(parse_rtp(packet(n, (start + 160 * n) % 2**32,
                                                                  tone(160, 0.1)))))
    assert total == 640


def test_a_jump_of_more_than_a_second_restarts_the_stream_without_made_up_silence() -> None:
    stream = CallerStream(PCMU, reorder_ms=60)
    stream.add(parse_rtp(packet(1, 0, tone(160, 0.1))))
    out = stream.add(parse_rtp(packet(2, 80_000, tone(160, 0.1))))
    assert [len(a) for a in out] == [160]


def test_a_key_is_reported_once_for_its_repeated_packets_and_other_types_are_not_keys() -> None:
    keys = KeypadEvents(101)
    event = bytes([5, 0x0A, 0x00, 0xA0])
    end = bytes([5, 0x8A, 0x03, 0x20])
    found = [keys.add(parse_rtp(packet(n, 8000, p, 101))) for n, p in enumerate([event, event, end, end])]
    assert found == ["5", None, None, None]
    assert keys.add(parse_rtp(packet(9, 9600, bytes([11, 0x80, 0, 0]), 101))) == "#"
    assert keys.add(parse_rtp(packet(10, 9760, b"\x55" * 160)))  is None
    assert KeypadEvents(None).add(parse_rtp(packet(1, 1, event, 101))) is None


OFFER = """v=0\r
o=- 1 1 IN IP4 10.1.2.3\r
s=-\r
c=IN IP4 10.1.2.3\r
t=0 0\r
m=audio 40000 RTP/AVP 9 8 0 96\r
a=rtpmap:9 G722/8000\r
a=rtpmap:8 PCMA/8000\r
a=rtpmap:0 PCMU/8000\r
a=rtpmap:96 telephone-event/8000\r
a=fmtp:96 0-15\r
m=video 40002 RTP/AVP 96\r
c=IN IP4 10.9.9.9\r
"""


def test_an_offer_is_read_and_the_callers_first_g711_choice_taken() -> None:
    media = sdp.parse(OFFER)
    assert (media.address, media.port) == ("10.1.2.3", 40000)
    assert media.codec() == PCMA  # G.722 first, then A-law: the caller's order among what is served
    assert media.dtmf_type() == 96


def test_an_offer_without_g711_or_audio_is_refused_with_the_reason() -> None:
    with pytest.raises(sdp.SdpError, match=r"no G\.711 codec offered.*opus/48000/2"):
        sdp.parse("v=0\r\nc=IN IP4 1.2.3.4\r\nm=audio 5000 RTP/AVP 111\r\na=rtpmap:111 opus/48000/2\r\n").codec()
    with pytest.raises(sdp.SdpError, match="no audio stream"):
        sdp.parse("v=0\r\nc=IN IP4 1.2.3.4\r\nm=video 5000 RTP/AVP 96\r\n")
    with pytest.raises(sdp.SdpError, match="no connection address"):
        sdp.parse("v=0\r\nm=audio 5000 RTP/AVP 0\r\n")


def test_the_answer_reads_back_as_what_it_offers() -> None:
    answer = sdp.write("192.0.2.7", 30000, (PCMU,), 96)
    media = sdp.parse(answer)
    assert (media.address, media.port, media.codec(), media.dtmf_type()) == ("192.0.2.7", 30000, PCMU, 96)
    assert "a=ptime:20" in answer and answer.endswith("\r\n")
    assert "IN IP6 ::1" in sdp.write("::1", 30000, (PCMU, PCMA), None)


def test_trusted_addresses_take_single_addresses_and_ranges() -> None:
    config = SipConfig(trusted_addresses=["10.0.0.0/8", "192.0.2.9", "not an address"])
    assert trusted(config, "10.20.30.40") and trusted(config, "192.0.2.9")
    assert not trusted(config, "192.0.2.10") and not trusted(config, "garbage")
    assert not trusted(SipConfig(), "127.0.0.1")  # nobody by default


def test_the_address_given_to_peers_is_the_public_one_or_the_listening_one() -> None:
    assert local_address(SipConfig(public_address="203.0.113.5")) == "203.0.113.5"
    assert local_address(SipConfig(host="127.0.0.1")) == "127.0.0.1"
    assert local_address(SipConfig(host="0.0.0.0")) not in ("0.0.0.0", "")


def test_a_call_out_goes_to_a_sip_uri_directly_or_to_a_number_through_the_trunk() -> None:
    from app.transports.sip.calls import SipCalls

    calls = SipCalls.__new__(SipCalls)  # only the destination rule, no server
    calls.config = SipConfig(trunk=SipTrunk(address="trunk.example.test:5080"))
    assert calls.target("sip:bob@10.0.0.5:5062") == (("10.0.0.5", 5062), "bob")
    assert calls.target("sip:bob@pbx.example.test") == (("pbx.example.test", 5060), "bob")
    assert calls.target("+15550001111") == (("trunk.example.test", 5080), "+15550001111")
    with pytest.raises(ValueError, match="not a SIP URI"):
        calls.target("sip:@nohost")
    calls.config = SipConfig()
    with pytest.raises(ValueError, match=r"sip\.trunk\.address"):
        calls.target("+15550001111")
