"""Playout: a reply's audio sent no faster than real time (plus `session.output_lead_ms`), paced
by a virtual playhead, with underruns counted, and the LLM's deadlines set from what is left to
play (the token-rate budget)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from core.clock import Clock
from models.protocols import Conversation
from pipeline.audio import float_to_pcm16
from pipeline.config import SessionConfig
from pipeline.events import ReplyAudio
from pipeline.session.parts import AudioTap, Outbound, Reply

log = logging.getLogger(__name__)


class Player:
    """Plays replies to `outbound` at `rate`; waits on `audio_open` (the barge-in's hold)."""

    def __init__(self, config: SessionConfig, clock: Clock, rate: int, outbound: Outbound,
                 conversation: Conversation, audio_open: asyncio.Event, tap: AudioTap | None = None) -> None:
        self.config = config
        self.clock = clock
        self.rate = rate
        self.outbound = outbound
        self.conversation = conversation
        self.audio_open = audio_open
        self.tap = tap

    async def queue(self, reply: Reply, audio: ReplyAudio) -> None:
        """Queue audio for the player, first waiting while max_playout_s of it waits to be sent: the
        LLM and the TTS pause with it, instead of filling memory far ahead of the caller's ears."""
        bound = int(self.config.max_playout_s * self.rate)
        while reply.queued_samples >= bound:
            reply.room.clear()
            await reply.room.wait()
        reply.queued_samples += len(audio.samples)
        await reply.playout.put(audio)

    async def play(self, reply: Reply, current: Callable[[], bool]) -> bool:
        """Send the playout queue's audio in fixed chunks, paced by a virtual playhead: where the
        caller's playback will be once everything sent so far has played. A chunk starts playing at
        max(playhead, now) (after a gap in the reply, playback starts again from now) and is sent
        no earlier than `output_lead_ms` before it starts, so "sent" never runs more than the lead
        (and a chunk) ahead of "heard", also after the pauses a slow LLM leaves between phrases.
        `current()`: the reply is still the session's (False: it was replaced, stop). True when it
        played to its end as the session's reply."""
        cfg = self.config
        rate = self.rate
        lead = cfg.output_lead_ms / 1000
        chunk = max(1, rate * cfg.output_chunk_ms // 1000)
        bound = int(cfg.max_playout_s * rate)
        # The playhead is `anchor + placed / rate`: the clock time a stretch of playback began and
        # the samples placed in it since, counted exactly (no float sums that drift with the clock's
        # magnitude). A new stretch begins when playback ran dry.
        anchor: float | None = None
        placed = 0
        due: float | None = None  # the LLM's deadline for this reply's next tokens, never moved earlier
        relaxed = False
        tolerance = 0.02  # a later chunk than this, once the playhead ran out, is an underrun
        while (item := await reply.playout.get()) is not None:
            for start in range(0, len(item.samples), chunk):
                piece = item.samples[start:start + chunk]
                if not reply.confirmed.is_set():  # a preemptive reply waits for the end of the turn
                    await reply.confirmed.wait()
                held = not self.audio_open.is_set()
                if held:  # the caller makes a sound: hold until it is known what (a pause, not an underrun)
                    await self.audio_open.wait()
                now = self.clock.now()
                first = anchor is None
                gap = 0.0
                if anchor is None or anchor + placed / rate < now:  # the first chunk, or playback ran dry
                    if anchor is not None and not held:
                        gap = now - (anchor + placed / rate)
                    anchor, placed = now, 0
                    reply.stretch_began, reply.stretch_from = now, reply.ledger.sent_samples()
                begins = anchor + placed / rate
                if begins - lead > now:
                    await self.clock.sleep(begins - lead - now)
                if not current():
                    return False
                await self.outbound.send_audio(float_to_pcm16(piece), reply.turn.turn_id)
                if self.tap is not None:
                    self.tap.bot(piece, rate, begins)
                if first:
                    sent = self.clock.now()
                    reply.turn.mark("first_audio_sent", sent)
                    if reply.step > 1 and reply.fixed_text is None:
                        reply.turn.mark("answer_first_audio_sent", sent)
                    reply.deadline_missed = reply.first_audio_due is not None and sent > reply.first_audio_due
                if gap > tolerance:  # the caller's playback ran dry before this chunk was ready
                    reply.underruns += 1
                    reply.underrun_s += gap
                placed += len(piece)
                reply.ledger.add_sent(item.phrase_index, len(piece))
                reply.turn.sent_samples += len(piece)
                reply.queued_samples -= len(piece)
                if reply.queued_samples < bound:
                    reply.room.set()
                # The token-rate budget: the audio made so far runs out at `dry`; the LLM's next
                # tokens are due earlier by the time the next phrase takes to write and synthesize
                # (other calls' first, if theirs are due sooner). Audio only ever adds to what is
                # left to play, so the deadline only moves later: kept so by max(), not by rounding.
                dry = anchor + (placed + reply.queued_samples) / rate
                if current() and (due is None or dry - cfg.refill_ms / 1000 > due):
                    due = dry - cfg.refill_ms / 1000
                    self.conversation.set_deadline(due)
                # ... and far ahead of playback, speculation buys nothing.
                ahead = dry - self.clock.now()
                if (ahead > cfg.speculation_relax_s) != relaxed:
                    relaxed = not relaxed
                    self.conversation.set_speculation_cap(0 if relaxed else None)
        if relaxed:
            self.conversation.set_speculation_cap(None)
        return current()
