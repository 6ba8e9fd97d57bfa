"""Playout: a reply's audio sent no faster than real time (plus `session.output_lead_ms`), paced
by a virtual playhead, with underruns counted; and the client's playback reports, which say
what the caller has heard."""

from __future__ import annotations

import logging
from dataclasses import replace

from pipeline.audio import float_to_pcm16
from pipeline.events import (
    ReplyAudio,
)
from pipeline.session.parts import Reply
from pipeline.session.state import SessionState

log = logging.getLogger(__name__)


class PlayoutMixin(SessionState):
    def on_played(self, turn_id: int, played_ms: float, stopped: bool = False) -> None:
        """The client's playback clock (native `output_audio.played`, phone marks): how much of the
        turn's reply audio it has played. On barge-in the history keeps those words. `stopped`: the
        client stopped playing there (the Realtime API's truncate), so the report is exact rather
        than carried forward at playback speed."""
        played = int(played_ms * self.output_rate / 1000)
        turn = self.turns.get(turn_id)
        if turn is not None:
            turn.played_samples = max(turn.played_samples, played)
        if self.goodbye is not None and self.goodbye.turn_id == turn_id:
            self.goodbye.played_samples = max(self.goodbye.played_samples, played)
        reply = self.reply
        if reply is None or reply.turn.turn_id != turn_id:
            return
        played -= reply.offset_samples
        if stopped:
            reply.played_samples = min(reply.ledger.sent_samples(), max(0, played))
        else:
            reply.played_samples = min(reply.ledger.sent_samples(), max(played, reply.played_samples or 0))
        reply.played_at = self.clock.now()
        reply.playback_stopped = stopped

    def cut_heard(self, turn_id: int, played_ms: float) -> str | None:
        """The client stopped playing turn `turn_id`'s reply after `played_ms` (the Realtime API's
        truncate): a reply still going keeps exactly those words when it ends; one already sent whole
        has its words in the history cut to them now. The words heard, or None when the turn's reply
        is neither going nor among the last ones finished."""
        reply = self.reply
        if reply is not None and reply.turn.turn_id == turn_id:
            self.on_played(turn_id, played_ms, stopped=True)
            return None
        kept = self.finished.get(turn_id)
        if kept is None:
            return None
        done, message = kept
        heard = done.ledger.text_until(max(0, int(played_ms * self.output_rate / 1000) - done.offset_samples))
        kept_message = replace(message, content=heard) if heard else None
        if self._replace_message(message, kept_message):
            if kept_message is not None:
                self.finished[turn_id] = (done, kept_message)
            else:
                del self.finished[turn_id]
            log.info("turn %d: the client stopped its audio at %.0f ms; the history keeps %r", turn_id,
                     played_ms, heard)
        return heard

    def _heard_samples(self, reply: Reply) -> int:
        """The client's last report, carried forward at playback speed to now, within what was sent."""
        assert reply.played_samples is not None
        if reply.playback_stopped:
            return reply.played_samples
        since = max(0.0, self.clock.now() - reply.played_at)
        return min(reply.ledger.sent_samples(), reply.played_samples + int(since * self.output_rate))

    async def _queue_audio(self, reply: Reply, audio: ReplyAudio) -> None:
        """Queue audio for the player, first waiting while max_playout_s of it waits to be sent: the
        LLM and the TTS pause with it, instead of filling memory far ahead of the caller's ears."""
        bound = int(self.config.session.max_playout_s * self.output_rate)
        while reply.queued_samples >= bound:
            reply.room.clear()
            await reply.room.wait()
        reply.queued_samples += len(audio.samples)
        await reply.playout.put(audio)

    async def _play(self, reply: Reply, generation: int) -> None:
        """Send the playout queue's audio in fixed chunks, paced by a virtual playhead: where the
        caller's playback will be once everything sent so far has played. A chunk starts playing at
        max(playhead, now) (after a gap in the reply, playback starts again from now) and is sent
        no earlier than `output_lead_ms` before it starts, so "sent" never runs more than the lead
        (and a chunk) ahead of "heard", also after the pauses a slow LLM leaves between phrases."""
        cfg = self.config.session
        rate = self.output_rate
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
                held = not self.reply_audio_open.is_set()
                if held:  # the caller makes a sound: hold until it is known what (a pause, not an underrun)
                    await self.reply_audio_open.wait()
                now = self.clock.now()
                first = anchor is None
                gap = 0.0
                if anchor is None or anchor + placed / rate < now:  # the first chunk, or playback ran dry
                    if anchor is not None and not held:
                        gap = now - (anchor + placed / rate)
                    anchor, placed = now, 0
                begins = anchor + placed / rate
                if begins - lead > now:
                    await self.clock.sleep(begins - lead - now)
                if generation != self.generation:
                    return
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
                if generation == self.generation and (due is None or dry - cfg.refill_ms / 1000 > due):
                    due = dry - cfg.refill_ms / 1000
                    self.conversation.set_deadline(due)
                # ... and far ahead of playback, speculation buys nothing.
                ahead = dry - self.clock.now()
                if (ahead > cfg.speculation_relax_s) != relaxed:
                    relaxed = not relaxed
                    self.conversation.set_speculation_cap(0 if relaxed else None)
        if relaxed:
            self.conversation.set_speculation_cap(None)
        if generation == self.generation:
            await self._finish(reply, "failed" if reply.error else "tool_calls" if reply.runs else "completed")
