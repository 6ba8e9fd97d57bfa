"""Replies: the reply line of a turn (LLM -> chunker -> TTS -> playout queue), started on the
caller's words (or preemptively at a pause, held until the turn is over), finished or cancelled,
with what the history keeps of it: every word when it completed, the words heard when it was cut."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Literal

import numpy as np

from core.clock import Clock
from core.errors import VoiceAgentError
from models.protocols import (
    ChatMessage,
)
from models.tool_calls import Tools
from pipeline.audio import resample
from pipeline.chunker import chunk_stage
from pipeline.events import (
    ErrorEvent,
    FunctionCallDelta,
    OutEvent,
    Phrase,
    ReplyAudio,
    ReplyEvent,
    ReplyFinished,
    ReplyRequest,
    ReplyText,
    ReplyToolCall,
    ReplyToolCallDelta,
    ResponseDone,
)
from pipeline.history import prompt_window
from pipeline.llm_stage import llm_stage
from pipeline.session.parts import Reply
from pipeline.session.state import SessionState
from pipeline.trim import trim_phrase
from pipeline.tts_stage import tts_stage
from pipeline.turns import Turn

log = logging.getLogger(__name__)
FINISHED_KEPT = 4  # finished replies whose heard words a client may still correct (Session.cut_heard)


async def _one(item: ReplyRequest) -> AsyncIterator[ReplyRequest]:
    yield item


async def _said(turn_id: int, text: str, clock: Clock) -> AsyncGenerator[ReplyEvent, None]:
    """A fixed sentence as if the LLM had written it (the filler)."""
    yield ReplyText(turn_id, text, clock.now())
    yield ReplyFinished(turn_id, None, clock.now())


class RepliesMixin(SessionState):
    def _tools(self, step: int) -> Tools | None:
        return self.toolbox.tools(step) if self.toolbox is not None else None

    def _prepare(self, messages: tuple[ChatMessage, ...]) -> None:
        """Give the LLM a head start: prefill the conversation so far (and the caller's words while
        they speak), so that at the final transcript only what changed is computed. Only between
        replies: a reply's generation owns the conversation's cache while it runs."""
        if self.preparing is not None and not self.preparing.done():
            self.preparing.cancel()
        self.preparing = asyncio.create_task(self._prepare_quietly(messages))

    async def _prepare_quietly(self, messages: tuple[ChatMessage, ...]) -> None:
        try:
            await self.conversation.prepare(messages, self._tools(1))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a head start that fails costs nothing but the head start
            log.warning("LLM head start failed: %s", exc)

    async def _start_reply(self, turn: Turn, text: str | None, preemptive: bool = False, step: int = 1,
                           fixed_text: str | None = None, instructions: str | None = None,
                           in_history: bool = True, context: tuple[ChatMessage, ...] | None = None,
                           tools: Tools | Literal["call"] | None = "call") -> None:
        """Start the reply line for the caller's words. A preemptive reply (at a pause, on the early
        transcript) runs the LLM and TTS at once but sends nothing until `_confirm`; its words join
        the history only then. `text` None: a reply to the same turn (a follow-up to tool results,
        step > 1, or the `fixed_text` filler). `instructions`: this reply's system prompt;
        `in_history` False: neither the words nor the reply join the history (an out-of-band reply).
        `context`: the messages it answers in place of the history's (a client's own input for one
        response); `tools`: its own tools in place of the call's at this step ("call")."""
        if self.closed:
            log.info("turn %d: not answered: the caller has gone", turn.turn_id)
            return
        self._release_reply()
        await self._cancel_reply("interrupted")
        user = ChatMessage("user", text or "")
        if text is not None and not preemptive and in_history:
            self._keep(turn.turn_id, user)
        if text is not None:
            self.answering = turn.turn_id
        self.generation += 1
        prompt = (*self._prompt(), user) if preemptive or (text is not None and not in_history) else self._prompt()
        if context is not None:
            prompt = (prompt[0], *context)
        if instructions is not None:
            prompt = (ChatMessage("system", instructions), *prompt[1:])
        reply = Reply(turn, prompt=prompt, user_text=text or "", preemptive=preemptive, step=step,
                      fixed_text=fixed_text, offset_samples=turn.sent_samples, speaks=self.speaks,
                      in_history=in_history, tools=self._tools(step) if tools == "call" else tools)
        if not preemptive:
            reply.confirmed.set()
        self.reply = reply
        generation = self.generation
        # The LLM serves the call whose audio is due soonest: first, this reply's first audio. A
        # preemptive reply is due nowhere until its turn is confirmed over (`_confirm`), so calls
        # with audio due go first.
        if preemptive:
            self.conversation.set_deadline(None)
        else:
            self._first_audio_due(reply)
        reply.tasks = [
            asyncio.create_task(self._produce(reply, generation)),
            asyncio.create_task(self._play(reply, generation)),
        ]

    async def _confirm(self, reply: Reply) -> None:
        """The turn a preemptive reply answers is over, with the same words: it joins the history
        and sends what it has (held text at once, audio paced as usual)."""
        log.info("turn %d: preemptive reply confirmed (%d words ready)", reply.turn.turn_id, reply.words)
        self._keep(reply.turn.turn_id, ChatMessage("user", reply.user_text))
        self._first_audio_due(reply)
        reply.flushing = True  # events that come while the held ones go out wait behind them, in order
        reply.confirmed.set()
        try:
            while reply.unsent:
                await self.outbound.send_event(reply.unsent.pop(0))
        finally:
            reply.flushing = False

    def _first_audio_due(self, reply: Reply) -> None:
        """The reply's first audio is due first_audio_budget_ms after the caller's end of speech;
        the LLM serves the call whose audio is due soonest."""
        turn = reply.turn
        ended = turn.ended_at if turn.ended_at is not None else turn.marks.get("speech_end", self.clock.now())
        reply.first_audio_due = ended + self.config.session.first_audio_budget_ms / 1000
        self.conversation.set_deadline(reply.first_audio_due)

    async def _send_for(self, reply: Reply, event: OutEvent) -> None:
        """Send a reply's event, or hold it while the reply is preemptive and unconfirmed: the
        caller learns nothing of a reply that may be dropped."""
        if reply.confirmed.is_set() and not reply.flushing:
            await self.outbound.send_event(event)
        else:
            reply.unsent.append(event)

    async def _discard_preemptive(self, reply: Reply, why: str) -> None:
        """Drop a preemptive reply nobody heard. The LLM's cache keeps the prompt, so a reply to the
        longer turn recomputes only what changed."""
        log.info("turn %d: preemptive reply dropped (%s) after %d words", reply.turn.turn_id, why, reply.words)
        await self._cancel_reply("interrupted", send=False)

    def _prompt(self) -> tuple[ChatMessage, ...]:
        cfg = self.config.session
        return prompt_window(self.history, cfg.max_history_messages,
                             min(cfg.history_drop_block, cfg.max_history_messages))

    async def _produce(self, reply: Reply, generation: int) -> None:
        """Run LLM -> chunker -> TTS for the turn and fill the playout queue; whatever happens, end
        the queue, so the turn ends (failed, with an error event, if a stage raised)."""
        cfg = self.config
        turn = reply.turn
        request = ReplyRequest(turn.turn_id, reply.prompt, self.clock.now(), reply.tools)
        budget = cfg.session.reply_budget if reply.speaks else None  # a caller cannot skim; a reader can
        text = (llm_stage(_one(request), self.conversation, cfg.sampling, self.clock, budget)
                if reply.fixed_text is None else _said(turn.turn_id, reply.fixed_text, self.clock))
        phrases = chunk_stage(text, cfg.chunker, self.clock)
        audio = (tts_stage(phrases, self.backends.tts, self.backends.tts_worker, self.output_rate, self.clock,
                           cfg.session.tts_trim)
                 if reply.speaks else phrases)
        try:
            async with contextlib.aclosing(audio):
                async for event in audio:
                    if generation != self.generation:
                        return
                    if isinstance(event, ReplyText):
                        turn.mark("llm_first_token", event.at)
                        reply.words += len(event.text.split())
                        await self._send_for(reply, event)
                    elif isinstance(event, Phrase):
                        turn.mark("first_phrase", event.at)
                        reply.ledger.add_phrase(event.index, event.text)
                    elif isinstance(event, ReplyAudio):
                        turn.mark("tts_first_audio", event.at)
                        reply.ledger.add_audio(event.phrase_index, len(event.samples))
                        await self._queue_audio(reply, event)
                    elif isinstance(event, ReplyToolCallDelta):  # the client sees its own calls as written
                        if self.toolbox is not None and self.toolbox.runs_on(event.name) == "client":
                            await self._send_for(reply, FunctionCallDelta(turn.turn_id, event.call_id, event.name,
                                                                          event.delta))
                    elif isinstance(event, ReplyToolCall):
                        await self._dispatch(reply, event.call, generation)
                    elif isinstance(event, ReplyFinished):
                        reply.stats = event.stats
                        if event.error:
                            reply.error = event.error
                            await self._apologize(reply)
        except Exception as exc:  # a stage failed mid-reply: the turn ends "failed", the call goes on
            if generation == self.generation:
                code = exc.code if isinstance(exc, VoiceAgentError) else "internal_error"
                detail = f"{type(exc).__name__}: {exc}"
                log.error("turn %d: the reply failed: %s", turn.turn_id, detail, exc_info=exc)
                reply.error = f"{code}: {detail}"  # the call's record keeps the detail; the caller gets
                told = str(exc) if isinstance(exc, VoiceAgentError) else "an unexpected error (in the server log)"
                await self._send_for(reply, ErrorEvent(code, f"the reply failed: {told}", turn.turn_id))
        finally:
            reply.produced.set()
            reply.playout.put_nowait(None)  # the player always learns that nothing more is coming
            # Close the line from its end back to the LLM, so an abandoned generation stops now.
            for stage in (audio, phrases, text):
                await stage.aclose()

    async def _apologize(self, reply: Reply) -> None:
        """The LLM failed: say a short apology, unless reply audio was already queued (never fall
        back once the turn has sent audio)."""
        code = (reply.error or "engine_error").split(":", 1)[0]
        await self._send_for(reply, ErrorEvent(code, f"the reply failed: {reply.error}", reply.turn.turn_id))
        if reply.ledger.produced or not reply.speaks:
            return
        tts, apology = self.backends.tts, self.config.session.apology
        chunks = await self.backends.tts_worker.run(lambda: list(tts.synthesize(apology)))
        resampled = (resample(np.asarray(chunk, dtype=np.float32), tts.sample_rate, self.output_rate)
                     for chunk in chunks)
        for audio in trim_phrase(resampled, self.output_rate, apology, self.config.session.tts_trim):
            reply.turn.mark("tts_first_audio", self.clock.now())
            await self._queue_audio(reply, ReplyAudio(reply.turn.turn_id, -1, audio, self.clock.now()))

    async def _finish(self, reply: Reply, status: str, send: bool = True) -> None:
        if reply.finished:
            return
        reply.finished = True
        reply.ended.set()
        if self.reply is reply:
            self.reply = None
        if self.reply is None:  # no reply runs: the LLM owes this call nothing
            self.conversation.set_deadline(None)
        if status in ("completed", "tool_calls") or not reply.speaks:  # a text reply: every word was sent
            text = reply.ledger.full_text()
        elif reply.played_samples is not None:  # what the client says it played
            text = reply.ledger.text_until(self._heard_samples(reply))
        else:  # no word from the client: what was sent, paced to playback, is the best estimate
            text = reply.ledger.sent_text()
        reply.kept_text = text
        if (text and not reply.runs and reply.fixed_text is None and reply.in_history
                and not reply.taken_back):  # calls': see _after_tools
            message = ChatMessage("assistant", text)
            self._keep(reply.turn.turn_id, message)
            if reply.speaks:  # a client may yet say it stopped playing it short (cut_heard)
                self.finished[reply.turn.turn_id] = (reply, message)
                while len(self.finished) > FINISHED_KEPT:
                    del self.finished[next(iter(self.finished))]
        if not reply.runs:
            self.turns.pop(reply.turn.turn_id, None)
        done = ResponseDone(
            reply.turn.turn_id, text, status, reply.turn.latency_ms(), reply.turn.voice_to_voice_ms(), reply.stats,
            reply.deadline_missed, reply.underruns, round(reply.underrun_s * 1000, 1),
            preemptive=reply.preemptive, discarded=self.discarded, discarded_words=self.discarded_words,
            user_text=reply.user_text, generated_text=reply.ledger.full_text(), sent_text=reply.ledger.sent_text(),
            error=reply.error, dtmf=reply.turn.dtmf, speech_end_at=reply.turn.marks.get("speech_end"),
            endpointing_ms=reply.turn.endpointing_ms(), taken_back=reply.taken_back,
            tool_calls=tuple(r.as_dict(reply.turn.marks.get("speech_end"))
                             for r in (reply.runs if reply.runs else reply.turn.tool_runs if reply.step > 1 else [])),
            filler=reply.fixed_text is not None,
        )
        self.discarded = self.discarded_words = 0
        log.info("turn %d %s: %s%s%s", done.turn_id, status, done.latency_ms,
                 " (first audio late)" if done.deadline_missed else "",
                 f" ({done.underruns} underruns, {done.underrun_ms:.0f} ms)" if done.underruns else "")
        if send:
            await self.outbound.send_event(done)
        if (status == "completed" and self.ending_turn == reply.turn.turn_id and reply.step > 1
                and reply.fixed_text is None and self.hang_up is not None):
            task = asyncio.create_task(self._hang_up_after(reply))
            self.tool_tasks.add(task)
            task.add_done_callback(self.tool_tasks.discard)
        # One record per turn: the reply that answers it (with every call the turn made); a reply
        # that made calls is recorded only if no answer follows (_after_tools), a filler never.
        if reply.runs:
            reply.turn.held_record = done
        elif reply.fixed_text is None:
            await self._record(done)

    def _keep(self, turn_id: int, message: ChatMessage, at: int | None = None) -> None:
        """`message` joins the history (at the end, or at `at`), as turn `turn_id`'s."""
        if at is None:
            self.history.append(message)
        else:
            self.history.insert(at, message)
        self.said.setdefault(turn_id, []).append(message)

    async def _record(self, done: ResponseDone) -> None:
        if self.on_turn is not None:
            result = self.on_turn(done)
            if result is not None:
                await result

    async def _cancel_reply(self, status: str, send: bool = True, keep: bool = False) -> None:
        """Stop the reply in progress. `send`: tell the caller (response.done); `keep`: without
        telling, still hand the turn to on_turn (its record) when some of its audio was sent. A
        preemptive reply not yet confirmed was never heard, whoever stops it (the caller went on,
        spoke again, pressed keys, hung up): it is only counted as discarded, never reported."""
        reply = self.reply
        if reply is None:
            return
        if not reply.confirmed.is_set():
            self.discarded += 1
            self.discarded_words += reply.words
            send = keep = False
        self.generation += 1
        self.reply = None
        for task in reply.tasks:
            task.cancel()
        await asyncio.gather(*reply.tasks, return_exceptions=True)
        # A cap set while the reply ran far ahead of playback must not outlive the reply.
        self.conversation.set_speculation_cap(None)
        if self.tap is not None and reply.ledger.sent_samples():
            self.tap.bot_stopped(self.clock.now())  # sent ahead of playback, then cut: never heard
        if send or (keep and reply.ledger.sent_samples()):
            await self._finish(reply, status, send=send)
        else:
            reply.finished = True
            reply.ended.set()
