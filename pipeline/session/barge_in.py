"""Barge-in: the caller's sound while the bot talks pauses its audio until it is known what it
is. A word that is not a backchannel (at the caller's first pause, or at the end of the sound)
interrupts the reply, a cough or an "mm-hmm" lets it go on, and speech that lasts
`session.barge_in_max_hold_ms` interrupts it in any case. Speech that interrupts a reply within
`session.take_back_ms` of its first audio take it back: the turn had been ended too soon, so the
reply and the words it answered leave the history, and those words join the caller's next ones."""

from __future__ import annotations

import asyncio
import functools
import logging

from pipeline.session.parts import Reply
from pipeline.session.state import SessionState

log = logging.getLogger(__name__)


def _plain_words(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum() or ch == " ")


@functools.cache
def _backchannel_forms(backchannels: tuple[str, ...]) -> tuple[frozenset[str], frozenset[str]]:
    """The configured backchannels as whole phrases without spaces ("mmhmm", "gotit") and as
    single words."""
    return (frozenset(_plain_words(p.replace("-", "")).replace(" ", "") for p in backchannels),
            frozenset(w for p in backchannels for w in _plain_words(p.replace("-", "")).split()))


class BargeInMixin(SessionState):
    def _let_go(self, turn_id: int, text: str) -> None:
        """What the caller said over the bot was only a backchannel: the reply goes on."""
        log.info("turn %d: %r while the bot talks: not an interruption", turn_id, text)
        self._release_reply()

    def _bot_talking(self) -> bool:
        reply = self.reply
        return reply is not None and reply.confirmed.is_set()

    def _is_backchannel(self, text: str) -> bool:
        """Nothing recognized, or only backchannel words ("mm-hmm", "yeah", "okay"...)."""
        phrases, singles = _backchannel_forms(tuple(self.config.session.backchannels))
        said = _plain_words(text.replace("-", ""))
        return not said.split() or said.replace(" ", "") in phrases or all(w in singles for w in said.split())

    def _hold_reply(self, turn_id: int) -> None:
        """The caller makes a sound while the bot talks: pause the reply's audio until its words
        decide (a word that is not a backchannel interrupts; nothing or a backchannel lets the
        reply go on), or until it has lasted barge_in_max_hold_ms, which interrupts in any case."""
        self.reply_audio_open.clear()
        if self.pending_barge is None:
            self.barge_began = self.clock.now()
        self.pending_barge = turn_id
        if self.barge_timer is not None:
            self.barge_timer.cancel()
        cfg = self.config
        wait = max(0, cfg.session.barge_in_max_hold_ms - cfg.endpointing.min_speech_ms) / 1000
        self.barge_timer = asyncio.create_task(self._barge_after(wait, turn_id))

    async def _barge_after(self, wait: float, turn_id: int) -> None:
        await self.clock.sleep(wait)
        if self.pending_barge == turn_id:
            await self._barge_in("sustained speech")

    async def _barge_in(self, why: str) -> None:
        reply, began = self.reply, self.barge_began
        self._release_reply()
        if reply is None:
            return
        if why != "a key press" and self._takes_back(reply, began):
            log.info("turn %d: the caller went on as the reply began: taken back, their words join the next turn",
                     reply.turn.turn_id)
            self._take_back(reply)  # before any await: the caller's next words must find the history as it will be
            await self._cancel_reply("interrupted")
        else:
            log.info("turn %d: barge-in (%s)", reply.turn.turn_id, why)
            await self._cancel_reply("interrupted")

    def _takes_back(self, reply: Reply, began: float | None) -> bool:
        """Whether the caller's speech that began at `began` went on from a turn ended too soon: it
        came within session.take_back_ms of the reply's first audio (or before it), the reply
        answers the caller's own spoken words (not keys), and it made no tool call."""
        if not self.takes_back or began is None or not reply.in_history or not reply.user_text or reply.turn.dtmf:
            return False
        if reply.runs or reply.turn.tool_runs or reply.step > 1 or reply.fixed_text is not None:
            return False  # a dispatched call's result stays in the history
        first_audio = reply.turn.marks.get("first_audio_sent")
        return first_audio is None or began - first_audio <= self.config.session.take_back_ms / 1000

    def _take_back(self, reply: Reply) -> None:
        """The reply (which the history will not keep when it finishes) and the words it answered
        leave the history; those words wait for the caller's next ones (`held`), to be answered as
        one turn."""
        reply.taken_back = True
        turn_id = reply.turn.turn_id
        said = [m.content for m in self.said.get(turn_id, []) if m.role == "user" and m.content]
        for message in self.said.pop(turn_id, []):
            self._replace_message(message, None)
        self.finished.pop(turn_id, None)
        self.held[:0] = said or [reply.user_text]

    def _release_reply(self) -> None:
        self.pending_barge = None
        self.barge_began = None
        timer, self.barge_timer = self.barge_timer, None
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()
        self.reply_audio_open.set()
