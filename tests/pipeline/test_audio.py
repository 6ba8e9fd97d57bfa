"""G.711 mu-law, the phone line's codec."""

from __future__ import annotations

import numpy as np

from pipeline.audio import float_to_mulaw, mulaw_to_float, mulaw_to_pcm16, pcm16_to_mulaw


def test_mulaw_decodes_to_the_g711_table() -> None:
    codes = bytes(range(256))
    linear = np.frombuffer(mulaw_to_pcm16(codes), dtype="<i2")
    assert linear[0x00] == -32124 and linear[0x80] == 32124  # the loudest codes
    assert linear[0xFF] == 0 and linear[0x7F] == 0  # +0 and -0
    # 0x00-0x7F are negative, growing towards zero; 0x80-0xFF mirror them
    assert np.all(np.diff(linear[:0x80]) > 0) and np.array_equal(linear[0x80:], -linear[:0x80])
    # every code but -0 survives a round trip
    again = pcm16_to_mulaw(linear.astype("<i2").tobytes())
    assert [c for c in range(256) if again[c] != c] == [0x7F]


def test_speech_like_audio_survives_the_phone_line() -> None:
    t = np.arange(8000) / 8000
    audio = (0.4 * np.sin(2 * np.pi * 220 * t) * np.sin(2 * np.pi * 3 * t)).astype(np.float32)
    coded = float_to_mulaw(audio)
    assert len(coded) == len(audio)  # one byte a sample
    back = mulaw_to_float(coded)
    noise = back - audio
    snr_db = 10 * np.log10(np.sum(audio**2) / np.sum(noise**2))
    assert snr_db > 30, snr_db  # G.711's ~38 dB for a loud signal
