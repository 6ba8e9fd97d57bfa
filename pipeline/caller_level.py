"""The caller's level: one voice behind the caller, a television or a radio, is quieter than the caller.

The noise floor (pipeline/noise_floor.py) tells the caller from babble, which never falls silent; one clear voice
behind the caller does fall silent between its sentences, so the floor sinks below it and it starts turns of its own.
On a live call a television 10 dB below the caller kept doing so, one turn after another, and the caller's first
question was never answered: each turn's words joined the next, which the television had begun before they were
transcribed (bench/noise_calls.py). What tells the caller from that voice is level again, but the caller's own: the
caller is near the microphone.

`CallerLevel` keeps the level of the caller's speech in each turn (a high percentile, `percentile`, of the smoothed
levels of the windows the VAD called speech) and takes the loudest of the last `turns` turns as the caller's level, and
within a turn that has had `min_speech_ms` of speech that turn's own level too. A window more than `start_margin_db`
below it does not start a turn or end a pause, and one more than `stop_margin_db` below it counts as silence while the
caller talks, but only where such a voice was heard: where in the last `recent_s` the gate kept at least `background_ms`
of what the VAD called speech outside the caller's turns from starting one, or where `background_share` of the current
turn's speech windows are that far below the turn's own level (a call that opens on a television: the television and
then the caller over it, one turn; a caller's own turn on a quiet line had at most a fifth of its windows so far below,
bench/noise_turns.py's tune voices). There, too, a pause resumes only after `resume_ms` of speech loud enough to be the
caller, not on the voice's loudest syllable (the speech before that counts as the pause's silence: the resume is not
backdated). On a quiet line the end of a turn is mostly the VAD's alone, and a caller's fading last syllable is not cut
off (mostly: the share can act there too, and one clean held-out question of 38 was cut at 7/10 dB). Before the caller's
level is known (the line's first turn, its first `min_speech_ms`), the window is left to the VAD.

A caller who speaks again more than `start_margin_db` below their loudest recent turn is not heard until they speak up
or `memory_s` has passed since that turn, and a television and a caller that much quieter are the same thing to a level:
the margin is the trade, measured on both sides by bench/noise_turns.py (docs/benchmarks.md, "One voice behind the
caller"). Off by default for that: at 7/10 dB, which on the tune television (10 dB down) left no turn of its own after
the caller's question, half of the second questions asked 6 dB quieter than the first were lost (tune and held-out
callers alike), and 4 of 38 held-out ones asked only 3 dB quieter. Live, it did not make a call that opens on a
television answerable: at the live pause's patience the television's first turn takes in the question and goes on, and
too little of it is far enough below the caller's part for `background_share` (docs/benchmarks.md).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from pipeline.config import CallerLevelConfig


class CallerLevel:
    def __init__(self, config: CallerLevelConfig, window_ms: float) -> None:
        self.config = config
        self._min_windows = max(1, round(config.min_speech_ms / window_ms))
        # the caller's level in each of the last turns (dBFS), with the window (numbered) each ended at
        self._turns: deque[tuple[int, float]] = deque(maxlen=config.turns)
        self._memory = max(1, round(config.memory_s * 1000 / window_ms))
        self._current: list[float] = []  # levels of the current turn's speech windows
        self._current_level: float | None = None
        self._recent = max(1, round(config.recent_s * 1000 / window_ms))
        self._background = max(1, round(config.background_ms / window_ms))
        self._kept_out: deque[int] = deque()  # the windows (numbered) kept from starting a turn, over the last recent_s
        self._windows = 0
        self._resume = max(1, round(config.resume_ms / window_ms))
        self._loud = 0  # speech windows in a row loud enough to be the caller, since the caller last talked

    @property
    def level_db(self) -> float | None:
        """The caller's level (dBFS), once known."""
        while self._turns and self._turns[0][0] <= self._windows - self._memory:
            self._turns.popleft()  # a caller who moved away from the microphone is heard again after memory_s
        known = [level for _, level in self._turns]
        if self._current_level is not None:
            known.append(self._current_level)
        return max(known) if known else None

    @property
    def background(self) -> bool:
        """Whether a voice quieter than the caller was heard: outside their turns in the last recent_s, or under
        them in the current turn."""
        while self._kept_out and self._kept_out[0] <= self._windows - self._recent:
            self._kept_out.popleft()
        if len(self._kept_out) >= self._background:
            return True
        if self._current_level is None:
            return False
        quiet = np.asarray(self._current) < self._current_level - self.config.stop_margin_db
        return float(np.mean(quiet)) >= self.config.background_share

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
            self._loud = 0
            quiet = level_db < caller - self.config.stop_margin_db and self.background
            return 0.0 if quiet else probability
        if level_db >= caller - self.config.start_margin_db:
            if probability < threshold:
                self._loud = 0
                return probability
            self._loud += 1
            # in a pause over a quieter voice, its loudest syllable does not resume the turn: resume_ms of speech does
            held = in_turn and self._loud < self._resume and self.background
            return 0.0 if held else probability
        self._loud = 0
        if not in_turn and probability >= threshold:
            self._kept_out.append(self._windows)
        return 0.0

    def turn_ended(self) -> None:
        """The caller's turn ended: its level, if it had enough speech to tell, is one of the last turns'."""
        if self._current_level is not None:
            self._turns.append((self._windows, self._current_level))
        self._current.clear()
        self._current_level = None
        self._loud = 0
