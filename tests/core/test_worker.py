"""The model worker's order of jobs: earliest deadline first, or first come first served."""

from __future__ import annotations

import asyncio
import threading

import pytest

from core.worker import CpuGate, Lane, ModelWorker, Schedule


async def hold(worker: ModelWorker, deadline: float | None = None) -> tuple[threading.Event, asyncio.Future[None]]:
    """Hold the worker's thread with a blocking job (so that jobs queue behind it); set the event to
    let it go."""
    release = threading.Event()
    started = threading.Event()

    def block() -> None:
        started.set()
        release.wait(10)

    blocker = asyncio.ensure_future(worker.run_by(deadline, block))
    await asyncio.to_thread(started.wait, 10)
    return release, blocker


async def run_queued(worker: ModelWorker, jobs: list[tuple[str, float | None]]) -> list[str]:
    """Hold the worker's thread, queue `jobs` (name, deadline) in that order behind it, release it,
    and return the order the jobs ran in."""
    ran: list[str] = []
    release, blocker = await hold(worker, 0.0)
    tasks = [asyncio.ensure_future(worker.run_by(due, ran.append, name)) for name, due in jobs]
    await asyncio.sleep(0)  # every job queued while the thread is held
    release.set()
    await asyncio.gather(blocker, *tasks)
    return ran


async def test_edf_runs_a_later_job_with_an_earlier_deadline_first() -> None:
    worker = ModelWorker("test", schedule="edf")
    try:
        ran = await run_queued(worker, [("late", 20.0), ("none", None), ("soon", 10.0), ("tie", 10.0)])
    finally:
        worker.shutdown()
    # deadline order; a tie in arrival order; no deadline after every deadline
    assert ran == ["soon", "tie", "late", "none"]


async def test_fifo_runs_jobs_as_they_came() -> None:
    worker = ModelWorker("test", schedule="fifo")
    try:
        ran = await run_queued(worker, [("late", 20.0), ("none", None), ("soon", 10.0)])
    finally:
        worker.shutdown()
    assert ran == ["late", "none", "soon"]


async def test_a_lanes_deadline_is_read_when_the_next_job_is_chosen() -> None:
    """A job queued with no deadline (a head start) takes its lane's deadline when one is set
    while it waits."""
    worker = ModelWorker("test", schedule="edf")
    lane = Lane()
    ran: list[str] = []
    release, blocker = await hold(worker)
    other = asyncio.ensure_future(worker.run_by(5.0, ran.append, "other"))
    head_start = asyncio.ensure_future(worker.run_by(lane, ran.append, "head start"))
    await asyncio.sleep(0)
    lane.deadline = 1.0
    release.set()
    await asyncio.gather(blocker, other, head_start)
    worker.shutdown()
    assert ran == ["head start", "other"]


async def test_the_most_urgent_lane_gets_its_steps_back_to_back() -> None:
    """A generation asks for its next step only once the last one's result is back on the event
    loop; the worker keeps the thread for it when it is due first, instead of running the step of
    a later-due call that queued meanwhile."""
    worker = ModelWorker("test", schedule="edf", follow_s=10.0)  # a bound, never reached here
    urgent = Lane()
    urgent.deadline = 1.0
    ran: list[str] = []

    def step(name: str, more: bool) -> None:
        ran.append(name)
        urgent.more = more

    async def generation() -> None:
        for i in range(3):
            await worker.run_by(urgent, step, f"urgent {i}", i < 2)

    release, blocker = await hold(worker)
    steps = asyncio.ensure_future(generation())
    later = asyncio.ensure_future(worker.run_by(5.0, ran.append, "later"))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(blocker, steps, later)
    worker.shutdown()
    assert ran == ["urgent 0", "urgent 1", "urgent 2", "later"]


async def test_a_cancelled_job_never_runs_and_the_rest_do() -> None:
    worker = ModelWorker("test", schedule="edf")
    ran: list[str] = []
    release, blocker = await hold(worker)
    dropped = asyncio.ensure_future(worker.run_by(1.0, ran.append, "dropped"))
    kept = asyncio.ensure_future(worker.run_by(2.0, ran.append, "kept"))
    await asyncio.sleep(0)
    dropped.cancel()
    await asyncio.sleep(0.01)  # the cancellation reaches the job through the event loop
    release.set()
    await asyncio.gather(blocker, kept)
    assert ran == ["kept"]
    worker.shutdown()
    with pytest.raises(RuntimeError):
        await worker.run(ran.append, "after")


@pytest.mark.parametrize("schedule", ["edf", "fifo"])
async def test_background_jobs_wait_for_an_urgent_one(schedule: Schedule) -> None:
    gate = CpuGate()
    urgent = ModelWorker("asr", priority="urgent", gate=gate)
    background = ModelWorker("llm", priority="background", gate=gate, schedule=schedule)
    release = threading.Event()
    started = threading.Event()
    ran: list[str] = []

    def transcribe() -> None:
        started.set()
        release.wait(10)
        ran.append("urgent")

    first = asyncio.ensure_future(urgent.run(transcribe))
    await asyncio.to_thread(started.wait, 10)
    step = asyncio.ensure_future(background.run_by(1.0, ran.append, "background"))
    while gate.held == 0:  # the background job reaches the gate
        await asyncio.sleep(0.005)
    assert ran == []  # held there
    release.set()
    await asyncio.gather(first, step)
    assert ran == ["urgent", "background"]
    urgent.shutdown()
    background.shutdown()


async def test_an_exception_reaches_the_caller() -> None:
    worker = ModelWorker("test", schedule="edf")

    def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await worker.run_by(1.0, fail)
    assert await worker.run(lambda: 42) == 42
    worker.shutdown()
