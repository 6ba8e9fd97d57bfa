"""Tool calls in a reply: dispatched once the reply is known to be heard, run concurrently (the
client's on the client, the server's here), one spoken filler if they are slow, then one
follow-up reply from their results; and end_call, which hangs up after the goodbye was heard."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from core.clock import Clock
from core.private import content, log_private
from models.llm.tool_calls import ToolCall
from models.protocols import ChatMessage
from pipeline.config import SessionConfig
from pipeline.events import FunctionCallRequest, ResponseDone
from pipeline.session.history import History
from pipeline.session.parts import Goodbye, Outbound, Reply
from pipeline.session.replies import Replies
from pipeline.session.turn_book import TurnBook
from pipeline.tools import ToolBox, ToolRun

log = logging.getLogger(__name__)


class ToolCalls:
    """A call's tool calls. `hang_up`: how the transport ends the call (it returns at once and does
    it in a task of its own); with it, the built-in end_call tool can be offered."""

    def __init__(self, toolbox: ToolBox, config: SessionConfig, clock: Clock, outbound: Outbound,
                 history: History, book: TurnBook, replies: Replies,
                 record: Callable[[ResponseDone], Awaitable[None]], hang_up: Callable[[], None] | None,
                 transfer: Callable[[str], None] | None = None) -> None:
        self.toolbox = toolbox
        self.config = config
        self.clock = clock
        self.outbound = outbound
        self.history = history
        self.book = book
        self.replies = replies
        self.record = record
        self.hang_up = hang_up
        self.transfer = transfer  # how the line hands the call to a destination (a SIP REFER), instead of hanging up
        self._transfer_to: str | None = None  # transfer_call was called: where the call goes after the turn's words
        self._asked: dict[str, asyncio.Future[str]] = {}  # client calls awaiting function_call.output
        self._tasks: set[asyncio.Task[Any]] = set()  # calls and their follow-ups: not stopped by barge-in
        self._ending_turn: int | None = None  # end_call was called in this turn: hang up after its goodbye
        self._hang_up_turn: int | None = None  # ... by end_call itself (a transfer given up leaves it)
        self._goodbye: Goodbye | None = None
        if toolbox.ask_client is None:
            toolbox.ask_client = self.ask_client
        if hang_up is not None:
            toolbox.on_end_call = self.end_call
        if transfer is not None:
            toolbox.on_transfer = self.transfer_call
            toolbox.on_transfer_dropped = self.transfer_dropped

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        """The caller has gone: calls in flight and the client calls awaited stop, and nothing
        hangs up any more."""
        if self._goodbye is not None:
            self._goodbye.hung_up = True
        for task in self._tasks:
            task.cancel()
        for future in self._asked.values():
            future.cancel()

    async def dispatch(self, reply: Reply, call: ToolCall, generation: int) -> None:
        """Run a call the reply made, once the reply is known to be heard: a preemptive reply holds
        its calls until its turn is confirmed, and one dropped meanwhile runs none (this task is
        cancelled with it). The exception is a read-only tool the server runs (a look-up that
        changes nothing): it runs at once, and if the reply is dropped (the caller went on, the
        words changed) its result is thrown away. Once dispatched a call runs to its end whatever
        the caller does."""
        early: tuple[ToolRun, asyncio.Task[ToolRun]] | None = None
        if not reply.confirmed.is_set():
            if self._may_run_early(reply, call):
                run = ToolRun(call, "server", self.clock.now())
                log_private(log, logging.INFO, "turn %d: tool call %s %s(%s) (server, read-only: before the turn is "
                            "confirmed)", reply.turn.turn_id, call.call_id, call.name, content(call.arguments))
                early = (run, asyncio.create_task(self.toolbox.run(run)))
            try:
                await reply.confirmed.wait()
            except asyncio.CancelledError:
                if early is not None:
                    self._discard(reply, early[1])
                raise
        if generation != self.replies.generation:
            if early is not None:
                self._discard(reply, early[1])
            return
        now = self.clock.now()
        if not reply.runs:
            reply.history_at = len(self.history)
            reply.turn.mark("tool_dispatched", early[0].dispatched_at if early is not None else now)
        earlier = next((r for r in reply.turn.tool_runs if r.output is not None and r.same_call(call)), None)
        if early is not None:
            run, task = early  # running since the call was written
        else:
            run = ToolRun(call, self.toolbox.runs_on(call.name), now)
            if earlier is not None:  # asked again what it was told this turn: not run twice (it would act twice)
                run.output, run.finished_at, run.repeat_of = earlier.output, now, earlier.call.call_id
                log.info("turn %d: tool call %s repeats %s: its result is given again, not run",
                         reply.turn.turn_id, call.call_id, earlier.call.call_id)
                task = asyncio.create_task(asyncio.sleep(0, run))
            else:
                log_private(log, logging.INFO, "turn %d: tool call %s %s(%s) (%s)", reply.turn.turn_id, call.call_id,
                            call.name, content(call.arguments), run.runs_on)
                task = asyncio.create_task(self.toolbox.run(run))
        reply.runs.append(run)
        reply.turn.tool_runs.append(run)
        reply.run_tasks.append(task)
        self._track(task)
        if len(reply.runs) == 1:
            self._track(asyncio.create_task(self._after_tools(reply)))

    def _may_run_early(self, reply: Reply, call: ToolCall) -> bool:
        """A call of a reply not yet confirmed may run now: a read-only tool the server runs, not
        asked before in this turn (a repeat is answered from the earlier result, at confirmation)."""
        return (self.toolbox.runs_on(call.name) == "server" and self.toolbox.read_only(call.name)
                and not any(r.same_call(call) for r in reply.turn.tool_runs))

    def _discard(self, reply: Reply, task: asyncio.Task[ToolRun]) -> None:
        """A read-only call ran for a reply that was dropped: stopped, and its result never used."""
        task.cancel()
        log.info("turn %d: a read-only tool call's result is thrown away: its reply was dropped (the caller "
                 "went on)", reply.turn.turn_id)

    async def _after_tools(self, reply: Reply) -> None:
        """Wait for every call of the reply, with one spoken filler if they are slow; then put the
        reply's words and calls and the results in the history, and answer from them (unless the
        caller has moved on to another turn: the results stay in the history all the same)."""
        cfg, turn, replies = self.toolbox.config, reply.turn, self.replies
        await reply.produced.wait()
        runs = list(reply.run_tasks)
        if (not all(t.done() for t in runs) and replies.current in (None, reply)
                and reply.status in (None, "tool_calls") and self.book.answering == turn.turn_id
                and not self.book.closed):
            # While the tools run: prefill the follow-up up to where the first result goes, so that
            # the follow-up computes only the results' tokens (and the few closing ones).
            said = ChatMessage("assistant", reply.ledger.full_text(), tuple(r.call for r in reply.runs))
            ahead = (*reply.prompt, said, ChatMessage("tool", "", tool_call_id=reply.runs[0].call.call_id))
            replies.prepare(ahead, step=reply.step + 1, open_last=True)
        _, slow = await asyncio.wait(runs, timeout=cfg.filler_after_ms / 1000)
        filler: Reply | None = None
        worded = bool(reply.ledger.full_text().strip())  # words before its calls (an acknowledgement): no filler
        if slow and cfg.filler and not worded and "filler" not in turn.marks and self.book.answering == turn.turn_id:
            await reply.ended.wait()  # after the reply's own words, if it had some
            if replies.current is None and self.book.answering == turn.turn_id and not all(t.done() for t in slow):
                turn.mark("filler", self.clock.now())
                await replies.start(turn, None, step=reply.step, fixed_text=cfg.filler)
                filler = replies.current
        await asyncio.gather(*runs)
        turn.mark("tools_done", self.clock.now())
        await reply.ended.wait()
        messages = [ChatMessage("assistant", reply.kept_text or "", tuple(r.call for r in reply.runs)),
                    *(ChatMessage("tool", r.output or "", tool_call_id=r.call.call_id) for r in reply.runs)]
        for offset, message in enumerate(messages):
            self.history.keep(turn.turn_id, message, at=reply.history_at + offset)
        if filler is not None:
            await filler.ended.wait()
            heard = bool(filler.kept_text)
            for run in reply.runs:
                run.filler_heard = heard
        if self.book.answering != turn.turn_id or self.book.closed or replies.current is not None:
            log.info("turn %d: tool results kept; no follow-up (the caller went on)", turn.turn_id)
            self.book.close(turn.turn_id)
            if turn.held_record is not None:  # the turn's record: the calls' reply, with their results
                since = turn.marks.get("speech_end")
                kept = tuple(r.as_dict(since) for r in turn.tool_runs)
                await self.record(replace(turn.held_record, tool_calls=kept))
            return
        step = reply.step + 1
        if all(r.repeat_of for r in reply.runs):  # the model goes round in circles: it must answer in words
            step = max(step, cfg.max_steps + 1)
        await replies.start(turn, None, step=step)

    async def ask_client(self, call: ToolCall) -> str:
        """A client tool: the client runs it and answers with function_call.output."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._asked[call.call_id] = future
        try:
            await self.outbound.send_event(FunctionCallRequest(self.book.answering, call))
            return await future
        finally:
            self._asked.pop(call.call_id, None)

    def awaits(self, call_id: str) -> bool:
        """The client was asked to run this call and has not answered yet."""
        return call_id in self._asked

    def answer(self, call_id: str, output: str) -> bool:
        """The client's answer to a call it was asked to run; False if no such call is waiting."""
        future = self._asked.get(call_id)
        if future is None or future.done():
            return False
        future.set_result(output)
        return True

    def end_call(self) -> None:
        """The model called end_call: the call ends once this turn's goodbye has been heard."""
        self._ending_turn = self._hang_up_turn = self.book.answering
        log.info("turn %d: end_call: hanging up after the goodbye", self.book.answering)

    def transfer_call(self, name: str, destination: str) -> None:
        """The model called transfer_call: once this turn's last words have been heard, the line
        transfers the call to `destination` (instead of hanging up)."""
        self._ending_turn = self.book.answering
        self._transfer_to = destination
        log.info("turn %d: transfer_call: to %s after the turn's last words", self.book.answering, name)

    def transfer_dropped(self) -> None:
        """The transfer asked for will not happen (a warm transfer's person was not reached, or the
        caller cut the turn's words short): the turn's words no longer hand the call on."""
        if self._transfer_to is not None:
            log.info("turn %s: the transfer is given up; the call goes on", self._ending_turn)
            self._transfer_to, self._ending_turn = None, self._hang_up_turn

    def reply_done(self, reply: Reply, status: str) -> None:
        """A reply ended: the answer of the turn that called end_call hangs up once it was heard:
        the client's playback reports (the browser's, a phone line's marks) cover its audio, or,
        without reports, once it surely has played (it is sent at most session.output_lead_ms
        ahead of playback) plus tools.goodbye_grace_ms. A reply of a turn that asked for a transfer,
        cut short by the caller, gives the transfer up."""
        if status == "interrupted" and self._transfer_to is not None and self._ending_turn == reply.turn.turn_id:
            self.transfer_dropped()
        if (status != "completed" or self._ending_turn != reply.turn.turn_id or reply.step == 1
                or reply.fixed_text is not None or (self.hang_up is None and self._transfer_to is None)):
            return
        need = reply.offset_samples + reply.ledger.sent_samples()
        self._goodbye = goodbye = Goodbye(reply.turn.turn_id, need)
        self.played(goodbye.turn_id, reply.turn.played_samples)
        if not goodbye.hung_up:
            self._track(asyncio.create_task(self._hang_up_when_surely_heard(goodbye)))

    def played(self, turn_id: int, played: int) -> None:
        """The client has played `played` samples of turn `turn_id`'s audio."""
        goodbye = self._goodbye
        if goodbye is None or goodbye.turn_id != turn_id or goodbye.hung_up:
            return
        goodbye.played_samples = max(goodbye.played_samples, played)
        if goodbye.played_samples >= goodbye.need:
            self._hang_up(goodbye, "heard")

    async def _hang_up_when_surely_heard(self, goodbye: Goodbye) -> None:
        grace = self.toolbox.config.goodbye_grace_ms / 1000
        await self.clock.sleep(self.config.output_lead_ms / 1000 + grace)
        if not goodbye.hung_up:
            self._hang_up(goodbye, "not reported as heard in time")

    def _hang_up(self, goodbye: Goodbye, how: str) -> None:
        goodbye.hung_up = True
        if self._transfer_to is not None and self.transfer is not None:
            log.info("turn %d: the last words were %s; transferring the call", goodbye.turn_id, how)
            self.transfer(self._transfer_to)
            return
        assert self.hang_up is not None
        log.info("turn %d: the goodbye was %s; hanging up", goodbye.turn_id, how)
        self.hang_up()
