"""Recordings: a stereo 16 kHz WAV, the caller left and the bot right, each placed on the call's
timeline by the times it was handed over with; held in memory only up to a bound."""

from __future__ import annotations

import wave
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from app.store import CallRecorder
from app.store.recording_writer import Piece
from pipeline.audio import resample

RATE = 16000
T0 = 500.0  # the monotonic clock at the call's start


def tone(seconds: float, rate: int = RATE, freq: float = 440.0, level: float = 0.5) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return (level * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def read_wav(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with wave.open(str(path), "rb") as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (2, 2, RATE)
        frames = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").reshape(-1, 2)
    return frames[:, 0].astype(np.float32) / 32767, frames[:, 1].astype(np.float32) / 32767


def first_sound(channel: np.ndarray, threshold: float = 0.05) -> int:
    loud = np.flatnonzero(np.abs(channel) > threshold)
    return int(loud[0]) if len(loud) else -1


def feed_caller(recorder: CallRecorder, audio: np.ndarray, start: float, rate: int = RATE,
                frame_s: float = 0.02) -> None:
    """Caller audio in frames, each handed over as it finishes arriving."""
    step = round(frame_s * rate)
    for i in range(0, len(audio), step):
        frame = audio[i:i + step]
        recorder.caller(frame, rate, at=start + (i + len(frame)) / rate)


async def test_caller_left_bot_right_aligned_by_time(tmp_path: Path) -> None:
    recorder = CallRecorder(tmp_path / "c.wav", T0)
    feed_caller(recorder, tone(0.5, freq=300), start=T0 + 0.2)
    bot = tone(0.6, rate=24000, freq=800)  # TTS at 24 kHz: resampled to the recording's rate
    for i in range(0, len(bot), 2400):  # 100 ms chunks, each at the time it starts playing
        recorder.bot(bot[i:i + 2400], 24000, at=T0 + 1.0 + i / 24000)
    path = await recorder.close()
    assert path == tmp_path / "c.wav"
    left, right = read_wav(path)
    assert len(left) == round(1.6 * RATE)
    assert abs(first_sound(left) - round(0.2 * RATE)) <= 2
    assert first_sound(right) == pytest.approx(16000, abs=2)  # the bot tone placed at t=1.0 s
    assert np.abs(right[: 16000 - 2]).max() < 0.01 and np.abs(left[round(0.7 * RATE) + 2:]).max() < 0.01
    # the bot's chunks join without gaps: its tone is continuous from 1.0 s to 1.6 s
    expected = resample(bot, 24000, RATE)
    got = right[16000:16000 + len(expected)]
    assert np.abs(got[200:-200] - expected[200:-200]).max() < 0.02
    assert await recorder.close() == path  # closing again: the same file


async def test_caller_frames_play_end_to_end_through_jitter_and_a_gap(tmp_path: Path) -> None:
    recorder = CallRecorder(tmp_path / "c.wav", T0)
    speech = tone(1.0, freq=250)
    step = 320
    for n, i in enumerate(range(0, len(speech), step)):  # arrival jitter of up to 30 ms
        jitter = 0.03 * ((n * 7) % 5) / 4
        recorder.caller(speech[i:i + step], RATE, at=T0 + (i + step) / RATE + jitter)
    feed_caller(recorder, tone(0.3, freq=600), start=T0 + 2.0)  # after 1 s of nothing
    left, _ = read_wav(await recorder.close() or Path("missing"))
    assert np.abs(left[:RATE] - (np.round(speech * 32767) / 32767)).max() < 1e-3  # no gap, no overlap
    assert np.abs(left[RATE + 800: 2 * RATE - 800]).max() < 0.01  # the second stretch starts at 2.0 s
    assert abs(first_sound(left[RATE + 100:]) + RATE + 100 - 2 * RATE) <= 2


async def test_a_barge_in_silences_the_bot_audio_after_it_and_the_next_reply_takes_its_place(tmp_path: Path) -> None:
    recorder = CallRecorder(tmp_path / "c.wav", T0)
    recorder.bot(tone(2.0, freq=500), RATE, at=T0 + 1.0)  # sent ahead of playback: due 1.0 .. 3.0 s
    feed_caller(recorder, tone(0.5, freq=300), start=T0 + 1.5)  # the caller talks over it
    recorder.bot_stopped(at=T0 + 1.8)  # the bot stopped there
    recorder.bot(tone(0.5, freq=900), RATE, at=T0 + 2.5)  # the next reply
    left, right = read_wav(await recorder.close() or Path("missing"))
    overlap = slice(round(1.5 * RATE), round(1.8 * RATE))
    assert np.abs(left[overlap]).max() > 0.4 and np.abs(right[overlap]).max() > 0.4  # both heard at once
    assert np.abs(right[round(1.8 * RATE) + 2: round(2.5 * RATE) - 2]).max() < 0.01
    assert np.abs(right[round(2.5 * RATE): round(3.0 * RATE)]).max() > 0.4


async def test_memory_is_bounded_and_a_long_call_spills_to_disk(tmp_path: Path) -> None:
    recorder = CallRecorder(tmp_path / "c.wav", T0, spill_bytes=64_000, max_s=50.0)
    frame = tone(0.02, freq=200)
    most = 0
    for n in range(3000):  # 60 s of caller audio: the last 10 s are past max_s
        recorder.caller(frame, RATE, at=T0 + (n + 1) * 0.02)
        if n % 50 == 0:
            recorder.bot(frame, RATE, at=T0 + n * 0.02)
        most = max(most, recorder.pending_bytes)
    assert most <= 64_000 + frame.nbytes
    left, right = read_wav(await recorder.close() or Path("missing"))
    assert len(left) == 50 * RATE  # cut at max_s
    windows = left.reshape(-1, 320)  # every 20 ms has its frame: no gap where the memory was spilled
    assert np.sqrt((windows**2).mean(axis=1)).min() > 0.3
    assert first_sound(right) <= 2 and np.abs(right[RATE + 400: RATE + 600]).max() < 0.01


async def test_a_call_with_no_audio_leaves_no_file(tmp_path: Path) -> None:
    recorder = CallRecorder(tmp_path / "c.wav", T0)
    assert await recorder.close() is None
    assert list(tmp_path.iterdir()) == []
    recorder.caller(tone(0.1), RATE, at=T0 + 1)  # after close: ignored


async def test_a_disk_that_falls_behind_costs_a_gap_in_the_recording_not_memory(tmp_path: Path) -> None:
    """The writing thread is held (a stalled disk) while a minute of audio comes in: what waits for
    it stays within max_behind_bytes, and the rest is dropped, counted, and silent in the WAV."""
    import threading

    from app.store import recording

    stalled = threading.Event()
    recording.SHARED_WRITER.submit(Piece(partial(stalled.wait, 30), "a stalled disk"))  # the one writing thread
    try:
        recorder = CallRecorder(tmp_path / "c.wav", T0, spill_bytes=64_000, max_behind_bytes=256_000)
        frame = tone(0.02, freq=200)
        most = 0
        for n in range(3000):  # 60 s
            recorder.caller(frame, RATE, at=T0 + (n + 1) * 0.02)
            most = max(most, recorder.pending_bytes + recorder.behind_bytes)
        assert most <= 64_000 + 256_000 + frame.nbytes
        assert recorder.dropped_s > 40
    finally:
        stalled.set()
    left, _ = read_wav(await recorder.close() or Path("missing"))
    assert np.sqrt((left[:RATE] ** 2).mean()) > 0.3  # what was queued before the stall is there
    assert np.abs(left[30 * RATE:31 * RATE]).max() < 0.01  # then a gap
