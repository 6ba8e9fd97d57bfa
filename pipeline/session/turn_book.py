"""The call's turns: numbered from one counter (speech and keypad turns alike), the ones still open
by id, the caller's latest, the one the bot answers, and whether the caller has gone."""

from __future__ import annotations

import itertools

from pipeline.turns import Turn


class TurnBook:
    def __init__(self) -> None:
        self.ids = itertools.count(1)  # the VAD stage numbers speech turns from it too
        self.open: dict[int, Turn] = {}  # turns whose reply has not ended (their marks, for the record)
        self.last_started = 0  # the turn id of the caller's latest speech (or keys, or typed turn)
        self.answering = 0  # the turn id of the caller's latest turn that got a reply
        self.closed = False  # the caller has gone: nothing new starts (a keypad turn in flight included)

    def new(self, now: float, ended_at: float | None = None) -> Turn:
        """A turn that is over as it starts (keys, a typed message): its "transcript" is ready now;
        `ended_at`: when the caller really ended (the last key press), now if not given."""
        turn = Turn(next(self.ids))
        self.started(turn.turn_id)
        turn.mark("speech_end", now)
        turn.mark("asr_final", now)
        turn.ended_at = now if ended_at is None else ended_at
        self.open[turn.turn_id] = turn
        return turn

    def started(self, turn_id: int) -> None:
        self.last_started = max(self.last_started, turn_id)

    def get(self, turn_id: int) -> Turn:
        """The open turn `turn_id`, opened if it is not."""
        return self.open.setdefault(turn_id, Turn(turn_id))

    def close(self, turn_id: int) -> None:
        self.open.pop(turn_id, None)
