"""The recordings' one writing thread has a bounded queue over all calls (storage.max_recording_pending):
when the disk falls that far behind, handing a piece over still never waits; the oldest waiting piece
is dropped, logged with the setting to raise, and counted."""

from __future__ import annotations

import asyncio
import logging
import threading
import wave
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from app.store import CallRecorder, CallStore
from app.store.recording_writer import Piece, RecordingWriter
from tests.store.helpers import storage

RATE = 16000
T0 = 100.0


class FakeSlowDisk:
    """A fake disk that holds the writing thread in its first write until released (a stalled disk)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()

    def write(self) -> None:
        self.entered.set()
        self.released.wait(30)

    def hold(self, writer: RecordingWriter) -> None:
        writer.submit(Piece(self.write, "the stalled write"))
        assert self.entered.wait(10), "the writing thread did not start"


def without_waiting(work: list[Piece], writer: RecordingWriter) -> None:
    """Hands the pieces over on another thread, which must finish while the disk is still held (a
    submit that waited would hang until the disk is released; the join's limit only ends the test)."""
    thread = threading.Thread(target=lambda: [writer.submit(piece) for piece in work])
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "handing a piece over waited for the disk"


def test_a_full_queue_drops_the_oldest_piece_and_counts_it_without_waiting(
        caplog: pytest.LogCaptureFixture) -> None:
    reasons: list[str] = []
    writer = RecordingWriter(max_queued=3, on_drop=reasons.append)
    disk = FakeSlowDisk()
    written: list[int] = []
    dropped: list[int] = []
    done = threading.Event()

    def write(n: int) -> None:
        written.append(n)
        if n == 4:
            done.set()

    work = [Piece(partial(write, n), f"piece {n}", dropped=partial(dropped.append, n)) for n in range(5)]
    disk.hold(writer)
    try:
        with caplog.at_level(logging.WARNING, logger="app.store.recording_writer"):
            without_waiting(work, writer)
        assert dropped == [0, 1] and writer.dropped == 2  # the oldest two made room for the newest
        assert writer.pending == 3
        assert reasons == ["recording_queue_full"] * 2
        warning = caplog.records[0].getMessage()  # logged once for the first (then every 100th)
        assert "piece 0" in warning and "storage.max_recording_pending" in warning
    finally:
        disk.released.set()
    assert done.wait(10)
    assert written == [2, 3, 4]  # the rest, in order


async def test_a_dropped_close_leaves_no_recording_and_the_newer_one_is_written(tmp_path: Path) -> None:
    reasons: list[str] = []
    writer = RecordingWriter(max_queued=1, on_drop=reasons.append)
    first = CallRecorder(tmp_path / "first.wav", T0, writer=writer)
    second = CallRecorder(tmp_path / "second.wav", T0, writer=writer)
    for recorder in (first, second):
        recorder.caller(np.full(RATE // 2, 0.5, dtype=np.float32), RATE, at=T0 + 1.0)
    disk = FakeSlowDisk()
    disk.hold(writer)
    try:
        first_closing = asyncio.create_task(first.close())
        await asyncio.sleep(0)  # its close is handed over, and waits behind the stalled write
        second_closing = asyncio.create_task(second.close())
        assert await first_closing is None  # pushed out by the newer close: not kept
        assert reasons == ["recording_queue_full"]
    finally:
        disk.released.set()
    assert await second_closing == tmp_path / "second.wav"
    assert not (tmp_path / "first.wav").exists()
    assert all(track.file is None for track in first._tracks)  # its temporary files were closed


async def test_a_dropped_spill_is_a_gap_and_frees_its_place(tmp_path: Path) -> None:
    writer = RecordingWriter(max_queued=2)
    recorder = CallRecorder(tmp_path / "c.wav", T0, writer=writer, spill_bytes=RATE * 4)  # a spill each second
    disk = FakeSlowDisk()
    disk.hold(writer)
    try:
        for second in range(3):  # three spills: the first is pushed out by the third
            recorder.caller(np.full(RATE, 0.5, dtype=np.float32), RATE, at=T0 + second + 1.0)
            recorder.caller(np.zeros(1, dtype=np.float32), RATE, at=T0 + second + 1.0 + 1 / RATE)
        assert writer.dropped == 1
        assert recorder.dropped_s == pytest.approx(1.0, abs=0.01)
        assert recorder.behind_bytes == 2 * (RATE + 1) * 4  # only the two spills still waiting
    finally:
        disk.released.set()
    assert writer.wait_idle(10)
    path = await recorder.close()
    assert path is not None and recorder.behind_bytes == 0
    with wave.open(str(path), "rb") as wav:
        left = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").reshape(-1, 2)[:, 0]
    assert not left[:RATE].any()  # the dropped second: a gap
    assert all((left[start + 10:start + RATE - 10] > 10000).all() for start in (RATE, 2 * RATE))  # then the rest


async def test_the_store_bounds_every_call_s_recording_with_its_setting(tmp_path: Path) -> None:
    reasons: list[str] = []
    store = CallStore(storage(tmp_path, recordings=True, max_recording_pending=7), on_drop=reasons.append)
    await store.open()
    try:
        recorder = store.recorder("call-1", started_at=T0)
        assert recorder is not None
        assert store.recording_writer.max_queued == 7
        disk = FakeSlowDisk()
        disk.hold(store.recording_writer)
        try:
            for n in range(8):
                store.recording_writer.submit(Piece(lambda: None, f"piece {n}"))
            assert reasons == ["recording_queue_full"]  # counted as the store's drops are
        finally:
            disk.released.set()
    finally:
        await store.close()
