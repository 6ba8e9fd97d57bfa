"""Lost packets in the caller's audio, concealed: the place of a packet that never came (RTP over UDP:
WebRTC, SIP) is filled with the caller's last pitch period repeated and fading, instead of silence.

A 20 ms hole of digital silence inside a voiced sound is a click on either side and a gap in the
vowel; the recognizer hears both. Repeating the last pitch period (as G.711's Appendix I and Opus's
own concealment do, in their ways) carries the sound across a short loss. The repetition is held at
full level for `HOLD_S`, then fades out over `FADE_S`: a longer loss is silence after that, as it would
be without concealment, so nothing is made up beyond a few tens of milliseconds.

The concealer sees every sample the caller's stream passes on (`heard`) and, for a loss, makes the
fill (`fill`). It works at any rate; the transports use it at the rate they feed the session."""

from __future__ import annotations

import numpy as np

from models.protocols import Audio

HOLD_S = 0.02  # the repetition at full level: one lost 20 ms packet is carried across whole
FADE_S = 0.04  # then it fades to silence over this long
MIN_PITCH_HZ = 70.0
MAX_PITCH_HZ = 400.0
HISTORY_S = 0.05  # what the pitch is found in: enough for two periods of the lowest pitch


class Concealer:
    """Fills lost stretches of one caller's audio at `rate` (see the module doc)."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.history = np.zeros(0, dtype=np.float32)
        self.keep = int(HISTORY_S * rate)
        self.lags = (int(rate / MAX_PITCH_HZ), int(rate / MIN_PITCH_HZ))
        self.phase = 0  # where a fill that goes on from the last one resumes the repetition
        self.filled = 0  # samples filled since the last heard ones (the fade goes on across fills)

    def heard(self, samples: Audio) -> None:
        """Samples the stream passed on as they came."""
        if not len(samples):
            return
        self.history = np.concatenate([self.history, samples.astype(np.float32)])[-self.keep:]
        self.phase = self.filled = 0

    def period(self) -> int:
        """The last pitch period in samples (autocorrelation over the history), or 0: too little
        history, or nothing voiced to repeat."""
        low, high = self.lags
        history = self.history
        if len(history) < 2 * low or not np.any(history):
            return 0
        high = min(high, len(history) // 2)
        tail = history[-high:]
        best, best_score = 0, 0.3  # a period must explain the tail at least this well (normalised correlation)
        for lag in range(low, high + 1):
            before = history[-high - lag:-lag]
            norm = float(np.sqrt(np.dot(tail, tail) * np.dot(before, before)))
            if norm <= 0:
                continue
            score = float(np.dot(tail, before)) / norm
            if score > best_score:
                best, best_score = lag, score
        return best

    def fill(self, count: int) -> Audio:
        """`count` samples for a lost stretch: the last period repeated, then fading; silence where there
        is nothing voiced to repeat. Consecutive fills continue one another."""
        out = np.zeros(count, dtype=np.float32)
        period = self.period()
        if period == 0 or count == 0:
            self.filled += count
            return out
        cycle = self.history[-period:]  # its first sample is the one a period before the next one due
        index = (self.phase + np.arange(count)) % period
        out[:] = cycle[index]
        hold, fade = int(HOLD_S * self.rate), int(FADE_S * self.rate)
        since = self.filled + np.arange(count)
        gain = np.clip(1.0 - (since - hold) / max(fade, 1), 0.0, 1.0).astype(np.float32)
        out *= gain
        self.phase = int((self.phase + count) % period)
        self.filled += count
        return out
