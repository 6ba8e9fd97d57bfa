"""Keys pressed on a phone (DTMF): a turn of their own, collected until `session.dtmf_timeout_ms`
passes without one, then answered like words ("The caller pressed 4 2 # on the phone keypad.").
A key pressed while the bot talks interrupts it, like a word (the session does that)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from core.clock import Clock
from core.private import keys, log_private
from pipeline.config import SessionConfig

log = logging.getLogger(__name__)


def dtmf_text(digits: list[str]) -> str:
    """Keys pressed on the phone, as the caller's words for the LLM."""
    return f"The caller pressed {' '.join(digits)} on the phone keypad."


class Keypad:
    """Collects keys; `on_keys(digits, last_at)` is called once none came for dtmf_timeout_ms
    (`last_at`: the clock time of the last key, the caller's true end of turn)."""

    def __init__(self, config: SessionConfig, clock: Clock,
                 on_keys: Callable[[list[str], float], Awaitable[None]]) -> None:
        self.config = config
        self.clock = clock
        self.on_keys = on_keys
        self._digits: list[str] = []  # pressed, not yet answered
        self._last_at = 0.0
        self._timer: asyncio.Task[None] | None = None

    @property
    def collecting(self) -> bool:
        """Keys were pressed and their turn is not answered yet."""
        return self._timer is not None

    def press(self, digit: str) -> bool:
        """A key: collected (False: one too many for a turn, dropped)."""
        if len(self._digits) >= self.config.max_dtmf_digits:
            log_private(log, logging.WARNING, "more than %d keys in one turn; %r dropped", self.config.max_dtmf_digits,
                        keys(digit))
            return False
        self._digits.append(digit)
        self._last_at = self.clock.now()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.create_task(self._after(self.config.dtmf_timeout_ms / 1000))
        return True

    async def _after(self, wait: float) -> None:
        await self.clock.sleep(wait)
        digits, self._digits = self._digits, []
        self._timer = None
        if digits:
            await self.on_keys(digits, self._last_at)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
