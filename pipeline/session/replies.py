"""Replies: the reply line of a turn (LLM -> chunker -> TTS -> playout queue), started on the
caller's words (or preemptively at a pause, held until the turn is over), finished or cancelled,
with what the history keeps of it: every word when it completed, the words heard when it was cut."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Literal, Protocol

import numpy as np

from core.clock import Clock
from core.errors import VoiceAgentError, error_code, plain_message
from models.llm.tool_calls import ToolCall, Tools
from models.protocols import ChatMessage, Conversation
from pipeline import honesty
from pipeline.audio import resample
from pipeline.chunker import chunk_stage
from pipeline.events import (
    ErrorEvent,
    FunctionCallDelta,
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
from pipeline.llm_stage import llm_stage
from pipeline.session.barge_in import BargeIn
from pipeline.session.history import History
from pipeline.session.parts import Backends, Outbound, PipelineConfig, Reply
from pipeline.session.playout import Player
from pipeline.session.turn_book import TurnBook
from pipeline.tools import ToolBox
from pipeline.trim import trim_phrase
from pipeline.tts_stage import tts_stage
from pipeline.turns import Turn

log = logging.getLogger(__name__)


async def _said(turn_id: int, text: str, clock: Clock) -> AsyncGenerator[ReplyEvent, None]:
    """A fixed sentence as if the LLM had written it (the filler)."""
    yield ReplyText(turn_id, text, clock.now())
    yield ReplyFinished(turn_id, None, clock.now())


class ReplyEvents(Protocol):
    """What a reply tells the rest of the call (the session routes it to its tool-calls part)."""

    async def tool_call(self, reply: Reply, call: ToolCall, generation: int) -> None:
        """The reply made a call (dispatched once the reply is known to be heard)."""
        ...

    def reply_done(self, reply: Reply, status: str) -> None:
        """The reply ended with `status` and was reported."""
        ...

    async def record(self, done: ResponseDone) -> None:
        """The turn's record (one per turn: the reply that answers it)."""
        ...


class Replies:
    """The session's reply in flight (`current`, at most one) and the ones before it."""

    def __init__(self, backends: Backends, config: PipelineConfig, clock: Clock, outbound: Outbound, rate: int,
                 conversation: Conversation, history: History, book: TurnBook, barge: BargeIn, player: Player,
                 events: ReplyEvents, toolbox: ToolBox | None) -> None:
        self.backends = backends
        self.config = config
        self.clock = clock
        self.outbound = outbound
        self.rate = rate
        self.conversation = conversation
        self.history = history
        self.book = book
        self.barge = barge
        self.player = player
        self.events = events
        self.toolbox = toolbox
        self.current: Reply | None = None
        self.generation = 0  # bumped by every barge-in and every new reply: a reply's tasks check it
        self.speaks = True  # replies are spoken; False: text only (no TTS), for the replies started from now
        self._preparing: asyncio.Task[None] | None = None  # the LLM's head start on the next prompt
        self.discarded = 0  # preemptive replies dropped since the last reply was sent
        self.discarded_words = 0

    def talking(self) -> bool:
        """A reply is going that the caller may hear (not a preemptive one still held)."""
        return self.current is not None and self.current.confirmed.is_set()

    def tools(self, step: int) -> Tools | None:
        return self.toolbox.tools(step) if self.toolbox is not None else None

    def prepare(self, messages: tuple[ChatMessage, ...], step: int = 1, open_last: bool = False) -> None:
        """Give the LLM a head start: prefill the conversation so far (and the caller's words while
        they speak), so that at the final transcript only what changed is computed; with
        `open_last`, up to where the last message's content begins (a tool's result, while the tool
        runs), for the reply at `step`. Only between replies: a reply's generation owns the
        conversation's cache while it runs (the engine skips a head start that finds one going)."""
        if self._preparing is not None and not self._preparing.done():
            self._preparing.cancel()
        self._preparing = asyncio.create_task(self._prepare_quietly(messages, step, open_last))

    async def _prepare_quietly(self, messages: tuple[ChatMessage, ...], step: int, open_last: bool) -> None:
        try:
            await self.conversation.prepare(messages, self.tools(step), open_last=open_last)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a head start that fails costs nothing but the head start
            log.warning("LLM head start failed: %s", exc)

    def stop_preparing(self) -> None:
        if self._preparing is not None:
            self._preparing.cancel()

    async def start(self, turn: Turn, text: str | None, preemptive: bool = False, step: int = 1,
                    fixed_text: str | None = None, instructions: str | None = None,
                    in_history: bool = True, context: tuple[ChatMessage, ...] | None = None,
                    tools: Tools | Literal["call"] | None = "call", said_first: bool = False) -> None:
        """Start the reply line for the caller's words. A preemptive reply (at a pause, on the early
        transcript) runs the LLM and TTS at once but sends nothing until `confirm`; its words join
        the history only then. `text` None: a reply to the same turn (a follow-up to tool results,
        step > 1, or the `fixed_text` filler). `instructions`: this reply's system prompt;
        `in_history` False: neither the words nor the reply join the history (an out-of-band reply).
        `context`: the messages it answers in place of the history's (a client's own input for one
        response); `tools`: its own tools in place of the call's at this step ("call"). `said_first`: the
        `fixed_text` is the call's first message, kept in the history as far as it was heard."""
        if self.book.closed:
            log.info("turn %d: not answered: the caller has gone", turn.turn_id)
            return
        self.barge.release()
        await self.cancel("interrupted")
        user = ChatMessage("user", text or "")
        if text is not None and not preemptive and in_history:
            self.history.keep(turn.turn_id, user)
        if text is not None:
            self.book.answering = turn.turn_id
        self.generation += 1
        prompt = self.history.prompt()
        if preemptive or (text is not None and not in_history):
            prompt = (*prompt, user)
        if context is not None:
            prompt = (prompt[0], *context)
        if instructions is not None:
            prompt = (ChatMessage("system", instructions), *prompt[1:])
        reply = Reply(turn, prompt=prompt, user_text=text or "", preemptive=preemptive, step=step,
                      fixed_text=fixed_text, offset_samples=turn.sent_samples, speaks=self.speaks,
                      in_history=in_history, tools=self.tools(step) if tools == "call" else tools,
                      said_first=said_first)
        if not preemptive:
            reply.confirmed.set()
        self.current = reply
        generation = self.generation
        # The LLM serves the call whose audio is due soonest: first, this reply's first audio. A
        # preemptive reply is due nowhere until its turn is confirmed over (`confirm`), so calls
        # with audio due go first.
        if preemptive:
            self.conversation.set_deadline(None)
        else:
            self._first_audio_due(reply)
        reply.tasks = [
            asyncio.create_task(self._produce(reply, generation)),
            asyncio.create_task(self._play(reply, generation)),
        ]

    async def confirm(self, reply: Reply) -> None:
        """The turn a preemptive reply answers is over, with the same words: it joins the history
        and sends what it has (held text at once, audio paced as usual)."""
        log.info("turn %d: preemptive reply confirmed (%d words ready)", reply.turn.turn_id, reply.words)
        self.history.keep(reply.turn.turn_id, ChatMessage("user", reply.user_text))
        self._first_audio_due(reply)
        await reply.confirm(self.outbound)

    def _first_audio_due(self, reply: Reply) -> None:
        """The reply's first audio is due first_audio_budget_ms after the caller's end of speech;
        the LLM serves the call whose audio is due soonest."""
        turn = reply.turn
        ended = turn.ended_at if turn.ended_at is not None else turn.marks.get("speech_end", self.clock.now())
        reply.first_audio_due = ended + self.config.session.first_audio_budget_ms / 1000
        self.conversation.set_deadline(reply.first_audio_due)

    async def discard_preemptive(self, reply: Reply, why: str) -> None:
        """Drop a preemptive reply nobody heard. The LLM's cache keeps the prompt, so a reply to the
        longer turn recomputes only what changed."""
        log.info("turn %d: preemptive reply dropped (%s) after %d words", reply.turn.turn_id, why, reply.words)
        await self.cancel("interrupted", send=False)

    async def discard_unconfirmed(self, why: str) -> None:
        """The preemptive reply in flight, if one is still held, is dropped (nobody heard it)."""
        reply = self.current
        if reply is not None and reply.preemptive and not reply.confirmed.is_set():
            await self.discard_preemptive(reply, why)

    async def _play(self, reply: Reply, generation: int) -> None:
        if await self.player.play(reply, lambda: generation == self.generation):
            await self.finish(reply, "failed" if reply.error else "tool_calls" if reply.runs else "completed")

    async def _produce(self, reply: Reply, generation: int) -> None:
        """Run LLM -> chunker -> TTS for the turn and fill the playout queue; whatever happens, end
        the queue, so the turn ends (failed, with an error event, if a stage raised)."""
        cfg = self.config
        turn = reply.turn
        budget = cfg.session.reply_budget if reply.speaks else None  # a caller cannot skim; a reader can
        # a call begun before any word is acknowledged aloud, once a turn (tools.acknowledgement)
        ack = self.toolbox.acknowledgement if self.toolbox is not None and reply.speaks and reply.step == 1 else None
        text = (llm_stage(self._request(reply), self.conversation, cfg.sampling, self.clock, budget, ack)
                if reply.fixed_text is None else _said(turn.turn_id, reply.fixed_text, self.clock))
        phrases = chunk_stage(text, cfg.chunker, self.clock)
        audio = (tts_stage(phrases, self.backends.tts, self.backends.tts_worker, self.rate, self.clock,
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
                        await reply.send(self.outbound, event)
                    elif isinstance(event, Phrase):
                        turn.mark("first_phrase", event.at)
                        reply.ledger.add_phrase(event.index, event.text)
                    elif isinstance(event, ReplyAudio):
                        turn.mark("tts_first_audio", event.at)
                        reply.ledger.add_audio(event.phrase_index, len(event.samples))
                        await self.player.queue(reply, event)
                    elif isinstance(event, ReplyToolCallDelta):  # the client sees its own calls as written
                        if self.toolbox is not None and self.toolbox.runs_on(event.name) == "client":
                            await reply.send(self.outbound, FunctionCallDelta(turn.turn_id, event.call_id, event.name,
                                                                          event.delta))
                    elif isinstance(event, ReplyToolCall):
                        await self.events.tool_call(reply, event.call, generation)
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
                # the code and a plain message (the detail may show the server's insides: URLs, paths)
                await reply.send(self.outbound, ErrorEvent(code, f"the reply failed: {plain_message(code)}",
                                                           turn.turn_id))
        finally:
            reply.produced.set()
            reply.playout.put_nowait(None)  # the player always learns that nothing more is coming
            # Close the line from its end back to the LLM, so an abandoned generation stops now.
            for stage in (audio, phrases, text):
                await stage.aclose()

    async def _request(self, reply: Reply) -> AsyncIterator[ReplyRequest]:
        """The reply's one request to the LLM, its prompt through the honesty gate first (inside the reply's
        line, so a reply stopped while the gate is asked ends like any other)."""
        prompt = await self._honest(reply)
        yield ReplyRequest(reply.turn.turn_id, prompt, self.clock.now(), reply.tools)

    async def _honest(self, reply: Reply) -> tuple[ChatMessage, ...]:
        """The reply's prompt, ending in the words it must begin with where the caller asks for something
        the agent cannot check or do (pipeline/honesty.py): a reply to the caller's spoken words, without tools
        (keys pressed answer the agent's own menu: "The caller pressed 4 2 #" was judged a look-up at 0.74)."""
        config = self.config.session.honesty
        judge = self.backends.tools_llm or self.backends.llm
        prompt = reply.prompt
        if (not config.enabled or reply.step != 1 or not reply.user_text.strip() or reply.tools is not None
                or reply.turn.dtmf or not isinstance(judge, honesty.Asks) or not prompt or prompt[-1].role != "user"):
            return prompt
        try:
            checked, chance = await honesty.checked(judge, config, prompt, self.config.session.system_prompt)
        except VoiceAgentError as exc:  # the reply goes on without it
            log.warning("turn %d: the honesty gate failed, so the reply is not checked: %s", reply.turn.turn_id, exc)
            return prompt
        reply.honesty = round(chance, 3)
        if checked is not prompt:
            log.info("turn %d: the caller asks for what the agent cannot check or do (chance %.2f, session.honesty."
                     "threshold %.2f): the reply begins %r", reply.turn.turn_id, chance, config.threshold,
                     config.opening)
        return checked

    async def _apologize(self, reply: Reply) -> None:
        """The LLM failed: say a short apology, unless reply audio was already queued (never fall
        back once the turn has sent audio)."""
        code = error_code(reply.error, "engine_error")  # the detail stays in the record (reply.error) and the log
        await reply.send(self.outbound, ErrorEvent(code, f"the reply failed: {plain_message(code)}",
                                                   reply.turn.turn_id))
        ack = self.toolbox.config.acknowledgement.strip() if self.toolbox is not None else ""
        acknowledged_only = bool(ack) and not reply.runs and reply.ledger.full_text().strip() == ack
        if (reply.ledger.produced and not acknowledged_only) or not reply.speaks:
            return
        tts, apology = self.backends.tts, self.config.session.apology
        chunks = await self.backends.tts_worker.run(lambda: list(tts.synthesize(apology)))
        resampled = (resample(np.asarray(chunk, dtype=np.float32), tts.sample_rate, self.rate)
                     for chunk in chunks)
        for audio in trim_phrase(resampled, self.rate, apology, self.config.session.tts_trim):
            reply.turn.mark("tts_first_audio", self.clock.now())
            await self.player.queue(reply, ReplyAudio(reply.turn.turn_id, -1, audio, self.clock.now()))

    async def finish(self, reply: Reply, status: str, send: bool = True) -> None:
        if reply.finished:
            return
        reply.end()
        reply.status = status
        if self.current is reply:
            self.current = None
        if self.current is None:  # no reply runs: the LLM owes this call nothing
            self.conversation.set_deadline(None)
        text = reply.heard_text(status, self.clock.now(), self.rate)
        reply.kept_text = text
        if (text and not reply.runs and (reply.fixed_text is None or reply.said_first) and reply.in_history
                and not reply.taken_back):  # calls': see _after_tools
            message = ChatMessage("assistant", text)
            self.history.keep(reply.turn.turn_id, message)
            if reply.speaks:  # a client may yet say it stopped playing it short (History.cut)
                self.history.keep_finished(reply.turn.turn_id, reply, message)
        if not reply.runs:
            self.book.close(reply.turn.turn_id)
        if reply.stats is not None and reply.fixed_text is None:
            reply.turn.llm_steps.append({"step": reply.step, "prompt_tokens": reply.stats.prompt_tokens,
                                         "prefill_tokens": reply.stats.prefill_tokens,
                                         "time_to_first_token_ms": round(reply.stats.time_to_first_token_ms, 1),
                                         **({"honesty": reply.honesty} if reply.honesty is not None else {})})
        done = ResponseDone(
            reply.turn.turn_id, text, status, reply.turn.latency_ms(), reply.turn.voice_to_voice_ms(), reply.stats,
            reply.deadline_missed, reply.underruns, round(reply.underrun_s * 1000, 1),
            preemptive=reply.preemptive, discarded=self.discarded, discarded_words=self.discarded_words,
            user_text=reply.user_text, generated_text=reply.ledger.full_text(), sent_text=reply.ledger.sent_text(),
            error=reply.error, dtmf=reply.turn.dtmf, speech_end_at=reply.turn.marks.get("speech_end"),
            endpointing_ms=reply.turn.endpointing_ms(), taken_back=reply.taken_back,
            tool_calls=tuple(r.as_dict(reply.turn.marks.get("speech_end"))
                             for r in (reply.runs if reply.runs else reply.turn.tool_runs if reply.step > 1 else [])),
            filler=reply.fixed_text is not None, llm_steps=tuple(reply.turn.llm_steps),
        )
        self.discarded = self.discarded_words = 0
        log.info("turn %d %s: %s%s%s", done.turn_id, status, done.latency_ms,
                 " (first audio late)" if done.deadline_missed else "",
                 f" ({done.underruns} underruns, {done.underrun_ms:.0f} ms)" if done.underruns else "")
        if send:
            await self.outbound.send_event(done)
        self.events.reply_done(reply, status)  # after it was reported: a hang-up never comes before it
        # One record per turn: the reply that answers it (with every call the turn made); a reply
        # that made calls is recorded only if no answer follows (_after_tools), a filler never.
        if reply.runs:
            reply.turn.held_record = done
        elif reply.fixed_text is None:
            await self.events.record(done)

    async def cancel(self, status: str, send: bool = True, keep: bool = False) -> None:
        """Stop the reply in progress. `send`: tell the caller (response.done); `keep`: without
        telling, still hand the turn to on_turn (its record) when some of its audio was sent. A
        preemptive reply not yet confirmed was never heard, whoever stops it (the caller went on,
        spoke again, pressed keys, hung up): it is only counted as discarded, never reported."""
        reply = self.current
        if reply is None:
            return
        if not reply.confirmed.is_set():
            self.discarded += 1
            self.discarded_words += reply.words
            send = keep = False
        self.generation += 1
        self.current = None
        await reply.stop()
        # A cap set while the reply ran far ahead of playback must not outlive the reply.
        self.conversation.set_speculation_cap(None)
        if self.player.tap is not None and reply.ledger.sent_samples():
            self.player.tap.bot_stopped(self.clock.now())  # sent ahead of playback, then cut: never heard
        if send or (keep and reply.ledger.sent_samples()):
            await self.finish(reply, status, send=send)
        else:
            reply.end()
