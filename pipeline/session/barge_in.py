"""Barge-in: the caller's sound while the bot talks pauses its audio until it is known what it
is. A word that is not a backchannel (at the caller's first pause, or at the end of the sound)
interrupts the reply, a cough or an "mm-hmm" lets it go on, and speech that lasts
`session.barge_in_max_hold_ms` interrupts it in any case: the time is counted while the caller
speaks, not while they pause and their words are being recognized (a "yeah" whose transcript came
late on a busy machine used to interrupt the story it was meant to let go on). Speech that interrupts a reply within
`session.take_back_ms` of its first audio takes it back: the turn had been ended too soon (the
session acts on that: `Session._interrupt`)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable

from core.clock import Clock
from core.private import log_private, words
from pipeline.session.parts import PipelineConfig, Reply

log = logging.getLogger(__name__)
OWN_SHARE = 0.75  # this share of the words heard over the bot among its own reply's: its echo


def _plain_words(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum() or ch == " ")


NUMBERS = dict(enumerate(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                          "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
                          "nineteen", "twenty"]))


def _spoken(words: list[str]) -> list[str]:
    """Numbers as said: the recognizer writes "7" where the reply's text said "seven", and the other way."""
    return [NUMBERS.get(int(w), w) if w.isdigit() else w for w in words]


def _same(heard: str, said: str) -> bool:
    """The same word, or the start of it: an echo cut off (the hold pauses the bot mid-word) is heard as one."""
    return heard == said or (len(heard) >= 2 and said.startswith(heard))


def _in_order(heard: list[str], said: list[str]) -> int:
    """The most of the words `heard` found in their order in any stretch of `said` two words longer than them (an
    echo is a stretch of the bot's words, the recognizer missing or mishearing some; the same words scattered
    over a long reply are not)."""
    heard, said = _spoken(heard), _spoken(said)
    span = len(heard) + 2
    best = 0
    for start in range(max(1, len(said) - span + 1)):
        window = said[start:start + span]
        row = [0] * (len(window) + 1)  # the longest common subsequence, row by row
        for word in heard:
            diagonal = 0
            for j, other in enumerate(window, 1):
                diagonal, row[j] = row[j], diagonal + 1 if _same(word, other) else max(row[j], row[j - 1])
        best = max(best, row[-1])
    return best


@functools.cache
def _backchannel_forms(backchannels: tuple[str, ...]) -> tuple[frozenset[str], frozenset[str]]:
    """The configured backchannels as whole phrases without spaces ("mmhmm", "gotit") and as
    single words."""
    return (frozenset(_plain_words(p.replace("-", "")).replace(" ", "") for p in backchannels),
            frozenset(w for p in backchannels for w in _plain_words(p.replace("-", "")).split()))


class BargeIn:
    """Holds the reply's audio while the caller's sound is judged (`audio_open`, which the player
    waits on); `on_sustained` is called when the sound has lasted long enough to interrupt."""

    def __init__(self, config: PipelineConfig, clock: Clock, on_sustained: Callable[[], Awaitable[None]]) -> None:
        self.config = config
        self.clock = clock
        self.on_sustained = on_sustained
        self.audio_open = asyncio.Event()  # cleared while a sound over the bot is judged
        self.audio_open.set()
        self.pending: int | None = None  # the turn of that sound
        self.began: float | None = None  # when it began
        self._timer: asyncio.Task[None] | None = None
        self._left = 0.0  # the speech still to be heard before it interrupts in any case, in seconds
        self._armed_at = 0.0  # when the timer last started counting
        self.let_go: set[int] = set()  # turns over the bot heard as backchannels, until their final transcript
        # True: a reply the caller talks over within session.take_back_ms of its start is taken back
        self.takes_back = config.session.take_back_ms > 0

    def is_backchannel(self, text: str) -> bool:
        """Nothing recognized, or only backchannel words ("mm-hmm", "yeah", "okay"...)."""
        phrases, singles = _backchannel_forms(tuple(self.config.session.backchannels))
        said = _plain_words(text.replace("-", ""))
        return not said.split() or said.replace(" ", "") in phrases or all(w in singles for w in said.split())

    def is_own_echo(self, text: str, said: str) -> bool:
        """Most of the words recognized over the bot are a stretch of its reply (`said`), in their order: the
        caller's microphone heard the bot (a speakerphone, an echo the canceller has not yet learned), not the
        caller. Off with session.echo.own_words false."""
        if not self.config.session.echo.own_words:
            return False
        heard = _plain_words(text.replace("-", " ")).split()
        return bool(heard) and _in_order(heard, _plain_words(said.replace("-", " ")).split()) >= OWN_SHARE * len(heard)

    def lets_go(self, text: str, said: str) -> bool:
        """What the caller made over the bot does not interrupt it: a backchannel, or the bot's own echo."""
        if self.is_backchannel(text):
            return True
        if self.is_own_echo(text, said):
            log_private(log, logging.INFO, "%r over the bot is its own reply's words: its echo, not an "
                        "interruption", words(text))
            return True
        return False

    def hold(self, turn_id: int) -> None:
        """The caller makes a sound while the bot talks: pause the reply's audio until its words
        decide, or until it has lasted barge_in_max_hold_ms, which interrupts in any case."""
        self.audio_open.clear()
        if self.pending is None:
            self.began = self.clock.now()
        self.pending = turn_id
        cfg = self.config
        self._left = max(0, cfg.session.barge_in_max_hold_ms - cfg.endpointing.min_speech_ms) / 1000
        self._count(turn_id)

    def _count(self, turn_id: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed_at = self.clock.now()
        self._timer = asyncio.create_task(self._after(self._left, turn_id))

    def paused(self, turn_id: int) -> None:
        """The held sound paused (endpointing.early_final_ms of silence): its words are being
        recognized, and the time it may last stops counting until it goes on."""
        if self.pending == turn_id and self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._left = max(0.0, self._left - (self.clock.now() - self._armed_at))

    def resumed(self, turn_id: int) -> None:
        """The held sound goes on after a pause: the time it may last counts again."""
        if self.pending == turn_id and self._timer is None:
            self._count(turn_id)

    async def _after(self, wait: float, turn_id: int) -> None:
        await self.clock.sleep(wait)
        if self.pending == turn_id:
            await self.on_sustained()

    def speech_stopped(self, turn_id: int) -> None:
        """The held sound ended short: its words (or none) decide, not its length."""
        if self.pending == turn_id and self._timer is not None:
            self._timer.cancel()

    def let_go_of(self, turn_id: int, text: str) -> None:
        """What the caller said over the bot was only a backchannel: the reply goes on."""
        log_private(log, logging.INFO, "turn %d: %r while the bot talks: not an interruption", turn_id, words(text))
        self.release()

    def release(self) -> None:
        """Nothing is judged any more: the reply's audio (if any) goes on."""
        self.pending = None
        self.began = None
        timer, self._timer = self._timer, None
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()
        self.audio_open.set()

    def takes_back_reply(self, reply: Reply, began: float | None) -> bool:
        """Whether the caller's speech that began at `began` went on from a turn ended too soon: it
        came within session.take_back_ms of the reply's first audio (or before it), the reply
        answers the caller's own spoken words (not keys), and it made no tool call."""
        if not self.takes_back or began is None or not reply.in_history or not reply.user_text or reply.turn.dtmf:
            return False
        if reply.runs or reply.turn.tool_runs or reply.step > 1 or reply.fixed_text is not None:
            return False  # a dispatched call's result stays in the history
        first_audio = reply.turn.marks.get("first_audio_sent")
        return first_audio is None or began - first_audio <= self.config.session.take_back_ms / 1000
