"""A dedicated worker thread per model: models that are not thread-safe (or that would only fight
over two cores) run their blocking calls here, one at a time, off the event loop.

Workers share the CPU through one gate: while an urgent job runs (a caller who just stopped talking
waits for their transcript), background workers (the LLM, decoding other callers' replies a step at
a time) hold their next job until it is done. Each engine is given every core, and no engine's
threads wait on another's: the LLM pauses for at most one step (tens of milliseconds)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Literal, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")
Priority = Literal["urgent", "normal", "background"]


class CpuGate:
    def __init__(self, max_wait_s: float = 2.0) -> None:
        self._cond = threading.Condition()
        self._urgent = 0
        self.max_wait_s = max_wait_s  # a background job never waits longer than this

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
                self._cond.wait_for(lambda: self._urgent == 0, timeout=self.max_wait_s)


CPU_GATE = CpuGate()  # one per process: the cores are one per process too


class ModelWorker:
    def __init__(self, name: str, priority: Priority = "normal", gate: CpuGate = CPU_GATE) -> None:
        self.name = name
        self.priority = priority
        self.gate = gate
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"model-{name}")

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(self._call, fn, *args, **kwargs))

    def _call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        if self.priority == "urgent":
            with self.gate.urgent():
                return fn(*args, **kwargs)
        if self.priority == "background":
            self.gate.wait_for_urgent()
        return fn(*args, **kwargs)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
