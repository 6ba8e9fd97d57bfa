"""G.711 mu-law, the phone line's codec, and the live stream's resampler."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.audio import StreamResampler, float_to_mulaw, mulaw_to_float, mulaw_to_pcm16, pcm16_to_mulaw


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


def tone(hz: float, rate: int, seconds: float = 1.0) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * hz * np.arange(int(rate * seconds)) / rate)).astype(np.float32)


def streamed(resampler: StreamResampler, samples: np.ndarray, chunk: int) -> tuple[np.ndarray, list[float]]:
    """The stream's output fed `chunk` samples at a time, then ended; and, after each chunk, how far (in
    seconds) the output so far lags the input so far."""
    out, lags, given = [], [], 0
    for i in range(0, len(samples), chunk):
        out.append(resampler(samples[i:i + chunk]))
        given += len(out[-1])
        lags.append(min(i + chunk, len(samples)) / resampler.in_rate - given / resampler.out_rate)
    out.append(resampler(np.zeros(0, dtype=np.float32), last=True))
    return np.concatenate(out), lags


@pytest.mark.parametrize("rates", [(8000, 16000), (24000, 16000), (48000, 16000), (44100, 16000), (16000, 8000)])
def test_the_stream_resampler_keeps_a_tone_in_place_and_holds_back_only_a_few_ms(rates: tuple[int, int]) -> None:
    """A 1 kHz tone comes out the same tone, aligned with the input (no delay to undo), the same length as
    the input at the new rate, the same to the bit whatever the chunks (a network's packets must not change
    what the recognizer hears); and a live stream is held back a few ms (6.5 from 8 kHz; soxr's streaming
    resampler held 8 kHz audio back 61 ms)."""
    in_rate, out_rate = rates
    samples = tone(1000, in_rate)
    out, lags = streamed(StreamResampler(in_rate, out_rate), samples, in_rate // 50)  # 20 ms chunks
    assert len(out) == out_rate
    expected = tone(1000, out_rate)
    error = out[100:-100] - expected[100:-100]  # the ends: the tone starts and stops abruptly
    assert np.sqrt(np.mean(error ** 2)) < 1e-3 * 0.35  # -60 dB
    odd, _ = streamed(StreamResampler(in_rate, out_rate), samples, 137)
    assert np.array_equal(odd, out)
    assert max(lags[1:]) < 0.008


def test_the_stream_resampler_keeps_out_what_the_lower_rate_cannot_carry() -> None:
    """Down to 16 kHz, a 12 kHz tone (above the 8 kHz Nyquist frequency) would fold to 4 kHz: it is filtered
    out (the filter's stop band, 60 dB)."""
    out, _ = streamed(StreamResampler(48000, 16000), tone(12000, 48000), 960)
    assert np.sqrt(np.mean(out[200:-200] ** 2)) < 0.35 * 10 ** (-55 / 20)


@pytest.mark.parametrize("rates", [(8000, 16000), (48000, 16000)])
def test_the_stream_resampler_keeps_the_top_of_the_band(rates: tuple[int, int]) -> None:
    """A tone at 90 % of the lower rate's Nyquist frequency (3.6 kHz on a phone line, where /s/ and /z/ are)
    passes within 0.5 dB: a pass band that ended at 85 % lost enough of it that whisper-tiny.en heard "days" as
    "day" (bench/stream_resampler.py --draws)."""
    in_rate, out_rate = rates
    hz = 0.9 * min(in_rate, out_rate) / 2
    out, _ = streamed(StreamResampler(in_rate, out_rate), tone(hz, in_rate), in_rate // 50)
    level = np.sqrt(np.mean(out[400:-400] ** 2)) / np.sqrt(np.mean(tone(hz, out_rate)[400:-400] ** 2))
    assert abs(20 * np.log10(level)) < 0.5, level


def test_the_same_rate_passes_through() -> None:
    samples = tone(440, 16000)
    assert StreamResampler(16000, 16000)(samples) is samples
