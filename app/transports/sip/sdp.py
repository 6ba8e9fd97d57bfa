"""The SDP of a SIP call (RFC 4566, offer/answer RFC 3264): the caller's audio address and codecs
read from the offer, and the answer (or an outbound call's offer) written: G.711 (PCMU, PCMA) and
RFC 4733 telephone-events, 20 ms packets, one audio stream."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from app.transports.sip.rtp import CODEC_NAMES, PCMA, PCMU

DTMF_TYPE = 101  # the telephone-event payload type the server offers


class SdpError(ValueError):
    """An offer the server cannot take: answered 488 Not Acceptable Here, with the reason."""


@dataclass(frozen=True)
class Media:
    address: str  # where the peer takes RTP
    port: int
    formats: tuple[int, ...]  # payload types, in the peer's order of preference
    rtpmap: dict[int, str] = field(default_factory=dict)  # payload type -> "name/rate", lower case

    def codec(self) -> int:
        """The G.711 codec to use: the peer's first choice among PCMU and PCMA."""
        for payload_type in self.formats:
            name = self.rtpmap.get(payload_type, "").split("/")[0]
            if payload_type in (PCMU, PCMA) and name in ("", CODEC_NAMES[payload_type].lower()):
                return payload_type
            if name == "pcmu":
                return PCMU
            if name == "pcma":
                return PCMA
        offered = ", ".join(self.rtpmap.get(pt, str(pt)) for pt in self.formats) or "none"
        raise SdpError(f"no G.711 codec offered (PCMU or PCMA at 8 kHz; offered: {offered})")

    def dtmf_type(self) -> int | None:
        for payload_type in self.formats:
            if self.rtpmap.get(payload_type, "").startswith("telephone-event/8000"):
                return payload_type
        return None


def parse(sdp: str) -> Media:
    """The first audio stream of an SDP offer or answer."""
    session_address = media_address = ""
    port: int | None = None
    formats: tuple[int, ...] = ()
    rtpmap: dict[int, str] = {}
    for raw in sdp.splitlines():
        line = raw.strip()
        if len(line) < 2 or line[1] != "=":
            continue
        kind, value = line[0], line[2:]
        if kind == "m":
            if port is not None:
                break  # the first audio stream only
            parts = value.split()
            if len(parts) < 4 or parts[0] != "audio":
                continue
            if not parts[1].isdigit() or not 0 < int(parts[1]) < 65536:
                raise SdpError(f"a bad media port: {parts[1]!r}")
            port = int(parts[1])
            formats = tuple(int(p) for p in parts[3:] if p.isdigit() and int(p) < 128)
        elif kind == "c":
            parts = value.split()
            if len(parts) >= 3:
                if port is None:
                    session_address = parts[2].split("/")[0]
                else:
                    media_address = parts[2].split("/")[0]
        elif kind == "a" and port is not None and value.startswith("rtpmap:"):
            number, _, encoding = value.removeprefix("rtpmap:").partition(" ")
            if number.isdigit():
                rtpmap[int(number)] = encoding.strip().lower()
    if port is None:
        raise SdpError("no audio stream in the SDP")
    address = media_address or session_address
    if not address:
        raise SdpError("no connection address (c=) in the SDP")
    return Media(address, port, formats, rtpmap)


def write(address: str, port: int, codecs: tuple[int, ...], dtmf_type: int | None) -> str:
    """An SDP with one audio stream at `address`:`port` taking `codecs` (and telephone-events)."""
    version = secrets.randbelow(2**31)
    formats = [*codecs, *([dtmf_type] if dtmf_type is not None else [])]
    family = "IP6" if ":" in address else "IP4"
    lines = [
        "v=0",
        f"o=voice-agent {version} {version} IN {family} {address}",
        "s=voice-agent",
        f"c=IN {family} {address}",
        "t=0 0",
        f"m=audio {port} RTP/AVP {' '.join(str(f) for f in formats)}",
        *(f"a=rtpmap:{codec} {CODEC_NAMES[codec]}/8000" for codec in codecs),
        *([f"a=rtpmap:{dtmf_type} telephone-event/8000", f"a=fmtp:{dtmf_type} 0-16"] if dtmf_type is not None else []),
        "a=ptime:20",
        "a=sendrecv",
    ]
    return "\r\n".join(lines) + "\r\n"
