"""The noise floor: where the background sounds like speech, a sound no louder than it is not the caller.

Silero VAD ignores steady noise (hum, fans, brown and pink noise: p50 below 0.05 at 5 dB SNR) but
hears other people talking as speech, which it is: babble of four voices 10 dB below the caller
scored 0.96 throughout, so a caller in a café or beside a television never stopped talking as far as
the endpointer could tell, and their question was answered only when the noise stopped
(bench/noise_turns.py). What tells the caller from the room is level: the caller is near the
microphone, the room is not.

`NoiseFloor` follows the level of each VAD window (smoothed over `smooth_ms`) and takes as the floor
a low percentile of the levels over the last `window_s` of the line heard while the caller was not
talking (and over the line's first `first_s`, whatever was heard there): the level the line falls
back to between words and turns. A caller's own long turn never becomes their background.

Where the VAD calls the quietest of those windows speech (the background fools it), a window counts
as speech only `start_margin_db` above the floor to begin a turn or go on after a pause, and as
silence within `stop_margin_db` of it while the caller talks: two margins, so that neither a loud
word in the babble starts a turn or keeps a paused one going, nor the caller's fading last syllable
ends it. Elsewhere (a quiet room, steady noise) the VAD decides alone, and so it does for a window
quieter than `quiet_dbfs` and over the line's first `first_s` (a caller who speaks at once is not
taken for the background; a call that opens on other people talking gets one short turn of their
talk). Babble that begins while the caller talks is not learned until they pause: a turn it keeps
going ends at `endpointing.max_turn_s`.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from pipeline.config import NoiseFloorConfig

SILENT_POWER = 1e-10  # -100 dBFS: the level of digital silence


class NoiseFloor:
    def __init__(self, config: NoiseFloorConfig, window_ms: float) -> None:
        self.config = config
        self._alpha = min(1.0, window_ms / config.smooth_ms) if config.smooth_ms > 0 else 1.0
        size = max(1, round(config.window_s * 1000 / window_ms))
        self._levels: deque[float] = deque(maxlen=size)
        self._probabilities: deque[float] = deque(maxlen=size)
        self._power: float | None = None
        self._heard = 0  # windows heard so far
        self._first = round(config.first_s * 1000 / window_ms)  # windows heard before the gate acts
        self.level_db = -100.0  # the last window's smoothed level, dBFS
        self.floor_db: float | None = None  # None until the line's first first_s are heard
        self.fooled = False  # whether the background sounds like speech to the VAD

    def gate(self, probability: float, window: np.ndarray, talking: bool) -> float:
        """The VAD's `probability` for `window`, or 0.0 where the background fools the VAD and the window is not
        far enough above it (`talking`: whether the caller is talking, in a turn and not in a pause, which decides
        the margin)."""
        if not self.config.enabled:
            return probability
        power = float(np.mean(np.square(window, dtype=np.float64))) + SILENT_POWER if len(window) else SILENT_POWER
        self._power = power if self._power is None else self._power + self._alpha * (power - self._power)
        self.level_db = 10.0 * math.log10(self._power)
        if not talking or self._heard < self._first:
            self._levels.append(self.level_db)
            self._probabilities.append(probability)
        self._heard += 1
        if self.level_db < self.config.quiet_dbfs or self._heard < self._first:
            return probability
        levels = np.fromiter(self._levels, dtype=np.float64, count=len(self._levels))
        floor = float(np.percentile(levels, self.config.percentile))
        quiet = levels <= floor + self.config.stop_margin_db
        probabilities = np.fromiter(self._probabilities, dtype=np.float64, count=len(levels))
        self.floor_db = floor
        self.fooled = float(np.median(probabilities[quiet])) >= self.config.fooled_probability
        if not self.fooled:
            return probability
        margin = self.config.stop_margin_db if talking else self.config.start_margin_db
        return probability if self.level_db >= floor + margin else 0.0
