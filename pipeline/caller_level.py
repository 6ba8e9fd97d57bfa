"""The caller's level: one voice behind the caller, a television or a radio, is quieter than the caller.

The noise floor (pipeline/noise_floor.py) tells the caller from babble, which never falls silent; one clear voice
behind the caller does fall silent between its sentences, so the floor sinks below it and it starts turns of its own.
On a live call a television 10 dB below the caller kept doing so, one turn after another, and the caller's first
question was never answered: each turn's words joined the next, which the television had begun before they were
transcribed (bench/noise_calls.py). What tells the caller from that voice is level again, but the caller's own: the
caller is near the microphone.

`CallerLevel` keeps the level of the caller's speech in each turn (a high percentile, `percentile`, of the smoothed
levels of the windows the VAD called speech) and takes the loudest of the last `turns` turns as the caller's level,
and within a turn that has had `min_speech_ms` of speech that turn's own level too. A window more than
`start_margin_db` below it does not start a turn or end a pause, and one more than `stop_margin_db` below it counts as
silence while the caller talks, but only where such a voice was heard: where in the last `recent_s` the gate kept at
least `background_ms` of what the VAD called speech outside the caller's turns from starting one. On a quiet line the
end of a turn is the VAD's alone, and a caller's fading last syllable is not cut off. Before the caller's level is known
(the line's first turn, its first `min_speech_ms`), the window is left to the VAD.

A caller who speaks again more than `start_margin_db` below their loudest recent turn is not heard until they speak up,
and a television and a caller that much quieter are the same thing to a level: the margin is the trade, measured on
both sides by bench/noise_turns.py (docs/benchmarks.md, "One voice behind the caller"). Off by default: at the margins
that kept a television 10 dB down from starting turns after the caller's question (7/10 dB, tune family), half of the
tune callers' second questions asked 6 dB quieter than their first were lost; at margins that lost none (9/12 dB), the
television still began turns after half the questions. And it does not help a call that opens on the television: the
first turn is the television and the caller over it, and nothing tells them apart before the caller's level is known
(tried: a turn mostly far below its own loudest part taken for a voice behind the caller; it cut quiet callers).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from pipeline.config import CallerLevelConfig


class CallerLevel:
    def __init__(self, config: CallerLevelConfig, window_ms: float) -> None:
        self.config = config
        self._min_windows = max(1, round(config.min_speech_ms / window_ms))
        self._turns: deque[float] = deque(maxlen=config.turns)  # the caller's level in each of the last turns, dBFS
        self._current: list[float] = []  # levels of the current turn's speech windows
        self._current_level: float | None = None
        self._recent = max(1, round(config.recent_s * 1000 / window_ms))
        self._background = max(1, round(config.background_ms / window_ms))
        self._kept_out: deque[int] = deque()  # the windows (numbered) kept from starting a turn, over the last recent_s
        self._windows = 0

    @property
    def level_db(self) -> float | None:
        """The caller's level (dBFS), once known."""
        known = [*self._turns, *([self._current_level] if self._current_level is not None else [])]
        return max(known) if known else None

    @property
    def background(self) -> bool:
        """Whether a voice quieter than the caller was heard outside their turns in the last recent_s."""
        while self._kept_out and self._kept_out[0] <= self._windows - self._recent:
            self._kept_out.popleft()
        return len(self._kept_out) >= self._background

    def gate(self, probability: float, level_db: float, in_turn: bool, talking: bool, threshold: float) -> float:
        """The VAD's `probability` for a window at `level_db` (smoothed, dBFS), or 0.0 where that is too far below the
        caller's level (`in_turn`: whether the caller is in a turn; `talking`: in one and not in a pause, which decides
        the margin). A window the VAD calls speech (`threshold`) while the caller talks counts towards their level."""
        if not self.config.enabled:
            return probability
        self._windows += 1
        if talking and probability >= threshold:
            self._current.append(level_db)
            if len(self._current) >= self._min_windows:
                self._current_level = float(np.percentile(self._current, self.config.percentile))
        caller = self.level_db
        if caller is None:
            return probability
        if talking:
            quiet = self.background and level_db < caller - self.config.stop_margin_db
            return 0.0 if quiet else probability
        if level_db >= caller - self.config.start_margin_db:
            return probability
        if not in_turn and probability >= threshold:
            self._kept_out.append(self._windows)
        return 0.0

    def turn_ended(self) -> None:
        """The caller's turn ended: its level, if it had enough speech to tell, is one of the last turns'."""
        if self._current_level is not None:
            self._turns.append(self._current_level)
        self._current.clear()
        self._current_level = None
