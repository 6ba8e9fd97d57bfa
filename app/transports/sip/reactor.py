"""Sippy's event loop on a thread of its own (docs/sip.md).

Sippy (the Sippy B2BUA's SIP stack: messages, transactions, dialogs, digest authentication) runs
its own reactor, `ED2`, a process-wide singleton: every call into the stack must be made on the
reactor's thread, and the stack calls back on it. `Reactor` starts that thread once per process and
carries calls both ways: `call` runs a function on the reactor's thread, and the stack's callbacks
hop to the asyncio loop with `loop.call_soon_threadsafe`.

Sippy notes the thread that first imports it as its own, so it is imported here, on the reactor's
thread, and nowhere else at run time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class SipLog:
    """Sippy's logger interface (`write`), into Python's logging at DEBUG: every SIP message sent
    and received, for `VOICE_AGENT_LOG_LEVEL=DEBUG`."""

    level = 0  # sippy's SIPLOG_DBUG: it asks for everything, the logging level filters

    def write(self, *args: Any, **kwargs: Any) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("sippy: %s", "".join(str(a) for a in args).rstrip())

    def shutdown(self) -> None:
        pass


class Reactor:
    """The one thread that runs sippy's loop (see the module doc)."""

    _lock = threading.Lock()
    _instance: Reactor | None = None

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.ed2: Any = None
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="sip-reactor", daemon=True)
        self.thread.start()
        self.ready.wait(30)
        if self.failure is not None:
            raise RuntimeError(f"the SIP stack (sippy) did not start: {self.failure!r}") from self.failure
        if self.ed2 is None:
            raise RuntimeError("the SIP stack (sippy) did not start within 30 s")

    @classmethod
    def get(cls) -> Reactor:
        """The process's reactor, started on first use."""
        with cls._lock:
            if cls._instance is None:
                cls._instance = Reactor()
            return cls._instance

    def _run(self) -> None:
        try:
            from _thread import get_ident

            from sippy.Core.EventDispatcher import ED2
            ED2.my_ident = get_ident()  # this thread is sippy's, whoever imported it first
            self.ed2 = ED2
        except BaseException as exc:  # reported by the constructor
            self.failure = exc
            return
        finally:
            self.ready.set()
        while True:
            try:
                ED2.loop()
            except Exception:  # a bug in one callback must not take every call's signalling down
                log.exception("the SIP reactor's loop failed; it goes on")

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run `fn(*args)` on the reactor's thread, soon; exceptions are logged there."""
        self.ed2.callFromThread(self._logged, fn, args)

    def call_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` on the reactor's thread and return its result (or raise its exception).
        Blocks the caller: from asyncio, use it through `asyncio.to_thread`."""
        if threading.get_ident() == self.thread.ident:
            return fn(*args)
        return self.ed2.callFromThreadSync(fn, *args)

    @staticmethod
    def _logged(fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("SIP: %s failed", getattr(fn, "__qualname__", fn))


def transaction_manager(global_config: dict[str, Any], on_request: Callable[..., Any]) -> Any:
    """Sippy's transaction manager, with its messages sent in the order the stack sends them.

    Sippy's UDP server hands each message to one of three sending threads, so a 100 Trying and the
    200 OK queued a few ms after it could leave in either order; a strict caller (SIPp's scenarios,
    some trunks) then aborts the call on the late 100. Here one thread sends, in queue order, and
    three still receive. Call on the reactor's thread (it imports sippy)."""
    from sippy.SipTransactionManager import SipTransactionManager
    from sippy.Udp_server import AsyncReceiver, Udp_server, Udp_server_opts

    class OneSender(Udp_server_opts):
        nworkers = 1  # sippy's opts copy themselves without it: a class attribute survives the copies

    class InOrderUdpServer(Udp_server):
        def __init__(self, global_config: dict[str, Any], uopts: Any) -> None:
            super().__init__(global_config, OneSender(o=uopts))  # one sender and one receiver
            self.areceivers.extend(AsyncReceiver(self) for _ in range(uopts.nworkers - 1))

    class InOrderManager(SipTransactionManager):
        model_udp_server = (InOrderUdpServer, Udp_server_opts)

    return InOrderManager(global_config, on_request)
