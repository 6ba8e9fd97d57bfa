"""Keys pressed on a phone (DTMF): a turn of their own, collected until `session.dtmf_timeout_ms`
passes without one, then answered like words ("The caller pressed 4 2 # on the phone keypad.").
A key pressed while the bot talks interrupts it, like a word."""

from __future__ import annotations

import asyncio
import logging

from pipeline.events import (
    TranscriptFinal,
)
from pipeline.session.state import SessionState
from pipeline.turns import Turn

log = logging.getLogger(__name__)


def dtmf_text(digits: list[str]) -> str:
    """Keys pressed on the phone, as the caller's words for the LLM."""
    return f"The caller pressed {' '.join(digits)} on the phone keypad."


class KeypadMixin(SessionState):
    async def on_dtmf(self, digit: str) -> None:
        """A key pressed on the caller's phone. Keys interrupt the bot like words; they are collected
        until none comes for `session.dtmf_timeout_ms`, then answered as the caller's turn."""
        cfg = self.config.session
        if self.closed:
            return
        if len(self.digits) >= cfg.max_dtmf_digits:
            log.warning("more than %d keys in one turn; %r dropped", cfg.max_dtmf_digits, digit)
            return
        self.digits.append(digit)
        self.last_digit_at = self.clock.now()
        if self.dtmf_timer is not None:
            self.dtmf_timer.cancel()
        self.dtmf_timer = asyncio.create_task(self._digits_after(cfg.dtmf_timeout_ms / 1000))
        if self._bot_talking() or self.pending_barge is not None:
            await self._barge_in("a key press")

    async def _digits_after(self, wait: float) -> None:
        await self.clock.sleep(wait)
        digits, self.digits = self.digits, []
        self.dtmf_timer = None
        if not digits:
            return
        # A turn like a spoken one: it ends (speech_end) when the keys are judged complete, and its
        # "transcript" is ready at once; the caller's true end is the last key press.
        turn = Turn(next(self.turn_ids))
        self.last_started = max(self.last_started, turn.turn_id)
        now = self.clock.now()
        turn.mark("speech_end", now)
        turn.mark("asr_final", now)
        turn.ended_at = self.last_digit_at
        turn.dtmf = " ".join(digits)
        self.turns[turn.turn_id] = turn
        text = dtmf_text(digits)
        log.info("turn %d: keys %s", turn.turn_id, " ".join(digits))
        reply = self.reply
        if reply is not None and reply.preemptive and not reply.confirmed.is_set():
            await self._discard_preemptive(reply, "the caller pressed keys")  # nobody heard it
        await self.outbound.send_event(TranscriptFinal(turn.turn_id, text, now))
        await self._start_reply(turn, text)  # not if the caller hung up meanwhile (_start_reply checks)
