"""The one thread that writes every call's recording (app/store/recording.py), and its bounded queue.

Recorders hand it pieces of work on the event loop's thread: a spill (a few seconds of a call's audio
to place in its temporary files) or a close (the call's last audio, and the WAV made from the files).
One thread, so a recorder's pieces are written in the order they were handed over.

Handing a piece over never waits. At most `max_queued` pieces wait (storage.max_recording_pending):
when the disk falls that far behind, the oldest waiting piece is dropped to make room (its call's
recording has a silent gap there, or, for a close, is not kept at all), logged with the setting to
raise and counted (`on_drop("recording_queue_full")`: voice_agent_store_dropped_total). Each recorder
bounds its own audio in flight (max_behind_bytes); this bounds the sum over calls, which otherwise
grows with every call that ends while the disk is behind.

A dropped piece's bookkeeping (`dropped`) runs at once on the thread that handed the newer piece
over; its `cleanup` (closing the call's temporary files) runs on the writing thread, which may be
writing that call's earlier piece right now, before any other waiting piece. The thread starts with
the first piece and ends when nothing waits, so there is nothing to stop.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)
MAX_QUEUED = 64  # storage.max_recording_pending's default


def _nothing() -> None:
    pass


@dataclass(frozen=True)
class Piece:
    run: Callable[[], object]  # on the writing thread
    what: str  # for the log: "8.2 s of audio of <call>.wav"
    dropped: Callable[[], None] = _nothing  # pushed out unrun: on the submitting thread, cheap
    cleanup: Callable[[], None] | None = None  # pushed out unrun: then on the writing thread, never dropped


class RecordingWriter:
    def __init__(self, max_queued: int = MAX_QUEUED, on_drop: Callable[[str], None] | None = None) -> None:
        self.max_queued = max_queued
        self._on_drop = on_drop
        self._lock = threading.Lock()
        self._queue: deque[Piece] = deque()
        self._cleanups: deque[Callable[[], None]] = deque()  # each closes one call's files; holds no audio
        self._thread: threading.Thread | None = None
        self._idle = threading.Event()  # set while nothing waits and nothing is being written
        self._idle.set()
        self.dropped = 0  # pieces pushed out by newer ones

    def submit(self, piece: Piece) -> None:
        """Queue a piece; never waits. The oldest waiting piece is dropped when max_queued wait already."""
        with self._lock:
            self._queue.append(piece)
            oldest = self._queue.popleft() if len(self._queue) > self.max_queued else None
            if oldest is not None and oldest.cleanup is not None:
                self._cleanups.append(oldest.cleanup)
            if self._thread is None:
                self._idle.clear()
                self._thread = threading.Thread(target=self._run, name="call-recorder")
                self._thread.start()
        if oldest is not None:
            self._drop(oldest)

    @property
    def pending(self) -> int:
        """Pieces waiting (not counting the one being written)."""
        with self._lock:
            return len(self._queue)

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until every piece handed over so far is written or dropped (False: not within timeout_s)."""
        return self._idle.wait(timeout_s)

    def _run(self) -> None:
        while True:
            work: Callable[[], object]
            with self._lock:
                if self._cleanups:
                    work, what = self._cleanups.popleft(), "closing a dropped recording's files"
                elif self._queue:
                    piece = self._queue.popleft()
                    work, what = piece.run, piece.what
                else:
                    self._thread = None
                    self._idle.set()
                    return
            try:
                work()
            except Exception:
                log.exception("recordings: writing %s failed", what)

    def _drop(self, piece: Piece) -> None:
        self.dropped += 1
        try:
            piece.dropped()
        finally:
            if self._on_drop is not None:
                self._on_drop("recording_queue_full")
            if self.dropped == 1 or self.dropped % 100 == 0:  # the first, then every 100th
                log.warning("recordings: the disk is %d pieces behind; dropped the oldest, %s (%d dropped so far); "
                            "raise storage.max_recording_pending if the disk keeps up on average", self.max_queued,
                            piece.what, self.dropped)
