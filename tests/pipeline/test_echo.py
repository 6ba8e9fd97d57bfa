"""Echo cancellation (pipeline/echo.py): what was played placed on the clock, the caller's audio placed on it, and
speexdsp's canceller on real speech (espeak-ng) heard back through a room, alone and with a caller over it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import EchoConfig
from pipeline.echo import RATE, DelayEstimator, EchoCanceller, MicTimeline, PlayedTrack, available, cancel_echo
from pipeline.events import AudioFrame
from tests.speakerphone import room_response
from tests.speech import speech_samples

needs_speexdsp = pytest.mark.skipif(not available(), reason="libspeexdsp is not installed (scripts/setup.sh does it)")


def db(x: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(np.asarray(x, dtype=np.float64) ** 2) + 1e-15))


def test_chunks_played_one_after_another_are_laid_end_to_end() -> None:
    track = PlayedTrack(keep_s=2.0)
    a = np.full(640, 0.1, dtype=np.float32)
    track.bot(a, RATE, 100.0)
    track.bot(a * 2, RATE, 100.0 + 640 / RATE + 0.0004)  # the playhead's rounding: still the next sample
    got = track.read(0, 1400)
    assert np.allclose(got[:640], 0.1) and np.allclose(got[640:1280], 0.2) and np.all(got[1280:] == 0)
    assert np.all(track.read(-100, 100) == 0)  # before anything played


def test_a_chunk_later_than_the_tolerance_leaves_silence_before_it_and_a_cut_silences_the_rest() -> None:
    track = PlayedTrack(keep_s=2.0, tolerance_s=0.05)
    track.bot(np.full(320, 0.5, dtype=np.float32), RATE, 10.0)
    track.bot(np.full(320, 0.5, dtype=np.float32), RATE, 10.5)  # half a second later: a new stretch
    got = track.read(0, track.index(10.5) + 320)
    assert np.all(got[320:track.index(10.5)] == 0) and np.allclose(got[track.index(10.5):], 0.5)
    track.bot_stopped(10.5 + 0.01)  # cut 10 ms into the second chunk: the rest was never heard
    cut = track.index(10.51)
    assert np.allclose(track.read(track.index(10.5), cut - track.index(10.5)), 0.5)
    assert np.all(track.read(cut, 100) == 0)


def test_audio_at_another_rate_is_resampled_and_old_audio_is_forgotten() -> None:
    track = PlayedTrack(keep_s=1.0)
    t = np.arange(8000) / 8000
    track.bot(np.sin(2 * np.pi * 440 * t).astype(np.float32), 8000, 0.0)  # a second at 8 kHz
    got = track.read(0, RATE)
    assert abs(db(got[2000:14000]) - db(np.sin(2 * np.pi * 440 * t))) < 1.0
    track.bot(np.zeros(8000, dtype=np.float32), 8000, 1.0)
    assert np.all(track.read(0, 100) == 0)  # more than keep_s ago


def test_the_least_delayed_frame_places_the_callers_audio() -> None:
    line = MicTimeline(restart_s=1.0)
    assert line.place(320, 5.020) == pytest.approx(5.0)
    assert line.place(320, 5.080) == pytest.approx(5.02)  # 40 ms late: still the sample after
    assert line.place(320, 5.050) == pytest.approx(5.03)  # earlier than the first said: it was late
    assert line.anchor == pytest.approx(5.0 - 0.01)
    assert line.place(320, 9.0) == pytest.approx(9.0 - 0.02)  # after 4 s of nothing: a new stretch


@needs_speexdsp
def test_the_bots_echo_is_cancelled_and_the_caller_is_kept(tmp_path: Path) -> None:
    bot = speech_samples("The capital of France is Paris. It is known for the Eiffel Tower, its museums, its "
                         "cafes and its long history. Is there anything else you would like to know about it?",
                         tmp_path).astype(np.float32) / 32768
    caller = speech_samples("Sorry, can I ask about trains instead?", tmp_path).astype(np.float32) / 32768
    n = len(bot) // 320 * 320
    bot = bot[:n]
    delay = int(0.2 * RATE)
    echo = np.convolve(np.concatenate([np.zeros(delay, np.float32), bot]), room_response(RATE, 0.3) * 10 ** (-10 / 20))
    echo = echo[:n].astype(np.float32)
    near = np.zeros(n, dtype=np.float32)
    at = n - len(caller) - RATE // 2
    near[at:at + len(caller)] = caller  # the caller talks over the end of it
    canceller = EchoCanceller(tail_ms=250)
    played = np.concatenate([np.zeros(delay - 480, np.float32), bot])[:n]  # as cancel_echo feeds it: 30 ms early
    out = np.concatenate([canceller.process((echo + near)[i:i + 320], played[i:i + 320]) for i in range(0, n, 320)])
    assert len(out) == n
    learned = slice(3 * RATE, at)  # after three seconds of the bot alone
    assert db(echo[learned]) - db(out[learned]) > 25
    over = slice(at, at + len(caller))
    lag = 160  # the residual suppressor's frame
    kept = np.corrcoef(out[at + lag:at + len(caller)], near[at:at + len(caller) - lag])[0, 1]
    assert kept > 0.8, kept
    assert abs(db(out[over]) - db(near[over])) < 3


@needs_speexdsp
def test_without_anything_played_the_callers_audio_passes_unchanged(tmp_path: Path) -> None:
    caller = speech_samples("Hello, I would like to book a table.", tmp_path).astype(np.float32) / 32768
    canceller = EchoCanceller()
    out = np.concatenate([canceller.process(caller[i:i + 320], np.zeros(len(caller[i:i + 320]), np.float32))
                          for i in range(0, len(caller), 320)])
    whole = len(out)  # the same, 10 ms later, less what lies under 100 Hz (the canceller's DC notch)
    assert np.corrcoef(out[160:whole], caller[:whole - 160])[0, 1] > 0.95
    assert abs(db(out[160:whole]) - db(caller[:whole - 160])) < 0.5


BOT = ("The capital of France is Paris. It is known for the Eiffel Tower, its museums, its cafes and its long "
       "history. Is there anything else you would like to know about it?")


def on_the_line(bot: np.ndarray, delay_ms: int, level_db: float, lead_s: float = 0.5
                ) -> tuple[list[tuple[float, np.ndarray]], np.ndarray]:
    """The bot's reply played in 40 ms chunks from T0 + lead_s (their clock times), and the caller's microphone
    from T0 hearing it `delay_ms` later through a room, `level_db` below (a speakerphone)."""
    n = len(bot) // 640 * 640
    chunks = [(T0 + lead_s + i / RATE, bot[i:i + 640]) for i in range(0, n, 640)]
    played = np.concatenate([np.zeros(int(lead_s * RATE), np.float32), bot[:n], np.zeros(RATE, np.float32)])
    delayed = np.concatenate([np.zeros(delay_ms * RATE // 1000, np.float32), played])
    mic = np.convolve(delayed, room_response(RATE, 0.3) * 10 ** (level_db / 20))[:len(played)]
    return chunks, mic.astype(np.float32)


T0 = 5000.0


async def through(chunks: list[tuple[float, np.ndarray]], mic: np.ndarray, track: PlayedTrack
                  ) -> list[AudioFrame]:
    """The microphone's 20 ms frames through cancel_echo, each arriving 3 ms after its last sample, the player
    placing the reply's chunks 300 ms ahead of playback as it does."""
    chunks = list(chunks)

    async def frames() -> AsyncIterator[AudioFrame]:
        for i in range(0, len(mic) // 320 * 320, 320):
            now = T0 + (i + 320) / RATE
            while chunks and chunks[0][0] < now + 0.3:
                at, chunk = chunks.pop(0)
                track.bot(chunk, RATE, at)
            yield AudioFrame(mic[i:i + 320], now + 0.003)

    return [frame async for frame in cancel_echo(frames(), track, EchoConfig())]


@needs_speexdsp
@pytest.mark.parametrize("delay_ms", [200, 700])
async def test_the_echo_is_found_behind_the_playhead_and_cancelled(tmp_path: Path, delay_ms: int) -> None:
    bot = speech_samples(BOT, tmp_path).astype(np.float32) / 32768
    chunks, mic = on_the_line(bot, delay_ms, -10.0)
    out = np.concatenate([f.samples for f in await through(chunks, mic, PlayedTrack())])
    late = slice(4 * RATE, len(out) - RATE)  # from four seconds on
    assert db(mic[late]) - db(out[late]) > 20


async def test_a_line_without_echo_passes_untouched(tmp_path: Path) -> None:
    bot = speech_samples(BOT, tmp_path).astype(np.float32) / 32768
    caller = speech_samples("Hello, I would like to book a table for two tonight, please.", tmp_path)
    chunks, _ = on_the_line(bot, 200, -10.0)
    mic = np.zeros(len(bot) + RATE, np.float32)
    mic[RATE:RATE + len(caller)] = caller.astype(np.float32) / 32768  # the caller talks over the bot, no echo
    frames = await through(chunks, mic, PlayedTrack())
    assert np.array_equal(np.concatenate([f.samples for f in frames]), mic[:len(mic) // 320 * 320])


def test_the_delay_is_not_found_in_unrelated_sound(tmp_path: Path) -> None:
    bot = speech_samples(BOT, tmp_path).astype(np.float32) / 32768
    caller = speech_samples("I would like to book a table for two tonight at eight, please, by the window if you "
                            "can, and my name is Alex.", tmp_path).astype(np.float32) / 32768
    estimator = DelayEstimator()
    n = min(len(bot), len(caller)) // 320 * 320
    played = np.concatenate([np.zeros(estimator.lags + estimator.window, np.float32), bot[:n]])
    found = []
    for i in range(0, n, 320):
        estimator.hear(caller[i:i + 320])
        if estimator.due():
            end = i + 320 + estimator.lags + estimator.window  # in `played`
            found.append(estimator.estimate(played[end - estimator.window - estimator.lags:end]))
    assert found and all(f is None for f in found)
