"""A stereo recording of a call: the caller on the left, the bot on the right, on one timeline from
the call's start, so that a reviewer hears the overlap at a barge-in.

On the audio path a recorder only appends (time, rate, samples) to a list (about a microsecond); every
few seconds of audio (`spill_bytes`) the lists are handed to one background thread (the store's
RecordingWriter, app/store/recording_writer.py, shared by every call), which resamples
them to `rate`, places them on the timeline and writes them as 16-bit PCM into one sparse temporary
file per channel (a position in the file is a moment in the call; what is never written reads as
silence). `close()` interleaves the two files into `<data_dir>/recordings/<call>.wav` in that thread.
A call is recorded for its first `max_s` seconds.

Memory is bounded per recorder: audio held on the audio path by spill_bytes, audio handed to the
thread and not yet written by max_behind_bytes. When the disk falls that far behind, new audio is
dropped instead of queued (the recording has a silent gap there, `dropped_s` long, logged once): a
slow disk never grows the process. The writer's queue is bounded over all calls too: a piece it drops
to make room is counted in `dropped_s` as well (a close it drops leaves no recording: close() says None).

Placement:
- caller audio that arrives at monotonic time `at` ends there: a frame of d seconds starts at at - d.
  Frames follow one another without gaps or overlaps (arrival jitter up to `tolerance_s` is absorbed,
  and a burst after a network stall is laid end to end); a later frame more than tolerance_s after the
  previous one's end starts a new stretch, the gap left silent.
- bot audio is placed where it starts playing for the caller (`at`); chunks within tolerance_s of the
  previous chunk's end follow it exactly. Audio placed over earlier bot audio replaces it.
  `bot_stopped(at)` (a barge-in) silences the bot audio placed after `at`: the caller never heard it.

Hook points (the session or the transport, on the event loop's thread):
    recorder = store.recorder(call_id, started_at=clock.now())   # None when recordings are off
    recorder.caller(frame, rate, at=clock.now())                 # each caller frame as it arrives
    recorder.bot(chunk, rate, at=playhead_time)                  # each reply chunk, at its playback time
    recorder.bot_stopped(at=clock.now())                         # a barge-in cut the reply off
    store.call_ended(call_id, ended_at, end_reason, recorder=recorder)  # closes it off the audio path
The arrays are kept as they are, not copied: do not change them after handing them over.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import threading
import wave
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np

from app.store.recording_writer import Piece, RecordingWriter
from models.protocols import Audio
from pipeline.audio import resample

log = logging.getLogger(__name__)
SHARED_WRITER = RecordingWriter()  # for recorders not given one (the store gives its own, configured)
Entry = tuple[float, int, Audio | None]  # (at, rate, samples); samples None: the bot was stopped at `at`


@dataclass
class _Track:
    """One channel on disk: int16 samples at the recorder's rate, sample i at byte 2*i."""

    is_caller: bool
    file: IO[bytes] | None = None
    cursor: float | None = None  # where the next contiguous audio goes (output samples)
    end: int = 0  # one past the last sample written
    run: list[Audio] = field(default_factory=list)  # contiguous audio not yet written, from run_start
    run_rate: int = 0
    last_rate: int = 0
    run_start: float = 0.0


class CallRecorder:
    def __init__(self, path: Path, started_at: float, *, rate: int = 16000, max_s: float = 3600.0,
                 spill_bytes: int = 1 << 20, max_behind_bytes: int = 4 << 20, tolerance_s: float = 0.1,
                 writer: RecordingWriter | None = None) -> None:
        self.path = path  # the WAV, written by close()
        self._writer = writer or SHARED_WRITER
        self.rate = rate
        self._t0 = started_at
        self._max_s = max_s
        self._spill_bytes = spill_bytes
        self._tolerance = tolerance_s * rate
        self._caller: list[Entry] = []
        self._bot: list[Entry] = []
        self.pending_bytes = 0  # audio held in memory, not yet handed to the writing thread
        self._max_behind = max_behind_bytes
        self.behind_bytes = 0  # audio handed to the thread, not yet written (read on both threads)
        self._behind_lock = threading.Lock()
        self.dropped_s = 0.0  # audio dropped because the thread fell behind
        self._tracks = (_Track(is_caller=True), _Track(is_caller=False))
        self._closed = False
        self._result: asyncio.Future[Path | None] | None = None

    def caller(self, samples: Audio, rate: int, at: float) -> None:
        """A caller frame (float32 mono) that arrived at monotonic time `at`."""
        if self._closed or at - self._t0 > self._max_s:
            return
        self._caller.append((at, rate, samples))
        self.pending_bytes += samples.nbytes
        if self.pending_bytes > self._spill_bytes:
            self._spill()

    def bot(self, samples: Audio, rate: int, at: float) -> None:
        """Reply audio (float32 mono) that starts playing for the caller at monotonic time `at`."""
        if self._closed or at - self._t0 > self._max_s:
            return
        self._bot.append((at, rate, samples))
        self.pending_bytes += samples.nbytes
        if self.pending_bytes > self._spill_bytes:
            self._spill()

    def bot_stopped(self, at: float) -> None:
        """The reply was cut off at `at` (a barge-in): bot audio placed after it was never heard."""
        if not self._closed:
            self._bot.append((at, 0, None))

    async def close(self) -> Path | None:
        """Write the WAV (in the recorder's thread) and return its path; None if nothing was recorded
        or writing failed (logged). Calling it again gives the same answer."""
        if self._result is None:
            self._closed = True
            caller, bot = self._take()
            loop = asyncio.get_running_loop()
            result: asyncio.Future[Path | None] = loop.create_future()
            self._result = result

            def finish() -> None:
                path = self._finish(caller, bot)
                loop.call_soon_threadsafe(_settle, result, path)

            self._writer.submit(Piece(finish, f"the end of {self.path.name} (without it none of the recording is kept)",
                                      dropped=lambda: _settle(result, None), cleanup=self._close_files))
        return await asyncio.shield(self._result)

    def _take(self) -> tuple[list[Entry], list[Entry]]:
        caller, bot = self._caller, self._bot
        self._caller, self._bot, self.pending_bytes = [], [], 0
        return caller, bot

    def _spill(self) -> None:
        size = self.pending_bytes
        if self.behind_bytes + size > self._max_behind:
            self._drop_pending()
            return
        with self._behind_lock:
            self.behind_bytes += size
        caller, bot = self._take()
        self._writer.submit(Piece(lambda: self._write_spilled(size, caller, bot),
                                  f"{_seconds(caller, bot):.1f} s of audio of {self.path.name}",
                                  dropped=lambda: self._spill_dropped(size, caller, bot)))

    def _drop_pending(self) -> None:
        """The thread is max_behind_bytes behind: the audio held here is dropped (a bot_stopped mark is
        kept, it costs nothing), so the recording has silence there and memory stays bounded."""
        if not self.dropped_s:
            log.warning("recording %s: the disk is %d bytes behind; audio is dropped until it catches up",
                        self.path.name, self.behind_bytes)
        self.dropped_s += _seconds(self._caller, self._bot)  # the stretch of the call the recording misses
        self._caller.clear()
        self._bot[:] = [e for e in self._bot if e[2] is None]
        self.pending_bytes = 0

    def _spill_dropped(self, size: int, caller: list[Entry], bot: list[Entry]) -> None:
        """The writer dropped this spill unwritten (its queue was full): a gap, as in _drop_pending. Its
        bot_stopped marks go back in front of the audio held here, so a barge-in still silences the bot."""
        with self._behind_lock:
            self.behind_bytes -= size
        self.dropped_s += _seconds(caller, bot)
        if not self._closed:
            self._bot[:0] = [e for e in bot if e[2] is None]

    def _write_spilled(self, size: int, caller: list[Entry], bot: list[Entry]) -> None:
        try:
            self._write_entries(caller, bot)
        finally:
            with self._behind_lock:
                self.behind_bytes -= size

    # Everything below runs in the recorder's thread.

    def _write_entries(self, caller: list[Entry], bot: list[Entry]) -> None:
        try:
            for track, entries in zip(self._tracks, (caller, bot), strict=True):
                for entry in entries:
                    self._place(track, entry)
                self._write_run(track)
        except Exception:
            log.exception("recording %s: writing audio failed", self.path.name)

    def _place(self, track: _Track, entry: Entry) -> None:
        at, rate, samples = entry
        if samples is None:
            self._write_run(track)
            self._silence_from(track, round((at - self._t0) * self.rate))
            return
        duration = len(samples) / rate
        start = (at - self._t0 - (duration if track.is_caller else 0.0)) * self.rate
        cursor = track.cursor
        if cursor is not None and rate == track.last_rate and (
                start - cursor <= self._tolerance if track.is_caller else abs(start - cursor) <= self._tolerance):
            if not track.run:  # the first audio after a spill: it goes on where the last spill ended
                track.run_rate, track.run_start = rate, cursor
            track.run.append(samples)
        else:
            self._write_run(track)
            if track.is_caller and cursor is not None and start < cursor:
                start = cursor  # caller audio never overlaps itself: a burst is laid end to end
            track.run, track.run_rate, track.run_start = [samples], rate, start
            cursor = start
        track.last_rate = rate
        track.cursor = cursor + len(samples) * self.rate / rate

    def _write_run(self, track: _Track) -> None:
        if not track.run:
            return
        audio = resample(np.concatenate(track.run).astype(np.float32, copy=False), track.run_rate, self.rate)
        track.run = []
        start = round(track.run_start)
        if start < 0:
            audio, start = audio[-start:], 0
        audio = audio[: max(0, round(self._max_s * self.rate) - start)]
        if not len(audio):
            return
        pcm = (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2")
        if track.file is None:
            # open for the whole call, closed by _finish; unnamed, so even a crash leaves nothing behind
            track.file = tempfile.TemporaryFile(dir=self.path.parent)  # noqa: SIM115
        os.pwrite(track.file.fileno(), pcm.tobytes(), 2 * start)
        track.end = max(track.end, start + len(pcm))

    def _silence_from(self, track: _Track, start: int) -> None:
        start = max(0, start)
        if track.file is not None and start < track.end:
            os.pwrite(track.file.fileno(), bytes(2 * (track.end - start)), 2 * start)
            track.end = start
        track.cursor = None

    def _finish(self, caller: list[Entry], bot: list[Entry]) -> Path | None:
        try:
            self._write_entries(caller, bot)
            length = max(t.end for t in self._tracks)
            if length == 0:
                return None
            part = self.path.with_name(self.path.name + ".part")
            with wave.open(str(part), "wb") as wav:
                wav.setnchannels(2)
                wav.setsampwidth(2)
                wav.setframerate(self.rate)
                step = 1 << 20
                for first in range(0, length, step):
                    count = min(step, length - first)
                    frames = np.zeros((count, 2), dtype="<i2")
                    for channel, track in enumerate(self._tracks):
                        frames[:, channel] = self._read(track, first, count)
                    wav.writeframes(frames.tobytes())
            part.replace(self.path)
            return self.path
        except Exception:
            log.exception("recording %s: writing the WAV failed", self.path.name)
            return None
        finally:
            self._close_files()

    def _close_files(self) -> None:
        for track in self._tracks:
            if track.file is not None:
                track.file.close()
                track.file = None

    @staticmethod
    def _read(track: _Track, first: int, count: int) -> np.ndarray:
        out = np.zeros(count, dtype="<i2")
        if track.file is not None and first < track.end:
            data = os.pread(track.file.fileno(), 2 * min(count, track.end - first), 2 * first)
            out[: len(data) // 2] = np.frombuffer(data, dtype="<i2")
        return out


def _seconds(caller: list[Entry], bot: list[Entry]) -> float:
    """The stretch of the call the entries cover: the longer of the two channels' audio."""
    return max(sum(len(samples) / rate for _, rate, samples in entries if samples is not None)
               for entries in (caller, bot))


def _settle(result: asyncio.Future[Path | None], path: Path | None) -> None:
    if not result.done():
        result.set_result(path)
