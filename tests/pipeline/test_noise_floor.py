"""The noise floor gate (pipeline/noise_floor.py): unit tests on made-up levels and probabilities, and one
on the real Silero VAD with espeak-ng voices talking behind a caller."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.config import CallerLevelConfig, EndpointingConfig, NoiseFloorConfig
from pipeline.endpointing import replay
from pipeline.noise_floor import NoiseFloor
from tests.speech import speech_samples

WINDOW_MS = 32.0
N = 512


def window(level_dbfs: float, seed: int = 0) -> np.ndarray:
    """A window of noise whose RMS is `level_dbfs`."""
    x = np.random.default_rng(seed).standard_normal(N)
    return (x / np.sqrt(np.mean(x ** 2)) * 10 ** (level_dbfs / 20)).astype(np.float32)


def feed(floor: NoiseFloor, windows: list[tuple[float, float]], talking: bool = False) -> list[float]:
    return [floor.gate(p, window(level, i), talking) for i, (level, p) in enumerate(windows)]


def test_a_background_that_sounds_like_speech_is_not_the_caller() -> None:
    floor = NoiseFloor(NoiseFloorConfig(enabled=True, smooth_ms=0), WINDOW_MS)
    gated = feed(floor, [(-30.0, 0.95)] * 100)  # other people talking, 3.2 s
    assert floor.fooled and abs((floor.floor_db or 0) + 30.0) < 0.5
    assert all(g == 0.0 for g in gated[40:])
    assert floor.gate(0.95, window(-22.0), talking=False) == 0.95  # the caller, 8 dB above it
    assert floor.gate(0.95, window(-26.0), talking=False) == 0.0  # 4 dB: not enough to begin a turn ...
    assert floor.gate(0.95, window(-26.0), talking=True) == 0.95  # ... but enough to go on with one


def test_steady_noise_the_vad_ignores_is_left_to_it() -> None:
    floor = NoiseFloor(NoiseFloorConfig(enabled=True, smooth_ms=0), WINDOW_MS)
    feed(floor, [(-30.0, 0.02)] * 100)  # a fan: loud, but not speech to the VAD
    assert not floor.fooled
    assert floor.gate(0.9, window(-29.0), talking=False) == 0.9


def test_a_quiet_line_a_first_second_and_the_setting_off_are_left_to_the_vad() -> None:
    floor = NoiseFloor(NoiseFloorConfig(enabled=True, smooth_ms=0), WINDOW_MS)
    assert feed(floor, [(-30.0, 0.95)] * 30) == [0.95] * 30  # the line's first second: a caller may speak at once
    assert floor.gate(0.95, np.zeros(N, dtype=np.float32), talking=False) == 0.95  # below quiet_dbfs
    off = NoiseFloor(NoiseFloorConfig(enabled=False, smooth_ms=0), WINDOW_MS)
    assert feed(off, [(-30.0, 0.95)] * 100) == [0.95] * 100


def test_the_callers_own_long_turn_never_becomes_the_floor() -> None:
    """Windows heard while the caller talks are not counted (after the first second): twenty seconds of
    their speech leave the floor at the quiet room's level, and none of it is gated."""
    floor = NoiseFloor(NoiseFloorConfig(enabled=True, smooth_ms=0), WINDOW_MS)
    feed(floor, [(-60.0, 0.01)] * 60)
    speech = [(-25.0 + 4 * np.sin(i / 3), 0.97) for i in range(625)]
    assert all(g > 0 for g in feed(floor, speech, talking=True))
    assert not floor.fooled and (floor.floor_db or 0) < -55


def test_a_caller_who_speaks_as_the_line_opens_is_not_their_own_floor() -> None:
    """The line's first second is the caller talking: none of it is learned (it would put the floor at their own
    voice, and their quieter words after it would be taken for silence)."""
    floor = NoiseFloor(NoiseFloorConfig(enabled=True, smooth_ms=0), WINDOW_MS)
    feed(floor, [(-60.0, 0.01)] * 3)  # the line opens
    speech = [(-25.0 + 4 * np.sin(i / 3), 0.97) for i in range(60)]
    assert all(g > 0 for g in feed(floor, speech, talking=True))
    assert floor.gate(0.9, window(-29.0), talking=True) == 0.9  # a quieter word, after the first second
    assert floor.floor_db is None  # no floor yet: too little of the line was heard outside the turn


def test_a_line_that_opens_on_other_people_talking_learns_them_after_first_turn_s() -> None:
    """Other people talking from the line's first window start a turn at once; after first_turn_s of it with no
    pause, the talk is taken for the background, and a turn of it ends."""
    floor = NoiseFloor(NoiseFloorConfig(enabled=True, smooth_ms=0, first_turn_s=4.0), WINDOW_MS)
    feed(floor, [(-30.0, 0.95)] * 5)  # before the VAD's turn begins
    talk = feed(floor, [(-30.0, 0.95)] * 130, talking=True)
    assert all(g == 0.95 for g in talk[:120]) and talk[-1] == 0.0  # 4 s: 125 windows
    assert floor.fooled and abs((floor.floor_db or 0) + 30.0) < 0.5


def test_a_question_over_other_voices_ends_where_the_caller_stops(tmp_path: Path) -> None:
    """The real Silero VAD hears four espeak-ng voices talking 10 dB below the caller as speech throughout:
    without the gate the turn does not end before the babble does; with it, it ends within a second of the
    caller's last word."""
    from models.speech.vad_silero import SileroVad

    chatter = ["The train was late again so we took the bus along the river to town.",
               "She kept the old letters in a box under the stairs for many years.",
               "They will paint the kitchen next week when the weather is dry and warm.",
               "He could not remember where he left the keys after the long dinner."]
    rate = 16000
    babble = np.zeros(rate * 14)
    for n, text in enumerate(chatter):
        voice = speech_samples(text, tmp_path, rate).astype(np.float64) / 32768
        track = np.tile(voice, len(babble) // len(voice) + 1)
        babble += np.roll(track[:len(babble)], n * 7919) / np.sqrt(np.mean(voice ** 2))
    question = speech_samples("Can you tell me when the museum opens on Sunday?", tmp_path, rate) / 32768
    loud = np.flatnonzero(np.abs(question) > 0.01)
    speech_rms = np.sqrt(np.mean(question[loud[0]:loud[-1]] ** 2))
    audio = babble / np.sqrt(np.mean(babble ** 2)) * speech_rms * 10 ** (-10 / 20)
    at = 3 * rate
    audio[at:at + len(question)] += question
    true_end_ms = 1000 * (at + loud[-1]) / rate
    vad = SileroVad()

    def turn_ends(enabled: bool) -> list[float]:
        config = EndpointingConfig(noise_floor=NoiseFloorConfig(enabled=enabled),
                                   caller_level=CallerLevelConfig(enabled=False))  # the floor alone
        samples = audio.astype(np.float32)
        decisions = replay(vad.new_stream().probabilities(samples), samples, config, N, WINDOW_MS)
        return [d.audio_ms for d in decisions if d.kind == "stop"]

    assert not [end for end in turn_ends(False) if end > at * 1000 / rate]  # the babble never stops
    after = [end for end in turn_ends(True) if end > true_end_ms - 300]
    assert after and after[0] < true_end_ms + 1000, (after, true_end_ms)


def test_a_question_asked_as_the_line_opens_is_heard_to_its_end(tmp_path: Path) -> None:
    """On a clean line, a caller who talks at once is one turn, ending where they stop, with the gate on as off
    (the real Silero VAD; three end-to-end calls once lost their last words here)."""
    from models.speech.vad_silero import SileroVad

    rate = 16000
    vad = SileroVad()
    for question in ["How many days are there in a week?", "How many people are in a football team?"]:
        speech = speech_samples(question, tmp_path, rate).astype(np.float32) / 32768
        audio = np.concatenate([speech, np.zeros(rate * 2, dtype=np.float32)])
        loud = np.flatnonzero(np.abs(speech) > 0.01)
        probabilities = vad.new_stream().probabilities(audio)
        for enabled in (False, True):
            config = EndpointingConfig(noise_floor=NoiseFloorConfig(enabled=enabled))
            decisions = replay(probabilities, audio, config, N, WINDOW_MS)
            assert [d.kind for d in decisions] == ["start", "pause", "stop"], (question, enabled, decisions)
            assert decisions[-1].audio_ms > 1000 * loud[-1] / rate - 100, (question, enabled, decisions)
