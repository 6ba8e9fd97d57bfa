"""PCM conversions, G.711 mu-law (the phone line's codec) and resampling (soxr, streaming so chunk
edges leave no clicks)."""

from __future__ import annotations

import warnings

import numpy as np
import soxr

with warnings.catch_warnings():
    # The standard library's audioop (deprecated, removed in Python 3.13, where the audioop-lts package
    # provides the same module) is the maintained C implementation of G.711.
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

from models.protocols import Audio

SUPPORTED_INPUT_RATES = (8000, 16000, 24000, 48000)


def pcm16_to_float(data: bytes) -> Audio:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def float_to_pcm16(samples: Audio) -> bytes:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def mulaw_to_pcm16(data: bytes) -> bytes:
    """8-bit mu-law bytes (G.711, as Twilio and Telnyx PCMU carry them) to little-endian PCM16."""
    return audioop.ulaw2lin(data, 2)


def pcm16_to_mulaw(data: bytes) -> bytes:
    return audioop.lin2ulaw(data, 2)


def alaw_to_pcm16(data: bytes) -> bytes:
    """8-bit A-law bytes (G.711, PCMA) to little-endian PCM16."""
    return audioop.alaw2lin(data, 2)


def pcm16_to_alaw(data: bytes) -> bytes:
    return audioop.lin2alaw(data, 2)


def mulaw_to_float(data: bytes) -> Audio:
    return pcm16_to_float(mulaw_to_pcm16(data))


def float_to_mulaw(samples: Audio) -> bytes:
    return pcm16_to_mulaw(float_to_pcm16(samples))


class StreamResampler:
    """Resamples a stream chunk by chunk; a no-op when the rates match."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.in_rate, self.out_rate = in_rate, out_rate
        self._stream = None if in_rate == out_rate else soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32")

    def __call__(self, samples: Audio, last: bool = False) -> Audio:
        if self._stream is None:
            return samples
        out: Audio = self._stream.resample_chunk(samples, last=last)
        return out


def resample(samples: Audio, in_rate: int, out_rate: int) -> Audio:
    if in_rate == out_rate:
        return samples
    out: Audio = soxr.resample(samples, in_rate, out_rate).astype(np.float32, copy=False)
    return out
