"""Tool calls in a reply: dispatched once the reply is known to be heard, run concurrently (the
client's on the client, the server's here), one spoken filler if they are slow, then one
follow-up reply from their results; and end_call, which hangs up after the goodbye was heard."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from models.protocols import (
    ChatMessage,
)
from models.tool_calls import ToolCall
from pipeline.events import (
    FunctionCallRequest,
)
from pipeline.session.parts import Goodbye, Reply
from pipeline.session.state import SessionState
from pipeline.tools import ToolRun

log = logging.getLogger(__name__)


class ToolCallsMixin(SessionState):
    async def _dispatch(self, reply: Reply, call: ToolCall, generation: int) -> None:
        """Run a call the reply made, once the reply is known to be heard: a preemptive reply holds
        its calls until its turn is confirmed, and one dropped meanwhile runs none (this task is
        cancelled with it). Once dispatched a call runs to its end whatever the caller does."""
        if not reply.confirmed.is_set():
            await reply.confirmed.wait()
        if generation != self.generation or self.toolbox is None:
            return
        now = self.clock.now()
        if not reply.runs:
            reply.history_at = len(self.history)
            reply.turn.mark("tool_dispatched", now)
        run = ToolRun(call, self.toolbox.runs_on(call.name), now)
        earlier = next((r for r in reply.turn.tool_runs if r.output is not None and r.same_call(call)), None)
        reply.runs.append(run)
        reply.turn.tool_runs.append(run)
        if earlier is not None:  # asked again what it was told this turn: not run twice (it would act twice)
            run.output, run.finished_at, run.repeat_of = earlier.output, now, earlier.call.call_id
            log.info("turn %d: tool call %s repeats %s: its result is given again, not run", reply.turn.turn_id,
                     call.call_id, earlier.call.call_id)
            task = asyncio.create_task(asyncio.sleep(0, run))
        else:
            log.info("turn %d: tool call %s %s(%s) (%s)", reply.turn.turn_id, call.call_id, call.name,
                     call.arguments, run.runs_on)
            task = asyncio.create_task(self.toolbox.run(run))
        reply.run_tasks.append(task)
        self.tool_tasks.add(task)
        task.add_done_callback(self.tool_tasks.discard)
        if len(reply.runs) == 1:
            follow = asyncio.create_task(self._after_tools(reply))
            self.tool_tasks.add(follow)
            follow.add_done_callback(self.tool_tasks.discard)

    async def _after_tools(self, reply: Reply) -> None:
        """Wait for every call of the reply, with one spoken filler if they are slow; then put the
        reply's words and calls and the results in the history, and answer from them (unless the
        caller has moved on to another turn: the results stay in the history all the same)."""
        assert self.toolbox is not None
        cfg, turn = self.toolbox.config, reply.turn
        await reply.produced.wait()
        runs = list(reply.run_tasks)
        _, slow = await asyncio.wait(runs, timeout=cfg.filler_after_ms / 1000)
        filler: Reply | None = None
        if slow and cfg.filler and "filler" not in turn.marks and self.answering == turn.turn_id:
            await reply.ended.wait()  # after the reply's own words, if it had some
            if self.reply is None and self.answering == turn.turn_id and not all(t.done() for t in slow):
                turn.mark("filler", self.clock.now())
                await self._start_reply(turn, None, step=reply.step, fixed_text=cfg.filler)
                filler = self.reply
        await asyncio.gather(*runs)
        turn.mark("tools_done", self.clock.now())
        await reply.ended.wait()
        messages = [ChatMessage("assistant", reply.kept_text or "", tuple(r.call for r in reply.runs)),
                    *(ChatMessage("tool", r.output or "", tool_call_id=r.call.call_id) for r in reply.runs)]
        for offset, message in enumerate(messages):
            self._keep(turn.turn_id, message, at=reply.history_at + offset)
        if filler is not None:
            await filler.ended.wait()
            heard = bool(filler.kept_text)
            for run in reply.runs:
                run.filler_heard = heard
        if self.answering != turn.turn_id or self.closed or self.reply is not None:
            log.info("turn %d: tool results kept; no follow-up (the caller went on)", turn.turn_id)
            self.turns.pop(turn.turn_id, None)
            if turn.held_record is not None:  # the turn's record: the calls' reply, with their results
                since = turn.marks.get("speech_end")
                kept = tuple(r.as_dict(since) for r in turn.tool_runs)
                await self._record(replace(turn.held_record, tool_calls=kept))
            return
        step = reply.step + 1
        if all(r.repeat_of for r in reply.runs):  # the model goes round in circles: it must answer in words
            step = max(step, cfg.max_steps + 1)
        await self._start_reply(turn, None, step=step)

    async def _ask_client(self, call: ToolCall) -> str:
        """A client tool: the client runs it and answers with function_call.output."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.asked[call.call_id] = future
        try:
            await self.outbound.send_event(FunctionCallRequest(self.answering, call))
            return await future
        finally:
            self.asked.pop(call.call_id, None)

    def on_function_output(self, call_id: str, output: str) -> bool:
        """The client's answer to a call it was asked to run; False if no such call is waiting."""
        future = self.asked.get(call_id)
        if future is None or future.done():
            return False
        future.set_result(output)
        return True

    def _end_call(self) -> None:
        """The model called end_call: the call ends once this turn's goodbye has been heard."""
        self.ending_turn = self.answering
        log.info("turn %d: end_call: hanging up after the goodbye", self.answering)

    async def _hang_up_after(self, reply: Reply) -> None:
        """Hang up once the goodbye was heard: the client's playback reports (the browser's, a phone
        line's marks) cover its audio, or, without reports, once it surely has played (it is sent
        at most session.output_lead_ms ahead of playback) plus tools.goodbye_grace_ms."""
        assert self.hang_up is not None
        turn = reply.turn
        need = reply.offset_samples + reply.ledger.sent_samples()
        goodbye = Goodbye(turn.turn_id, need, turn.played_samples)
        self.goodbye = goodbye
        grace = (self.toolbox.config.goodbye_grace_ms if self.toolbox is not None else 2000) / 1000
        deadline = self.clock.now() + self.config.session.output_lead_ms / 1000 + grace
        while goodbye.played_samples < need and self.clock.now() < deadline:
            await self.clock.sleep(0.05)
        heard = goodbye.played_samples >= need
        log.info("turn %d: the goodbye was %s; hanging up", turn.turn_id,
                 "heard" if heard else "not reported as heard in time")
        self.hang_up()
