"""One caller's session: the whole flow of the voice pipeline, wired in one place.

    audio in -> vad_stage -> asr_stage                         (the input line, for the whole call)
    transcript -> llm_stage -> chunk_stage -> tts_stage -> playout -> audio out   (one reply line per turn)

The session is a small façade over its parts, each owning its own state and given only what it
needs (see the package doc). This module is the input line for the whole call, routing its events
to a turn, and the session's two ports: `audio_in` (Inbound) for the caller's audio, and its public
methods for control (keys, playback reports, typed turns, tool results, settings).

The input line runs for the whole call. Each final transcript starts a reply (replies.py); the
caller's sound while the bot talks goes to the barge-in part, and speech that interrupts the
reply stops it, keeping in the history only the part that was heard."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

from core.clock import Clock
from core.private import keys, log_private
from core.private import words as private_words
from models.llm.tool_calls import ToolCall, Tools
from models.protocols import ChatMessage, Conversation
from pipeline import denoise
from pipeline.asr_stage import asr_stage
from pipeline.echo import PlayedTrack, cancel_echo
from pipeline.endpointing import vad_stage
from pipeline.events import (
    InputEvent,
    ResponseDone,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    TranscriptEarly,
    TranscriptFinal,
    TranscriptPartial,
)
from pipeline.session.barge_in import BargeIn
from pipeline.session.history import History
from pipeline.session.keypad import Keypad, dtmf_text
from pipeline.session.parts import AudioTap, Backends, Inbound, Outbound, PipelineConfig, Reply, Taps
from pipeline.session.playout import Player
from pipeline.session.replies import Replies
from pipeline.session.tool_calls import ToolCalls
from pipeline.session.turn_book import TurnBook
from pipeline.tools import ToolBox
from pipeline.transcript_trust import doubt
from pipeline.turn_judge import TurnJudge
from pipeline.turn_policy import TurnPolicy, bare_words
from pipeline.turns import Turn

log = logging.getLogger(__name__)
ECHO_HEARD_S = 3.0  # the words of a reply that ended this long ago may still come back as its echo
ECHO_ROOM_S = 0.5  # the room's reverberation and the recognizer's start, after the echo's delay


class Session:
    """One caller's session. `hang_up`: how the transport ends the call (it must return at once and
    do it in a task of its own); with it, the built-in end_call tool can be offered (tools.end_call).
    `transfer`: how the line hands the call on to a destination (the same way); with it, transfer_call
    is offered where tools.transfer_targets are set.
    `on_turn`: each turn's record (ResponseDone), once its reply has ended."""

    def __init__(
        self,
        backends: Backends,
        config: PipelineConfig,
        clock: Clock,
        outbound: Outbound,
        *,
        output_rate: int,
        input_rate: int = 16000,
        system_prompt: str | None = None,
        on_turn: Callable[[ResponseDone], Awaitable[None] | None] | None = None,
        tap: AudioTap | None = None,
        toolbox: ToolBox | None = None,
        hang_up: Callable[[], None] | None = None,
        transfer: Callable[[str], None] | None = None,
    ) -> None:
        self.backends = backends
        self.config = config
        self.clock = clock
        self.outbound = outbound
        self.output_rate = output_rate
        self.input_rate = input_rate  # the caller's line (8000: a phone's), for the noise suppression's level
        self.on_turn = on_turn
        self.audio_in = Inbound()
        has_tools = toolbox is not None and (toolbox.tools(1) is not None or (
            transfer is not None and bool(toolbox.config.transfer_targets)))
        default = config.session.tools_prompt if has_tools else config.session.system_prompt
        # the engine is chosen at the start: tools declared later (session.update) are served by it too
        self.conversation: Conversation = backends.llm_for(has_tools).conversation()
        # The words' end-of-turn probability comes from the model the decision was tuned on (the
        # default LLM, with the default system prompt), whichever model answers: in a call served by
        # llm.tools_model it has a conversation of its own, asked the call's words without the tools.
        self.weigher: Conversation | None = None
        if backends.llm_for(has_tools) is not backends.llm and backends.llm.weighs_words:
            self.weigher = backends.llm.conversation()
        self.book = TurnBook()
        self.kept = History(system_prompt or default, config.session)
        self.barge = BargeIn(config, clock, lambda: self._interrupt("sustained speech"))
        self.keypad = Keypad(config.session, clock, self._keys_turn)
        # what the caller's loudspeaker plays, for the echo canceller (None: echo cancellation is off)
        self.played = PlayedTrack() if config.session.echo.enabled else None
        if self.played is not None:
            tap = self.played if tap is None else Taps(tap, self.played)
        player = Player(config.session, clock, output_rate, outbound, self.conversation, self.barge.audio_open, tap)
        self.replies = Replies(backends, config, clock, outbound, output_rate, self.conversation, self.kept,
                               self.book, self.barge, player, self, toolbox)
        self.tool_calls = (ToolCalls(toolbox, config.session, clock, outbound, self.kept, self.book, self.replies,
                                     self.record, hang_up, transfer)
                           if toolbox is not None else None)
        # how the transport configured the call (`configure`)
        self.on_words: Callable[[int, str], None] | None = None
        self.speech_interrupts = True
        # the caller's words waiting to be answered with their next ones: final transcripts that came
        # after they went on speaking, and the words of a reply taken back (session.take_back_ms)
        self.held: list[str] = []
        # the end-of-turn evidence at the caller's pauses: the sound's (the VAD stage asks), the words'
        self.judge: TurnJudge | None = None  # made by run(), with the settings the call runs with
        self.words_task: asyncio.Task[None] | None = None  # weighing the words said up to a pause
        self._waiting: set[asyncio.Task[Any]] = set()  # turns answered once the reply they came over ends
        # for telling the bot's echo from the caller: the last reply's words and when it ended, the latest turn's
        # id and when it began
        self._said_last: tuple[str, float] = ("", 0.0)
        self._began: tuple[int, float] = (0, 0.0)

    # -- how a transport configures the call ----------------------------------------------------------
    def configure(self, *, speaks: bool | None = None,
                  turns: Literal["answered"] | Callable[[int, str], None] | None = None,
                  speech_interrupts: bool | None = None, takes_back: bool | None = None) -> None:
        """Change how the call behaves, from the next reply on; a setting not given (None) stays.
        `speaks`: replies are spoken (False: text only, no TTS); `turns`: "answered", every turn
        is answered (the default), or where the caller's words go instead, the client asking for
        each reply (`on_text`), as the Realtime API's create_response false has it;
        `speech_interrupts` False: the caller's speech neither pauses nor stops a reply (it is
        answered after it); `takes_back`: a reply the caller talks over within
        session.take_back_ms of its start is taken back."""
        if speaks is not None:
            self.replies.speaks = speaks
        if turns is not None:
            self.on_words = None if isinstance(turns, str) else turns
        if speech_interrupts is not None:
            self.speech_interrupts = speech_interrupts
        if takes_back is not None:
            self.barge.takes_back = takes_back

    # -- what a transport and a test read ------------------------------------------------------------
    @property
    def history(self) -> list[ChatMessage]:
        """The conversation as the call keeps it (the system prompt first). Read only."""
        return self.kept.messages

    @property
    def reply(self) -> Reply | None:
        """The reply in flight, if any."""
        return self.replies.current

    @property
    def closed(self) -> bool:
        """The caller has gone."""
        return self.book.closed

    # -- the input line --------------------------------------------------------------------------
    async def run(self) -> None:
        """Run until `audio_in` yields None (the caller hung up), then stop any reply."""
        self.replies.prepare(tuple(self.kept.messages))
        b = self.backends
        words = self.config.endpointing.text_signal and b.llm.weighs_words
        self.judge = TurnJudge(TurnPolicy(self.config.endpointing, words), b.turn, b.turn_worker, words)
        vad_stream = b.vad.new_stream()
        frames = self.audio_in.frames()
        if self.played is not None:
            frames = cancel_echo(frames, self.played, self.config.session.echo)
        noise = self.config.session.noise
        suppressor = denoise.make(noise.for_line(self.input_rate), noise.min_floor_dbfs)
        if suppressor is not None:  # after the echo canceller, which needs the microphone's audio as the room made it
            frames = denoise.suppress_noise(frames, suppressor)
        speech = vad_stage(frames, vad_stream, b.vad_worker, self.config.endpointing, self.clock,
                           b.vad.sample_rate, b.vad.window_samples, self.judge, self.book.ids)
        events = asr_stage(speech, self.backends.asr, self.backends.asr_worker, self.config.asr, self.clock,
                           self.replies.talking)
        try:
            async with contextlib.aclosing(events):
                async for event in events:
                    await self._on_input(event)
        finally:
            await self.close()

    async def close(self) -> None:
        """The caller has gone: nothing new starts, work in flight stops, and a reply they heard
        part of is still kept (on_turn), not sent. (`run` does this when the caller hangs up.)"""
        self.book.closed = True
        self.barge.release()
        self.replies.stop_preparing()
        self.keypad.close()
        if self.words_task is not None:
            self.words_task.cancel()
        for task in self._waiting:
            task.cancel()
        if self.tool_calls is not None:
            self.tool_calls.close()
        try:
            await self.replies.cancel("interrupted", send=False, keep=True)
            await self.conversation.aclose()
        finally:
            if self.weigher is not None:
                await self.weigher.aclose()

    async def _on_input(self, event: InputEvent) -> None:
        if isinstance(event, SpeechStarted):
            self.book.started(event.turn_id)
            self._began = (event.turn_id, event.at)
            await self.outbound.send_event(event)
            reply = self.replies.current
            if reply is not None and reply.preemptive and not reply.confirmed.is_set():
                # a new turn before the last one's reply was confirmed: that reply answers words the
                # caller has since added to (they join this turn), and nobody heard it
                await self.replies.discard_preemptive(reply, "the caller spoke again")
            elif reply is not None and self.speech_interrupts:
                self.barge.hold(event.turn_id)
            return
        if isinstance(event, SpeechStopped):
            self.barge.speech_stopped(event.turn_id)
            turn = self.book.get(event.turn_id)
            turn.mark("speech_end", event.at)
            turn.ended_at = event.ended_at
            await self.outbound.send_event(event)
            return
        if isinstance(event, SpeechPaused):
            self.barge.paused(event.turn_id)
            return
        if isinstance(event, SpeechResumed):
            self.barge.resumed(event.turn_id)
            if (resumed := self.book.open.get(event.turn_id)) is not None:
                resumed.endpointing = {}  # that pause did not end the turn
            reply = self.replies.current
            if reply is not None and reply.preemptive and not reply.confirmed.is_set():
                await self.replies.discard_preemptive(reply, "the caller went on")
            elif reply is not None and event.turn_id in self.barge.let_go and self.speech_interrupts:
                # after a backchannel the caller goes on: over the bot again, so hold it again
                self.barge.let_go.discard(event.turn_id)
                self.barge.hold(event.turn_id)
            return
        if isinstance(event, TranscriptEarly):
            if self.barge.pending == event.turn_id:
                # the caller spoke over the bot and paused: what they said so far decides at once
                # (the end of their turn can be a second away when it does not sound finished)
                if self.barge.lets_go(event.text, self._said()):
                    self.barge.let_go_of(event.turn_id, event.text)
                    self.barge.let_go.add(event.turn_id)  # until its final transcript, or until it goes on
                    return
                await self._interrupt("a word")  # then, as at any pause, the words so far are weighed
            if (self.replies.current is None and self.barge.pending is None and event.turn_id == self.book.last_started
                    and event.text.strip() and not self._echo_of_last_reply(event.turn_id, event.text)):
                if self.words_task is not None:
                    self.words_task.cancel()  # an earlier pause's, still weighing
                words = " ".join([*self.held, event.text.strip()]).strip()
                self.words_task = asyncio.create_task(self._weigh_words(event.turn_id, words, event))
            return
        if isinstance(event, TranscriptFinal) and event.turn_id in self.barge.let_go:
            self.barge.let_go.discard(event.turn_id)
            if self.barge.lets_go(event.text, self._said()):  # the backchannel let go at its pause, as it ended
                await self.outbound.send_event(event)
                self.book.close(event.turn_id)
                return
        await self.outbound.send_event(event)
        # An interim transcript over the bot does not decide: Whisper reads a word cut off mid-way as
        # another (whisper-tiny.en heard "Okay." cut at 300 ms as "Thank you."). The caller's first
        # pause (whole words, TranscriptEarly), the end of the speech, or its length decides.
        if isinstance(event, TranscriptFinal) and self.barge.pending == event.turn_id:
            if self.barge.lets_go(event.text, self._said()):
                self.barge.let_go_of(event.turn_id, event.text)
                self.book.close(event.turn_id)
                return
            await self._interrupt("a word")
        if isinstance(event, TranscriptPartial) and self.replies.current is None and event.text.strip():
            self.replies.prepare((*self.kept.prompt(), ChatMessage("user", event.text.strip())))
        if isinstance(event, TranscriptFinal):
            turn = self.book.get(event.turn_id)
            turn.mark("asr_final", event.at)
            text = event.text.strip()
            if self.book.last_started > event.turn_id:
                # The caller started talking again before this transcript was ready: never answer
                # over them. What they said joins the turn they went on with.
                if text:
                    log.info("turn %d: final transcript after the caller went on; joins turn %d",
                             event.turn_id, self.book.last_started)
                    self.held.append(text)
                self.book.close(event.turn_id)
            elif text or self.held:
                text = " ".join([*self.held, text]).strip()
                self.held.clear()
                reply = self.replies.current
                if reply is not None and reply.preemptive and not reply.confirmed.is_set():
                    if reply.turn.turn_id == event.turn_id and reply.user_text == text:
                        await self.replies.confirm(reply)
                        return
                    await self.replies.discard_preemptive(reply, "the final transcript differs")
                if self.on_words is not None:  # the client asks for each reply (Realtime create_response false)
                    self.book.close(event.turn_id)
                    self.on_words(event.turn_id, text)
                    return
                if self._echo_of_last_reply(event.turn_id, text):
                    log_private(log, logging.INFO, "turn %d: %r, heard as the last reply ended, is its echo: not "
                                "answered", event.turn_id, private_words(text))
                    self.book.close(event.turn_id)
                    return
                reply = self.replies.current
                if not self.speech_interrupts and reply is not None and reply.confirmed.is_set():
                    # the caller spoke over a reply that speech does not interrupt: answered after it
                    waiting = asyncio.create_task(self._answer_after(reply, turn, text))
                    self._waiting.add(waiting)
                    waiting.add_done_callback(self._waiting.discard)
                    return
                await self.replies.start(turn, text)
            else:
                self.book.close(event.turn_id)

    def _said(self) -> str:
        """The words of the reply in flight sent to the caller so far, and of the reply before it while its echo
        may still be heard."""
        reply = self.replies.current
        said = reply.ledger.full_text() if reply is not None else ""  # the words made: sent_text cuts in a phrase
        before, ended = self._said_last
        if before and self.clock.now() - ended <= ECHO_HEARD_S:
            said = f"{before} {said}"
        return said

    def _echo_of_last_reply(self, turn_id: int, text: str) -> bool:
        """The turn is the echo of the reply that just ended, on a line where echo was found: it began while the
        reply's end could still be heard again (the output lead, the echo's delay and the room after the reply
        went out), and its words are mostly the reply's."""
        if self.played is None or self.played.echo_ms is None or self.replies.current is not None:
            return False
        began_id, began = self._began
        before, ended = self._said_last
        tail = (self.config.session.output_lead_ms + self.played.echo_ms) / 1000 + ECHO_ROOM_S
        if began_id != turn_id or not before or began - ended > tail:
            return False
        return self.barge.is_own_echo(text, before)

    async def _answer_after(self, reply: Reply, turn: Turn, text: str) -> None:
        await reply.ended.wait()
        current = self.replies.current
        if current is None or not current.confirmed.is_set():
            await self.replies.start(turn, text)
        else:  # another reply began meanwhile (a client's response.create): this turn waits for it too
            await self._answer_after(current, turn, text)

    async def _end_of_turn(self, words: str) -> float | None:
        """The LLM's probability that the caller's sentence ends after `words`: asked of the call's
        own conversation (whose cache the reply then starts from), or, in a call served by another
        model than the one the decision was tuned on, of that one, with the default system prompt
        and the dialogue's words only (no tools, calls or results)."""
        if self.weigher is None:
            asked = (*self.kept.prompt(), ChatMessage("user", words))
            return await self.conversation.end_of_turn(asked, self.replies.tools(1))
        said = [ChatMessage(m.role, m.content) for m in self.kept.prompt()[1:]
                if m.role in ("user", "assistant") and m.content]
        asked = (ChatMessage("system", self.config.session.system_prompt), *said, ChatMessage("user", words))
        return await self.weigher.end_of_turn(asked, None)

    async def _weigh_words(self, turn_id: int, words: str, early: TranscriptEarly) -> None:
        """The caller paused, and their words so far are transcribed: the language model's
        probability that their sentence ends there goes to the end-of-turn judge, unless the
        transcript cannot be trusted as evidence (pipeline/transcript_trust.py); then the reply
        starts preemptively on those words (from the cache that computation left: one prefill; in a
        call whose words are weighed on another model, from the last head start on the words)."""
        probability, judge = None, self.judge
        untrusted = doubt(early.text, early.speech_s, early.avg_logprob, early.no_speech_prob)
        if untrusted is not None:
            log.info("turn %d: the transcript at the pause is no evidence of the turn's end: %s", turn_id, untrusted)
        elif judge is not None and judge.expects_words:
            try:
                probability = await self._end_of_turn(bare_words(words))
            except Exception as exc:  # the words are evidence; without them the sound decides
                log.warning("turn %d: the LLM's end-of-turn probability failed: %s", turn_id, exc)
            if probability is not None:
                log_private(log, logging.DEBUG, "turn %d: P(end of sentence | %r) = %.3f", turn_id,
                            private_words(words), probability)
            judge.words(turn_id, probability, words, early.avg_logprob, early.last_word_prob, early.end_mark_prob)
        # the pause still goes on (a judge that gathers nothing does not follow pauses)
        pausing = judge is None or not judge.active or judge.turn_id == turn_id
        turn = self.book.open.get(turn_id)
        if turn is None and pausing:
            turn = self.book.get(turn_id)
        if turn is not None and (pausing or "speech_end" in turn.marks):  # the decision's marks, for its record
            turn.endpointing = {"pause_heard": early.paused_at if early.paused_at is not None else early.at,
                                "transcript_at_pause": early.at}
            if probability is not None:
                turn.endpointing["words_weighed"] = self.clock.now()
        turn = turn or Turn(turn_id)
        if not pausing and "speech_end" not in turn.marks:
            return  # the caller went on while the words were weighed: the next pause starts again
        if (self.config.session.preemptive and self.on_words is None and self.replies.current is None
                and self.barge.pending is None
                and turn_id == self.book.last_started and not self.book.closed and "asr_final" not in turn.marks):
            self.book.open[turn_id] = turn
            await self.replies.start(turn, words, preemptive=True)

    # -- what the parts ask of the call -------------------------------------------------------------
    async def _interrupt(self, why: str) -> None:
        """The caller interrupts the reply (a word, sustained speech, a key, the client): it stops,
        keeping what was heard; or, when it had only just begun (session.take_back_ms), it is taken
        back: it and the words it answered leave the history, and those words join the caller's next."""
        reply, began = self.replies.current, self.barge.began
        self.barge.release()
        if reply is None:
            return
        if why != "a key press" and self.barge.takes_back_reply(reply, began):
            log.info("turn %d: the caller went on as the reply began: taken back, their words join the next turn",
                     reply.turn.turn_id)
            # before any await: the caller's next words must find the history as it will be
            reply.taken_back = True
            said = self.kept.take_back(reply.turn.turn_id)
            self.held[:0] = said or [reply.user_text]
        else:
            log.info("turn %d: barge-in (%s)", reply.turn.turn_id, why)
        await self.replies.cancel("interrupted")

    async def _keys_turn(self, digits: list[str], last_at: float) -> None:
        """Keys judged complete: a turn like a spoken one, whose "transcript" is ready at once; the
        caller's true end is the last key press."""
        now = self.clock.now()
        turn = self.book.new(now, ended_at=last_at)
        turn.dtmf = " ".join(digits)
        text = dtmf_text(digits)
        log_private(log, logging.INFO, "turn %d: keys %s", turn.turn_id, keys(turn.dtmf))
        await self.replies.discard_unconfirmed("the caller pressed keys")  # nobody heard it
        await self.outbound.send_event(TranscriptFinal(turn.turn_id, text, now))
        await self.replies.start(turn, text)  # not if the caller hung up meanwhile (start checks)

    async def tool_call(self, reply: Reply, call: ToolCall, generation: int) -> None:
        if self.tool_calls is not None:
            await self.tool_calls.dispatch(reply, call, generation)

    def reply_done(self, reply: Reply, status: str) -> None:
        self._said_last = (reply.ledger.full_text(), self.clock.now())
        if self.tool_calls is not None:
            self.tool_calls.reply_done(reply, status)

    async def record(self, done: ResponseDone) -> None:
        if self.on_turn is not None:
            result = self.on_turn(done)
            if result is not None:
                await result

    # -- control in: keys, playback reports, tool results ------------------------------------------
    async def on_dtmf(self, digit: str) -> None:
        """A key pressed on the caller's phone. Keys interrupt the bot like words; they are collected
        until none comes for `session.dtmf_timeout_ms`, then answered as the caller's turn."""
        if self.book.closed or not self.keypad.press(digit):
            return
        if self.replies.talking() or self.barge.pending is not None:
            await self._interrupt("a key press")

    def on_played(self, turn_id: int, played_ms: float, stopped: bool = False) -> None:
        """The client's playback clock (native `output_audio.played`, phone marks, a Realtime
        truncate): how much of the turn's reply audio it has played, stopped there or not. On
        barge-in the history keeps those words. `stopped`: the client stopped playing there, so the
        report is exact rather than carried forward at playback speed."""
        played = int(played_ms * self.output_rate / 1000)
        turn = self.book.open.get(turn_id)
        if turn is not None:
            turn.played_samples = max(turn.played_samples, played)
        if self.tool_calls is not None:
            self.tool_calls.played(turn_id, played)
        reply = self.replies.current
        if reply is not None and reply.turn.turn_id == turn_id:
            reply.report_played(played, stopped, self.clock.now())

    def cut_heard(self, turn_id: int, played_ms: float) -> str | None:
        """The client stopped playing turn `turn_id`'s reply after `played_ms` (the Realtime API's
        truncate): a reply still going keeps exactly those words when it ends; one already sent whole
        has its words in the history cut to them now. The words heard, or None when the turn's reply
        is neither going nor among the last ones finished."""
        reply = self.replies.current
        if reply is not None and reply.turn.turn_id == turn_id:
            self.on_played(turn_id, played_ms, stopped=True)
            return None
        heard = self.kept.cut(turn_id, int(played_ms * self.output_rate / 1000))
        if heard is not None:
            log_private(log, logging.INFO, "turn %d: the client stopped its audio at %.0f ms; the history keeps %r",
                        turn_id, played_ms, private_words(heard))
        return heard

    def awaits_output(self, call_id: str) -> bool:
        """The client was asked to run call `call_id` and has not answered yet."""
        return self.tool_calls is not None and self.tool_calls.awaits(call_id)

    def on_function_output(self, call_id: str, output: str) -> bool:
        """The client's answer to a call it was asked to run; False if no such call is waiting."""
        return self.tool_calls is not None and self.tool_calls.answer(call_id, output)

    # -- turns a client asks for (the Realtime API's conversation.item.create and response.create) --
    def set_instructions(self, text: str) -> None:
        """The system prompt of the replies from now on."""
        self.kept.set_system(text)

    async def on_text(self, texts: Sequence[str] = (), instructions: str | None = None, in_history: bool = True,
                      context: tuple[ChatMessage, ...] | None = None,
                      tools: Tools | Literal["call"] | None = "call") -> int:
        """Messages the client typed (each its own in the history), or none: a reply to the
        conversation as it stands. Answered like a spoken turn whose transcript is ready at once
        (its `speech_end` is now); it stops the reply in progress. `instructions`: this reply's
        system prompt; `in_history` False: an out-of-band reply, kept out of the history (with its
        messages); `context`: the messages it answers in place of the history's; `tools`: its own.
        Returns the turn's id (0: the caller has gone)."""
        if self.book.closed:
            return 0
        turn = self.book.new(self.clock.now())
        self.book.answering = turn.turn_id
        await self.replies.discard_unconfirmed("the client asked for a reply")  # nobody heard it
        said = [t for t in texts if t]
        if in_history and len(said) > 1:
            # the reply in progress ends first, so that its words come before these in the history
            self.barge.release()
            await self.replies.cancel("interrupted")
            for earlier in said[:-1]:
                self.kept.keep(turn.turn_id, ChatMessage("user", earlier))
        text = (said[-1] if in_history else " ".join(said)) if said else None
        await self.replies.start(turn, text, instructions=instructions, in_history=in_history, context=context,
                                 tools=tools)
        return turn.turn_id

    async def say(self, text: str) -> int:
        """Say `text` as is, without the LLM: a call's first message (an outbound call's opening
        words). What the caller heard of it joins the history. Returns the turn's id (0: the caller
        has gone)."""
        if self.book.closed or not text.strip():
            return 0
        turn = self.book.new(self.clock.now())
        await self.replies.start(turn, None, fixed_text=text.strip(), said_first=True)
        return turn.turn_id

    def add_message(self, message: ChatMessage) -> int:
        """A message the client adds to the conversation as it is (an assistant's earlier words, a
        system note), answered by nothing; kept under a turn id of its own, which it returns."""
        turn_id = next(self.book.ids)
        self.kept.keep(turn_id, message)
        return turn_id

    def forget(self, turn_id: int, role: str, text: str | None = None) -> bool:
        """The client deletes a message of turn `turn_id` from the conversation (the Realtime API's
        conversation.item.delete): the turn's message of `role` whose words are `text` (None: its
        first of that role) leaves the history; an assistant message that made calls keeps them and
        loses its words. False when there is no such message."""
        return self.kept.forget(turn_id, role, text)

    def forget_call(self, call_id: str) -> bool:
        """The client deletes a function call or its output: both leave the history, and the
        message that made the call loses it."""
        return self.kept.forget_call(call_id)

    async def cancel_reply(self) -> bool:
        """The client stops the reply in progress (it ends `interrupted`, keeping what was heard);
        False when none is in progress."""
        if not self.replies.talking():
            return False
        await self._interrupt("the client cancelled it")
        return True
