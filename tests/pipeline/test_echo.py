"""Echo cancellation (pipeline/echo.py): what was played placed on the clock, the caller's audio placed on it, and
speexdsp's canceller on real speech (espeak-ng) heard back through a room, alone and with a caller over it."""

from __future__ import annotations

import logging
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


async def through(chunks: list[tuple[float, np.ndarray]], mic: np.ndarray, track: PlayedTrack,
                  config: EchoConfig | None = None) -> list[AudioFrame]:
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

    return [frame async for frame in cancel_echo(frames(), track, config or EchoConfig())]


@needs_speexdsp
@pytest.mark.parametrize("delay_ms", [10, 200, 700])
async def test_the_echo_is_found_behind_the_playhead_and_cancelled(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, delay_ms: int) -> None:
    bot = speech_samples(BOT, tmp_path).astype(np.float32) / 32768
    chunks, mic = on_the_line(bot, delay_ms, -10.0)
    with caplog.at_level(logging.INFO, logger="pipeline.echo"):
        out = np.concatenate([f.samples for f in await through(chunks, mic, PlayedTrack())])
    late = slice(4 * RATE, len(out) - RATE)  # from four seconds on
    assert db(mic[late]) - db(out[late]) > 20
    # one canceller, left to learn (a delay under margin_ms, a client on the same machine, too)
    assert sum(r.getMessage().endswith(": cancelling it") for r in caplog.records) == 1


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


def test_a_peak_at_either_end_of_the_searched_delays_is_not_taken_for_the_echo() -> None:
    """Beyond the searched delays the correlation may rise higher, and no echo comes back within 3 ms of the
    playhead: such a peak is what a tone in jittered bursts gave (bench/echo_false_find.py)."""
    noise = np.random.default_rng(7).standard_normal(3 * RATE).astype(np.float32) * 0.1
    found: dict[int, list[int | None]] = {}
    for delay in (0, 16, RATE * 100 // 1000, RATE * 50 // 1000):
        estimator = DelayEstimator(max_delay_ms=100)
        mic = np.concatenate([np.zeros(delay, np.float32), noise])[:len(noise)]
        found[delay] = []
        for i in range(0, len(noise), 320):
            estimator.hear(mic[i:i + 320])
            if estimator.due() and i + 320 >= estimator.window + estimator.lags:
                end = i + 320
                found[delay].append(estimator.estimate(noise[end - estimator.window - estimator.lags:end]))
    assert all(f is None for f in found[0] + found[16] + found[RATE * 100 // 1000]), found
    assert RATE * 50 // 1000 in found[RATE * 50 // 1000]  # within the range: found


def untouched_from(frames: list[AudioFrame], mic: np.ndarray) -> float:
    """The time (from T0) of the first of the frames from which on cancel_echo passed the microphone untouched."""
    since = len(frames)
    for k in range(len(frames) - 1, -1, -1):
        i = round((frames[k].at - 0.003 - T0) * RATE) - 320  # as `through` times them
        if not np.array_equal(frames[k].samples, mic[i:i + 320]):
            break
        since = k
    assert since < len(frames), "the last frame was not passed untouched"
    return frames[since].at - 0.003 - 320 / RATE - T0


def dropped(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "no longer in the caller's audio" in r.getMessage()]


@needs_speexdsp
async def test_an_echo_that_goes_away_is_dropped_and_the_caller_then_passes_untouched(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bot = speech_samples(BOT, tmp_path).astype(np.float32) / 32768
    chunks, mic = on_the_line(bot, 200, -10.0)
    gone = 4 * RATE  # the caller takes the phone off speakerphone: only the room's noise, 30 dB under the echo
    echo_db = db(mic[RATE:gone])
    rng = np.random.default_rng(3)
    mic[gone:] = rng.standard_normal(len(mic) - gone).astype(np.float32) * 10 ** ((echo_db - 30) / 20)
    caller = speech_samples("Sorry, can I ask about trains instead?", tmp_path).astype(np.float32) / 32768
    said = slice(int(7.5 * RATE), int(7.5 * RATE) + len(caller))  # over the bot, as loud as its echo was
    mic[said] += caller * 10 ** ((echo_db - db(caller)) / 20)
    config = EchoConfig()
    with caplog.at_level(logging.INFO, logger="pipeline.echo"):
        track = PlayedTrack()
        frames = await through(chunks, mic, track, config)
    assert len(dropped(caplog)) == 1 and track.echo_ms is None
    since = untouched_from(frames, mic)
    # unseen for drop_after_s of searched windows, once the 1 s window no longer holds the echo
    assert gone / RATE + config.drop_after_s <= since <= gone / RATE + 1.0 + config.drop_after_s + 0.25, since
    assert since < said.start / RATE
    kept = await through(chunks, mic, PlayedTrack(), EchoConfig(drop_after_s=0))  # as before the drop rule
    out = np.concatenate([f.samples for f in kept])
    assert db(out[said]) < db(mic[said]) - 20  # the caller's words held down by the gate, long after the echo went


@needs_speexdsp
async def test_an_echo_under_a_caller_talking_over_it_is_kept_until_it_goes_away(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A caller 10 dB louder than the echo talks over it for 12 s: the echo still shows at its delay (or the caller
    buries it, and the window counts neither way), and is dropped only once it has gone."""
    bot = speech_samples(BOT + " " + BOT, tmp_path).astype(np.float32) / 32768
    chunks, mic = on_the_line(bot, 200, -10.0)
    caller = speech_samples("I would like to book a table for two tonight at eight, please, by the window if you "
                            "can, and my name is Alex. Also could you tell me whether you have parking nearby and if "
                            "the kitchen is open late on Sundays.", tmp_path).astype(np.float32) / 32768
    start, gone = int(2.5 * RATE), 16 * RATE
    echo_db = db(mic[RATE:start])
    mic[start:start + len(caller)] += caller * 10 ** ((echo_db + 10 - db(caller)) / 20)
    assert start + len(caller) < gone
    noise = np.random.default_rng(4).standard_normal(len(mic) - gone).astype(np.float32)
    mic[gone:] = noise * 10 ** ((echo_db - 30) / 20)  # then the echo goes: only the room's noise
    with caplog.at_level(logging.INFO, logger="pipeline.echo"):
        frames = await through(chunks, mic, PlayedTrack())
    assert len(dropped(caplog)) == 1, dropped(caplog)
    assert untouched_from(frames, mic) >= gone / RATE + EchoConfig().drop_after_s
