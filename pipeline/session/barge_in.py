"""Barge-in: the caller's sound while the bot talks pauses its audio until it is known what it
is. A word that is not a backchannel (at the caller's first pause, or at the end of the sound)
interrupts the reply, a cough or an "mm-hmm" lets it go on, and speech that lasts
`session.barge_in_max_hold_ms` interrupts it in any case."""

from __future__ import annotations

import asyncio
import functools
import logging

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
        reply = self.reply
        self._release_reply()
        if reply is not None:
            log.info("turn %d: barge-in (%s)", reply.turn.turn_id, why)
            await self._cancel_reply("interrupted")

    def _release_reply(self) -> None:
        self.pending_barge = None
        timer, self.barge_timer = self.barge_timer, None
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()
        self.reply_audio_open.set()
