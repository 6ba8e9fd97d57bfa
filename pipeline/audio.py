"""PCM conversions, G.711 mu-law (the phone line's codec) and resampling: whole chunks with soxr, a live
stream with a short polyphase filter of our own (streaming, so chunk edges leave no clicks, and 3-7 ms
late where soxr's streaming resampler held the caller's audio back 62 ms from 8 kHz)."""

from __future__ import annotations

import math
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
    """Resamples a live stream chunk by chunk; a no-op when the rates match.

    A windowed-sinc low-pass (Kaiser, 60 dB) run as a polyphase filter, linear phase and short: its pass band
    ends at `pass_band` (93 %) of the lower rate's Nyquist frequency and its stop band begins there, so each
    output sample waits for only half the filter (6.5 ms from 8 kHz to 16 kHz, 3.2 ms from 24 or 48 kHz).
    soxr's streaming resampler, at any quality that filters (LQ to VHQ), held the stream back 33-61 ms from
    8 kHz and 11-42 ms from 24 or 48 kHz: that long after the caller stopped, the VAD and the recognizer were
    still waiting for the end of their words. A pass band ending at 85 % (half the filter, 3.1 ms) cut the top
    of the phone band, where /s/ and /z/ are, and whisper-tiny.en made more errors on 8 kHz callers
    (bench/stream_resampler.py on its tune split). The output is aligned with the input (sample k is at time
    k / out_rate), the same to the bit however the input is chunked; the last half filter of it comes with
    the next chunk, or at once with `last=True`."""

    ATTENUATION_DB = 60.0
    PASS = 0.93  # the pass band's edge, a share of the lower rate's Nyquist frequency

    def __init__(self, in_rate: int, out_rate: int, pass_band: float = PASS) -> None:
        self.in_rate, self.out_rate = in_rate, out_rate
        g = math.gcd(in_rate, out_rate)
        self.up, self.down = out_rate // g, in_rate // g
        if in_rate == out_rate:
            return
        rate = in_rate * self.up  # the filter runs at the common rate
        nyquist = min(in_rate, out_rate) / 2
        width = 2 * math.pi * (1 - pass_band) * nyquist / rate  # the transition band, radians a sample
        taps = math.ceil((self.ATTENUATION_DB - 7.95) / (2.285 * width)) + 1
        taps += 1 - taps % 2  # odd: a whole-sample delay
        self.center = (taps - 1) // 2
        cutoff = (1 + pass_band) / 2 * nyquist / rate  # cycles a sample, mid transition
        n = np.arange(taps) - self.center
        h = 2 * cutoff * np.sinc(2 * cutoff * n) * np.kaiser(taps, 0.1102 * (self.ATTENUATION_DB - 8.7))
        h *= self.up / h.sum()  # unit gain: the up-sampled stream has one sample in `up` not zero
        self.per_phase = -(-taps // self.up)  # input samples each output sample weighs
        padded = np.zeros(self.per_phase * self.up)
        padded[:taps] = h
        phases = padded.reshape(self.per_phase, self.up).T  # [phase, j] = h[phase + j * up]
        self._weights = phases[:, ::-1].copy()  # [phase, j]: the weight of the j-th oldest input an output weighs
        self._history = np.zeros(self.per_phase, dtype=np.float64)  # silence before the stream
        self._first = -self.per_phase  # the stream index of _history[0]
        self._in = 0  # input samples taken
        self._out = 0  # output samples given

    def _ready(self, inputs: int) -> int:
        """How many output samples the first `inputs` input samples make whole."""
        return max(0, -(-(inputs * self.up - self.center) // self.down))

    def __call__(self, samples: Audio, last: bool = False) -> Audio:
        if self.in_rate == self.out_rate:
            return samples
        self._history = np.concatenate([self._history, samples.astype(np.float64)])
        self._in += len(samples)
        end = self._ready(self._in)
        if last:  # the rest as if silence followed
            end = -(-self._in * self.up // self.down)
            self._history = np.concatenate([self._history, np.zeros(self.per_phase + 1)])
        out = np.empty(max(0, end - self._out), dtype=np.float32)
        windows = np.lib.stride_tricks.sliding_window_view(self._history, self.per_phase)
        for i in range(min(self.up, len(out))):  # outputs i, i + up, ... weigh their inputs with one phase
            u = (self._out + i) * self.down + self.center
            oldest = u // self.up - self.per_phase + 1 - self._first  # the first input output i weighs
            count = len(range(i, len(out), self.up))
            taken = windows[oldest:oldest + (count - 1) * self.down + 1:self.down]
            out[i::self.up] = np.einsum("kj,j->k", taken, self._weights[u % self.up])  # the same sums however chunked
        self._out = end
        keep = (end * self.down + self.center) // self.up - self.per_phase + 1  # the oldest sample still needed
        if keep > self._first:
            self._history = self._history[keep - self._first:]
            self._first = keep
        return out


def resample(samples: Audio, in_rate: int, out_rate: int) -> Audio:
    if in_rate == out_rate:
        return samples
    out: Audio = soxr.resample(samples, in_rate, out_rate).astype(np.float32, copy=False)
    return out
