"""One caller's session: the whole flow of the voice pipeline, wired in one place.

    audio in -> vad_stage -> asr_stage                         (the input line, for the whole call)
    transcript -> llm_stage -> chunk_stage -> tts_stage -> playout -> audio out   (one reply line per turn)

The input line runs for the whole call. Each final transcript starts a reply: a producer task runs
the reply line and fills a playout queue; a player task sends its audio no faster than real time
(plus a small lead), so "sent" stays close to "heard". When the caller speaks during a reply
(barge-in) the reply's generation is bumped, both tasks are cancelled, the LLM and TTS work stops,
and the history keeps only the part of the reply that was sent.

Keys pressed on a phone (DTMF, `on_dtmf`) are a turn of their own: collected until
`session.dtmf_timeout_ms` passes without one, then answered like words ("The caller pressed 4 2 #
on the phone keypad."). Speech turns and keypad turns are numbered from one counter."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Literal

from models.protocols import (
    ChatMessage,
)
from models.tool_calls import Tools
from pipeline.asr_stage import asr_stage
from pipeline.endpointing import vad_stage
from pipeline.events import (
    AudioFrame,
    InputEvent,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    TranscriptEarly,
    TranscriptFinal,
    TranscriptPartial,
)
from pipeline.session.barge_in import BargeInMixin
from pipeline.session.keypad import KeypadMixin
from pipeline.session.parts import Reply
from pipeline.session.playout import PlayoutMixin
from pipeline.session.replies import RepliesMixin
from pipeline.session.tool_calls import ToolCallsMixin
from pipeline.transcript_trust import doubt
from pipeline.turn_judge import TurnJudge
from pipeline.turn_policy import TurnPolicy, bare_words
from pipeline.turns import Turn

log = logging.getLogger(__name__)


class Session(BargeInMixin, KeypadMixin, ToolCallsMixin, RepliesMixin, PlayoutMixin):
    """One caller's session: its input line (this module) and its parts (see the package doc)."""

    # -- the input line --------------------------------------------------------------------------
    async def run(self) -> None:
        """Run until `audio_in` yields None (the caller hung up), then stop any reply."""
        self._prepare(tuple(self.history))
        b = self.backends
        words = self.config.endpointing.text_signal and b.llm.weighs_words
        self.judge = TurnJudge(TurnPolicy(self.config.endpointing, words), b.turn, b.turn_worker, words)
        vad_stream = b.vad.new_stream()
        speech = vad_stage(self._frames(), vad_stream, b.vad_worker, self.config.endpointing, self.clock,
                           b.vad.sample_rate, b.vad.window_samples, self.judge, self.turn_ids)
        events = asr_stage(speech, self.backends.asr, self.backends.asr_worker, self.config.asr, self.clock,
                           self._bot_talking)
        try:
            async with contextlib.aclosing(events):
                async for event in events:
                    await self._on_input(event)
        finally:
            self.closed = True
            self._release_reply()
            if self.preparing is not None:
                self.preparing.cancel()
            if self.dtmf_timer is not None:
                self.dtmf_timer.cancel()
            if self.words_task is not None:
                self.words_task.cancel()
            for task in self.tool_tasks:
                task.cancel()
            for future in self.asked.values():
                future.cancel()
            # the caller is gone: a reply they heard part of is still kept (on_turn), not sent
            await self._cancel_reply("interrupted", send=False, keep=True)
            await self.conversation.aclose()

    async def _frames(self) -> AsyncIterator[AudioFrame]:
        while (frame := await self.audio_in.get()) is not None:
            self.audio_in_samples -= len(frame.samples)
            yield frame

    async def _on_input(self, event: InputEvent) -> None:
        if isinstance(event, SpeechStarted):
            self.last_started = max(self.last_started, event.turn_id)
            await self.outbound.send_event(event)
            reply = self.reply
            if reply is not None and reply.preemptive and not reply.confirmed.is_set():
                # a new turn before the last one's reply was confirmed: that reply answers words the
                # caller has since added to (they join this turn), and nobody heard it
                await self._discard_preemptive(reply, "the caller spoke again")
            elif reply is not None and self.speech_interrupts:
                self._hold_reply(event.turn_id)
            return
        if isinstance(event, SpeechStopped):
            if self.pending_barge == event.turn_id and self.barge_timer is not None:
                self.barge_timer.cancel()  # short: its words (or none) decide
            turn = self.turns.setdefault(event.turn_id, Turn(event.turn_id))
            turn.mark("speech_end", event.at)
            turn.ended_at = event.ended_at
            await self.outbound.send_event(event)
            return
        if isinstance(event, SpeechResumed):
            if (resumed := self.turns.get(event.turn_id)) is not None:
                resumed.endpointing = {}  # that pause did not end the turn
            reply = self.reply
            if reply is not None and reply.preemptive and not reply.confirmed.is_set():
                await self._discard_preemptive(reply, "the caller went on")
            elif reply is not None and event.turn_id in self.let_go and self.speech_interrupts:
                # after a backchannel the caller goes on: over the bot again, so hold it again
                self.let_go.discard(event.turn_id)
                self._hold_reply(event.turn_id)
            return
        if isinstance(event, TranscriptEarly):
            if self.pending_barge == event.turn_id:
                # the caller spoke over the bot and paused: what they said so far decides at once
                # (the end of their turn can be a second away when it does not sound finished)
                if self._is_backchannel(event.text):
                    self._let_go(event.turn_id, event.text)
                    self.let_go.add(event.turn_id)  # until its final transcript, or until it goes on
                    return
                await self._barge_in("a word")  # then, as at any pause, the words so far are weighed
            if (self.reply is None and self.pending_barge is None and event.turn_id == self.last_started
                    and event.text.strip()):
                if self.words_task is not None:
                    self.words_task.cancel()  # an earlier pause's, still weighing
                words = " ".join([*self.held, event.text.strip()]).strip()
                self.words_task = asyncio.create_task(self._weigh_words(event.turn_id, words, event))
            return
        if isinstance(event, TranscriptFinal) and event.turn_id in self.let_go:
            self.let_go.discard(event.turn_id)
            if self._is_backchannel(event.text):  # the backchannel let go at its pause, as it ended
                await self.outbound.send_event(event)
                self.turns.pop(event.turn_id, None)
                return
        await self.outbound.send_event(event)
        # An interim transcript over the bot does not decide: Whisper reads a word cut off mid-way as
        # another (whisper-tiny.en heard "Okay." cut at 300 ms as "Thank you."). The caller's first
        # pause (whole words, TranscriptEarly), the end of the speech, or its length decides.
        if isinstance(event, TranscriptFinal) and self.pending_barge == event.turn_id:
            if self._is_backchannel(event.text):
                self._let_go(event.turn_id, event.text)
                self.turns.pop(event.turn_id, None)
                return
            await self._barge_in("a word")
        if isinstance(event, TranscriptPartial) and self.reply is None and event.text.strip():
            self._prepare((*self._prompt(), ChatMessage("user", event.text.strip())))
        if isinstance(event, TranscriptFinal):
            turn = self.turns.setdefault(event.turn_id, Turn(event.turn_id))
            turn.mark("asr_final", event.at)
            text = event.text.strip()
            if self.last_started > event.turn_id:
                # The caller started talking again before this transcript was ready: never answer
                # over them. What they said joins the turn they went on with.
                if text:
                    log.info("turn %d: final transcript after the caller went on; joins turn %d",
                             event.turn_id, self.last_started)
                    self.held.append(text)
                self.turns.pop(event.turn_id, None)
            elif text or self.held:
                text = " ".join([*self.held, text]).strip()
                self.held.clear()
                reply = self.reply
                if reply is not None and reply.preemptive and not reply.confirmed.is_set():
                    if reply.turn.turn_id == event.turn_id and reply.user_text == text:
                        await self._confirm(reply)
                        return
                    await self._discard_preemptive(reply, "the final transcript differs")
                if self.on_words is not None:  # the client asks for each reply (Realtime create_response false)
                    self.turns.pop(event.turn_id, None)
                    self.on_words(event.turn_id, text)
                    return
                reply = self.reply
                if not self.speech_interrupts and reply is not None and reply.confirmed.is_set():
                    # the caller spoke over a reply that speech does not interrupt: answered after it
                    waiting = asyncio.create_task(self._answer_after(reply, turn, text))
                    self.tool_tasks.add(waiting)
                    waiting.add_done_callback(self.tool_tasks.discard)
                    return
                await self._start_reply(turn, text)
            else:
                self.turns.pop(event.turn_id, None)

    async def _answer_after(self, reply: Reply, turn: Turn, text: str) -> None:
        await reply.ended.wait()
        if self.reply is None or not self.reply.confirmed.is_set():
            await self._start_reply(turn, text)
        else:  # another reply began meanwhile (a client's response.create): this turn waits for it too
            await self._answer_after(self.reply, turn, text)

    async def _weigh_words(self, turn_id: int, words: str, early: TranscriptEarly) -> None:
        """The caller paused, and their words so far are transcribed: the language model's
        probability that their sentence ends there goes to the end-of-turn judge, unless the
        transcript cannot be trusted as evidence (pipeline/transcript_trust.py); then the reply
        starts preemptively on those words (from the cache that computation left: one prefill)."""
        probability, judge = None, self.judge
        untrusted = doubt(early.text, early.speech_s, early.avg_logprob, early.no_speech_prob)
        if untrusted is not None:
            log.info("turn %d: the transcript at the pause is no evidence of the turn's end: %s", turn_id, untrusted)
        elif judge is not None and judge.expects_words:
            try:
                asked = (*self._prompt(), ChatMessage("user", bare_words(words)))
                probability = await self.conversation.end_of_turn(asked, self._tools(1))
            except Exception as exc:  # the words are evidence; without them the sound decides
                log.warning("turn %d: the LLM's end-of-turn probability failed: %s", turn_id, exc)
            if probability is not None:
                log.debug("turn %d: P(end of sentence | %r) = %.3f", turn_id, words, probability)
            judge.words(turn_id, probability, words, early.avg_logprob)
        # the pause still goes on (a judge that gathers nothing does not follow pauses)
        pausing = judge is None or not judge.active or judge.turn_id == turn_id
        turn = self.turns.get(turn_id)
        if turn is None and pausing:
            turn = self.turns[turn_id] = Turn(turn_id)
        if turn is not None and (pausing or "speech_end" in turn.marks):  # the decision's marks, for its record
            turn.endpointing = {"pause_heard": early.paused_at if early.paused_at is not None else early.at,
                                "transcript_at_pause": early.at}
            if probability is not None:
                turn.endpointing["words_weighed"] = self.clock.now()
        turn = turn or Turn(turn_id)
        if not pausing and "speech_end" not in turn.marks:
            return  # the caller went on while the words were weighed: the next pause starts again
        if (self.config.session.preemptive and self.on_words is None and self.reply is None
                and self.pending_barge is None
                and turn_id == self.last_started and not self.closed and "asr_final" not in turn.marks):
            self.turns[turn_id] = turn
            await self._start_reply(turn, words, preemptive=True)

    # -- turns a client asks for (the Realtime API's conversation.item.create and response.create) --
    def set_instructions(self, text: str) -> None:
        """The system prompt of the replies from now on."""
        self.history[0] = ChatMessage("system", text)

    async def on_text(self, texts: Sequence[str] = (), instructions: str | None = None, in_history: bool = True,
                      context: tuple[ChatMessage, ...] | None = None,
                      tools: Tools | Literal["call"] | None = "call") -> int:
        """Messages the client typed (each its own in the history), or none: a reply to the
        conversation as it stands. Answered like a spoken turn whose transcript is ready at once
        (its `speech_end` is now); it stops the reply in progress. `instructions`: this reply's
        system prompt; `in_history` False: an out-of-band reply, kept out of the history (with its
        messages); `context`: the messages it answers in place of the history's; `tools`: its own.
        Returns the turn's id (0: the caller has gone)."""
        if self.closed:
            return 0
        turn = Turn(next(self.turn_ids))
        self.last_started = max(self.last_started, turn.turn_id)
        self.answering = turn.turn_id
        now = self.clock.now()
        turn.mark("speech_end", now)
        turn.mark("asr_final", now)
        turn.ended_at = now
        self.turns[turn.turn_id] = turn
        reply = self.reply
        if reply is not None and reply.preemptive and not reply.confirmed.is_set():
            await self._discard_preemptive(reply, "the client asked for a reply")  # nobody heard it
        said = [t for t in texts if t]
        if in_history and len(said) > 1:
            # the reply in progress ends first, so that its words come before these in the history
            self._release_reply()
            await self._cancel_reply("interrupted")
            for earlier in said[:-1]:
                self._keep(turn.turn_id, ChatMessage("user", earlier))
        text = (said[-1] if in_history else " ".join(said)) if said else None
        await self._start_reply(turn, text, instructions=instructions, in_history=in_history, context=context,
                                tools=tools)
        return turn.turn_id

    def add_message(self, message: ChatMessage) -> int:
        """A message the client adds to the conversation as it is (an assistant's earlier words, a
        system note), answered by nothing; kept under a turn id of its own, which it returns."""
        turn_id = next(self.turn_ids)
        self._keep(turn_id, message)
        return turn_id

    def forget(self, turn_id: int, role: str, text: str | None = None) -> bool:
        """The client deletes a message of turn `turn_id` from the conversation (the Realtime API's
        conversation.item.delete): the turn's message of `role` whose words are `text` (None: its
        first of that role) leaves the history; an assistant message that made calls keeps them and
        loses its words. False when there is no such message."""
        for message in self.said.get(turn_id, []):
            if message.role == role and (text is None or message.content == text):
                kept = replace(message, content="") if message.tool_calls else None
                return self._replace_message(message, kept)
        return False

    def forget_call(self, call_id: str) -> bool:
        """The client deletes a function call or its output: both leave the history (a chat template
        takes neither without the other), and the message that made the call loses it."""
        found = False
        for turn_messages in list(self.said.values()):
            for message in list(turn_messages):
                if message.role == "tool" and message.tool_call_id == call_id:
                    found = self._replace_message(message, None) or found
                elif any(c.call_id == call_id for c in message.tool_calls):
                    calls = tuple(c for c in message.tool_calls if c.call_id != call_id)
                    kept = replace(message, tool_calls=calls) if calls or message.content else None
                    found = self._replace_message(message, kept) or found
        return found

    def _replace_message(self, old: ChatMessage, new: ChatMessage | None) -> bool:
        """`old` (this very message) is replaced in the history by `new`, or removed (None)."""
        for i in range(len(self.history) - 1, 0, -1):
            if self.history[i] is old:
                if new is None:
                    del self.history[i]
                else:
                    self.history[i] = new
                break
        else:
            return False
        for turn_messages in self.said.values():
            for j, message in enumerate(turn_messages):
                if message is old:
                    if new is None:
                        del turn_messages[j]
                    else:
                        turn_messages[j] = new
                    return True
        return True

    async def cancel_reply(self) -> bool:
        """The client stops the reply in progress (it ends `interrupted`, keeping what was heard);
        False when none is in progress."""
        if self.reply is None or not self.reply.confirmed.is_set():
            return False
        await self._barge_in("the client cancelled it")
        return True
