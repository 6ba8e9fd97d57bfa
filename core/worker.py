"""A dedicated worker thread per model: models that are not thread-safe (or that would only fight
over two cores) run their blocking calls here, one at a time, off the event loop.

Workers share the CPU through one gate: while an urgent job runs (a caller who just stopped talking
waits for their transcript), background workers (the LLM, decoding other callers' replies a step at
a time) hold their next job until it is done. Each engine is given every core, and no engine's
threads wait on another's: the LLM pauses for at most one step (tens of milliseconds).

Waiting jobs run in one of two orders (`schedule`):
- "fifo": as they were asked for.
- "edf" (earliest deadline first): the job due soonest runs next (ties: as asked for); jobs with no
  deadline run after every job that has one. A deadline is a clock time, or a Lane: one owner's
  sequence of jobs (a conversation's generation steps), read each time the next job is chosen, so
  a job's deadline moves with its owner's while it waits (a head start queued before its reply
  began is due when the reply is). The worker only compares deadlines; it never reads the time.

A generation asks for one step at a time, and its next step reaches the worker only after the
event loop has seen the last one's result; meanwhile another call's step is always waiting. So
under "edf", after a lane's job, when the lane says more follow and it is due before every job
waiting, the worker keeps the thread for its next job (at most `follow_s`): the call due soonest
gets its steps back to back instead of taking turns with whoever queued in between.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import itertools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")
Priority = Literal["urgent", "normal", "background"]
Schedule = Literal["edf", "fifo"]


class CpuGate:
    def __init__(self, max_wait_s: float = 2.0) -> None:
        self._cond = threading.Condition()
        self._urgent = 0
        self.max_wait_s = max_wait_s  # a background job never waits longer than this
        self.held = 0  # background jobs waiting at the gate now

    @contextlib.contextmanager
    def urgent(self) -> Iterator[None]:
        with self._cond:
            self._urgent += 1
        try:
            yield
        finally:
            with self._cond:
                self._urgent -= 1
                self._cond.notify_all()

    def wait_for_urgent(self) -> None:
        with self._cond:
            if self._urgent:
                self.held += 1
                try:
                    self._cond.wait_for(lambda: self._urgent == 0, timeout=self.max_wait_s)
                finally:
                    self.held -= 1


CPU_GATE = CpuGate()  # one per process: the cores are one per process too


class Lane:
    """One owner's jobs: due at `deadline` (the owner's, e.g. when its reply's audio runs out), or
    at `fallback` while that is None. The owner sets `more` in a job that knows another follows at
    once (a generation step that did not finish the reply)."""

    def __init__(self) -> None:
        self.deadline: float | None = None
        self.fallback: float | None = None
        self.more = False

    def due(self) -> float | None:
        return self.fallback if self.deadline is None else self.deadline


Deadline = float | Lane | None  # a clock time, an owner's lane, or none


@dataclass
class _Job:
    seq: int  # arrival order
    deadline: Deadline
    call: Callable[[], Any]
    future: concurrent.futures.Future[Any]

    def due(self) -> float | None:
        return self.deadline.due() if isinstance(self.deadline, Lane) else self.deadline


class ModelWorker:
    def __init__(self, name: str, priority: Priority = "normal", gate: CpuGate = CPU_GATE,
                 schedule: Schedule = "fifo", follow_s: float = 0.02) -> None:
        self.name = name
        self.priority = priority
        self.gate = gate
        self.schedule = schedule
        self.follow_s = follow_s  # "edf": the longest the thread waits for the most urgent lane's next job
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"model-{name}")
        self._cond = threading.Condition()
        self._waiting: list[_Job] = []
        self._seq = itertools.count()
        self._follow: Lane | None = None  # the lane whose job just ran and said more follow
        self._closed = False

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run fn on the worker thread, with no deadline."""
        return await self.run_by(None, fn, *args, **kwargs)

    async def run_by(self, deadline: Deadline, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run fn on the worker thread, due by `deadline` (under "edf"). Cancelling the caller
        drops the job if it has not started."""
        return await asyncio.wrap_future(self.submit(deadline, functools.partial(fn, *args, **kwargs)))

    def submit(self, deadline: Deadline, call: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Queue a job. The thread runs one `_run_next` per job queued, and each runs whichever
        waiting job comes first at that moment."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._cond:
            self._pool.submit(self._run_next)  # RuntimeError once shut down
            self._waiting.append(_Job(next(self._seq), deadline, call, future))
            self._cond.notify_all()
        return future

    def _run_next(self) -> None:
        if self.priority == "background":  # before choosing: jobs that come meanwhile count too
            self.gate.wait_for_urgent()
        with self._cond:
            self._wait_for_follower()
            while True:
                if not self._waiting:
                    return  # an earlier turn ran this one's job after skipping a cancelled one
                job = min(self._waiting, key=self._order)
                self._waiting.remove(job)
                if job.future.set_running_or_notify_cancel():
                    break  # else its caller went away before it started: the next one
        try:
            result = self._call(job.call)
        except BaseException as exc:
            job.future.set_exception(exc)
        else:
            job.future.set_result(result)
        if self.schedule == "edf" and isinstance(job.deadline, Lane) and job.deadline.more:
            with self._cond:
                self._follow = job.deadline

    def _wait_for_follower(self) -> None:
        """With the lock held: if the lane whose job just ran has another coming and is due before
        every waiting job, wait (at most follow_s) for that job."""
        lane, self._follow = self._follow, None
        if lane is None or not self._waiting:
            return

        def arrived() -> bool:
            return self._closed or any(j.deadline is lane for j in self._waiting)

        ours = lane.due()
        dues = [d for j in self._waiting if (d := j.due()) is not None]
        if arrived() or ours is None or (dues and min(dues) <= ours):
            return
        self._cond.wait_for(arrived, timeout=self.follow_s)

    def _order(self, job: _Job) -> tuple[bool, float, int]:
        if self.schedule == "fifo":
            return False, 0.0, job.seq
        due = job.due()
        return due is None, 0.0 if due is None else due, job.seq

    def _call(self, call: Callable[[], T]) -> T:
        if self.priority == "urgent":
            with self.gate.urgent():
                return call()
        return call()

    def shutdown(self) -> None:
        """Stop taking jobs; those still waiting are cancelled (a running one finishes)."""
        with self._cond:
            self._closed = True
            self._pool.shutdown(wait=False, cancel_futures=True)
            waiting, self._waiting = self._waiting, []
            self._cond.notify_all()
        for job in waiting:
            job.future.cancel()
