"""turn_detection's idle_timeout_ms: when the caller stays silent for that long after a reply has
played, the server answers anyway (input_audio_buffer.timeout_triggered, then a response), as a
phone agent asks "are you still there?"."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from core.clock import Clock

log = logging.getLogger(__name__)


class IdleTimer:
    """Armed when a reply is done (for the audio still to play, plus the timeout), disarmed by the
    caller's speech or the next response; `fire` runs when it runs out."""

    def __init__(self, clock: Clock, fire: Callable[[], Awaitable[None]]) -> None:
        self.clock = clock
        self.fire = fire
        self.timeout_s: float | None = None  # the session's idle_timeout_ms (None: off)
        self.task: asyncio.Task[None] | None = None

    def arm(self, playing_s: float) -> None:
        self.disarm()
        if self.timeout_s is not None:
            self.task = asyncio.create_task(self._wait(playing_s + self.timeout_s))

    def disarm(self) -> None:
        task, self.task = self.task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def _wait(self, seconds: float) -> None:
        await self.clock.sleep(seconds)
        self.task = None  # running out: what fire does (a response) may arm the next one
        try:
            await self.fire()
        except Exception as exc:  # the call goes on without this nudge
            log.warning("the idle timeout's response failed: %s", exc)

    async def close(self) -> None:
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
