"""The noise floor: where the background sounds like speech, a sound no louder than it is not the caller.

Silero VAD ignores steady noise (hum, fans, brown and pink noise: p50 below 0.05 at 5 dB SNR) but
hears other people talking as speech, which it is: babble of four voices 10 dB below the caller
scored 0.96 throughout, so a caller in a café or an open office never stopped talking as far as the
endpointer could tell, and their question was answered only when the noise stopped
(bench/noise_turns.py). What tells the caller from the room is level: the caller is near the
microphone, the room is not. (One clear voice behind the caller, a television or a radio, is not
told apart this way: its level rises and falls like the caller's.)

`NoiseFloor` follows the level of each VAD window (smoothed over `smooth_ms`) and takes as the floor
a low percentile of the levels over the last `window_s` of the line heard while the caller was not
talking: the level the line falls back to between words and turns. What is heard while the caller
talks does not count, not even at the start of the line (save the one case below): a caller who
speaks as the line opens, whose first words would otherwise become the floor, is not cut off in
their first question by their own voice, and a caller's long turn never becomes their background.

Where the VAD calls the quietest of those windows speech (the background fools it), a window counts
as speech only `start_margin_db` above the floor to begin a turn or go on after a pause, and as
silence within `stop_margin_db` of it while the caller talks: two margins, so that neither a loud
word in the babble starts a turn or keeps a paused one going, nor the caller's fading last syllable
ends it. Elsewhere (a quiet room, steady noise) the VAD decides alone, and so it does for a window
quieter than `quiet_dbfs` and until `first_s` of the line was heard outside the caller's turns. A line that
has sounded like speech since it opened (the VAD began a turn on it at once) is the caller or the room: after
`first_turn_s` of it with no pause it is taken for the room and learned, so a call that opens in a café is held
for that long and not until `endpointing.max_turn_s`, and a caller who talks that long without a pause as the line
opens may be cut off. Babble that begins while the caller talks is not learned until they pause: a turn it keeps
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
        self._learned = 0  # windows learned so far (heard while the caller was not talking)
        self._first = round(config.first_s * 1000 / window_ms)  # windows learned before the gate acts
        self._first_turn = round(config.first_turn_s * 1000 / window_ms)
        self._unknown: list[tuple[float, float]] = []  # (level, probability) heard talking before the floor is known
        self.level_db = -100.0  # the last window's smoothed level, dBFS
        self.floor_db: float | None = None  # None until first_s of the line was heard outside the caller's turns
        self.fooled = False  # whether the background sounds like speech to the VAD

    def gate(self, probability: float, window: np.ndarray, talking: bool) -> float:
        """The VAD's `probability` for `window`, or 0.0 where the background fools the VAD and the window is not
        far enough above it (`talking`: whether the caller is talking, in a turn and not in a pause, which decides
        the margin)."""
        power = float(np.mean(np.square(window, dtype=np.float64))) + SILENT_POWER if len(window) else SILENT_POWER
        self._power = power if self._power is None else self._power + self._alpha * (power - self._power)
        self.level_db = 10.0 * math.log10(self._power)  # kept with the gate off too: the caller's level gate reads it
        if not self.config.enabled:
            return probability
        if not talking:
            self._learn(self.level_db, probability)
        elif self._learned < self._first:
            # the line has sounded like speech since it opened: the caller, or the room? After first_turn_s of it
            # without a pause, the room
            self._unknown.append((self.level_db, probability))
            if len(self._unknown) >= self._first_turn:
                for level, heard in self._unknown:
                    self._learn(level, heard)
                self._unknown.clear()
        if self.level_db < self.config.quiet_dbfs or self._learned < self._first:
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

    def _learn(self, level: float, probability: float) -> None:
        self._levels.append(level)
        self._probabilities.append(probability)
        self._learned += 1
