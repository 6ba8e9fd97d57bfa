"""The caller's level gate (pipeline/caller_level.py): unit tests on made-up levels and probabilities, and one on the
real Silero VAD with one espeak-ng voice reading on behind a caller, as a television would."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.caller_level import CallerLevel
from pipeline.config import CallerLevelConfig, EndpointingConfig
from pipeline.endpointing import replay
from tests.speech import speech_samples

WINDOW_MS = 32.0
THRESHOLD = 0.5
CONFIG = CallerLevelConfig(enabled=True, start_margin_db=9, stop_margin_db=12, min_speech_ms=320, background_ms=320,
                           recent_s=10)


def turn(gate: CallerLevel, level_db: float, windows: int = 20) -> None:
    """A turn of the caller's speech at `level_db`, ended."""
    for _ in range(windows):
        gate.gate(0.9, level_db, True, True, THRESHOLD)
    gate.turn_ended()


def kept_out(gate: CallerLevel, level_db: float, windows: int) -> list[float]:
    """Speech outside the caller's turns at `level_db`: what the gate passes on."""
    return [gate.gate(0.9, level_db, False, False, THRESHOLD) for _ in range(windows)]


def test_until_the_caller_has_spoken_the_vad_decides() -> None:
    gate = CallerLevel(CONFIG, WINDOW_MS)
    assert kept_out(gate, -60.0, 5) == [0.9] * 5
    assert gate.level_db is None


def test_a_voice_far_below_the_caller_starts_no_turn() -> None:
    gate = CallerLevel(CONFIG, WINDOW_MS)
    turn(gate, -20.0)
    assert gate.level_db == -20.0
    assert kept_out(gate, -31.0, 3) == [0.0] * 3  # 11 dB below: a television
    assert kept_out(gate, -27.0, 3) == [0.9] * 3  # 7 dB below: the caller, a little quieter


def test_a_turn_too_short_to_tell_sets_no_level() -> None:
    gate = CallerLevel(CONFIG, WINDOW_MS)
    turn(gate, -20.0, windows=5)  # 160 ms of speech: a cough, a word
    assert gate.level_db is None


def test_the_loudest_of_the_last_turns_is_the_callers_level_and_a_shout_is_forgotten() -> None:
    gate = CallerLevel(CONFIG, WINDOW_MS)
    turn(gate, -30.0)  # the line opened on the television
    turn(gate, -18.0)  # the caller
    assert gate.level_db == -18.0
    for _ in range(3):
        turn(gate, -24.0)
    assert gate.level_db == -24.0


def test_a_turn_ends_over_a_quieter_voice_only_where_one_was_heard() -> None:
    gate = CallerLevel(CONFIG, WINDOW_MS)
    turn(gate, -20.0)
    talking = [gate.gate(0.9, -35.0, True, True, THRESHOLD) for _ in range(3)]
    assert talking == [0.9] * 3  # a quiet line: the fading syllable is the caller's, the VAD decides
    gate.turn_ended()
    kept_out(gate, -32.0, 10)  # 320 ms of a quieter voice outside the caller's turns
    assert gate.background
    assert gate.gate(0.9, -35.0, True, True, THRESHOLD) == 0.0
    assert gate.gate(0.9, -25.0, True, True, THRESHOLD) == 0.9  # within the stop margin: the caller


def test_a_quieter_voice_heard_long_ago_is_forgotten() -> None:
    gate = CallerLevel(CONFIG, WINDOW_MS)
    turn(gate, -20.0)
    kept_out(gate, -32.0, 10)
    for _ in range(round(10_000 / WINDOW_MS)):  # 10 s of silence
        gate.gate(0.0, -70.0, False, False, THRESHOLD)
    assert not gate.background


def test_off_passes_everything() -> None:
    gate = CallerLevel(CallerLevelConfig(enabled=False), WINDOW_MS)
    turn(gate, -20.0)
    assert kept_out(gate, -60.0, 3) == [0.9] * 3


def test_a_television_behind_the_caller_starts_no_turn_after_their_question(tmp_path: Path) -> None:
    """One espeak-ng voice reading on 10 dB below the caller, falling silent between its sentences: without the gate
    it starts turns of its own after the caller's question (on a call their words would wait for it); with it, the
    question's turn ends within a second of the caller's last word and no other begins."""
    from models.speech.vad_silero import SileroVad

    rate = 16000
    lines = ["The weather tomorrow will be cloudy with some rain in the north.",
             "In other news the city council met last night to discuss the new bridge.",
             "Sports now, and the home team won their third game in a row on Sunday."]
    pieces = []
    for text in lines * 3:
        pieces += [speech_samples(text, tmp_path, rate).astype(np.float64) / 32768, np.zeros(rate // 4)]
    television = np.concatenate(pieces)[:rate * 20]
    question = speech_samples("Can you tell me when the museum opens on Sunday?", tmp_path, rate) / 32768
    loud = np.flatnonzero(np.abs(question) > 0.01)
    speech_rms = np.sqrt(np.mean(question[loud[0]:loud[-1]] ** 2))
    audio = television / np.sqrt(np.mean(television ** 2)) * speech_rms * 10 ** (-10 / 20)
    at = 2 * rate
    audio[at:at + len(question)] += question
    true_end_ms = 1000 * (at + loud[-1]) / rate
    vad = SileroVad()
    samples = audio.astype(np.float32)
    probabilities = vad.new_stream().probabilities(samples)

    def decisions(enabled: bool) -> list[tuple[str, float]]:
        config = EndpointingConfig(caller_level=CallerLevelConfig(enabled=enabled, start_margin_db=7,
                                                                  stop_margin_db=10))
        return [(d.kind, d.audio_ms) for d in replay(probabilities, samples, config, 512, WINDOW_MS)]

    def after_question(found: list[tuple[str, float]]) -> tuple[float | None, list[float]]:
        ends = [at for kind, at in found if kind == "stop" and at > true_end_ms - 300]
        starts = [at for kind, at in found if kind == "start" and ends and at > ends[0]]
        return (ends[0] if ends else None), starts

    _, starts_off = after_question(decisions(False))
    assert starts_off  # the television talks on in turns of its own
    end, starts_on = after_question(decisions(True))
    assert end is not None and end < true_end_ms + 1000, (end, true_end_ms)
    assert not starts_on, starts_on


def test_a_caller_who_moved_away_is_heard_again_after_memory_s() -> None:
    gate = CallerLevel(CallerLevelConfig(enabled=True, memory_s=5), WINDOW_MS)
    turn(gate, -20.0)
    assert kept_out(gate, -35.0, 3) == [0.0] * 3  # 15 dB quieter: not heard
    for _ in range(round(5_000 / WINDOW_MS)):  # 5 s of the line without a turn of theirs
        gate.gate(0.0, -70.0, False, False, THRESHOLD)
    assert gate.level_db is None
    assert kept_out(gate, -35.0, 3) == [0.9] * 3


def test_over_a_quieter_voice_a_pause_resumes_on_speech_not_on_one_loud_window() -> None:
    gate = CallerLevel(CONFIG, WINDOW_MS)
    turn(gate, -20.0)
    kept_out(gate, -32.0, 10)  # a quieter voice heard
    paused = [gate.gate(0.9, -24.0, True, False, THRESHOLD), gate.gate(0.9, -32.0, True, False, THRESHOLD)]
    assert paused == [0.0, 0.0]  # its loudest syllable does not resume the pause
    resumed = [gate.gate(0.9, -22.0, True, False, THRESHOLD) for _ in range(6)]  # the caller goes on
    assert resumed == [0.0] * 4 + [0.9] * 2  # after resume_ms (160 ms: 5 windows)


def test_a_pause_after_the_callers_own_start_still_waits_for_speech() -> None:
    """The windows that started the turn do not count towards resuming its pauses."""
    gate = CallerLevel(CONFIG, WINDOW_MS)
    turn(gate, -20.0)
    kept_out(gate, -32.0, 10)  # a quieter voice heard
    assert kept_out(gate, -21.0, 6) == [0.9] * 6  # the caller starts a turn
    for _ in range(20):
        gate.gate(0.9, -20.0, True, True, THRESHOLD)  # and talks
    assert gate.gate(0.9, -24.0, True, False, THRESHOLD) == 0.0  # in the pause, one loud window of the voice


def test_in_a_pause_a_window_the_vad_doubts_is_left_to_it() -> None:
    gate = CallerLevel(CONFIG, WINDOW_MS)
    turn(gate, -20.0)
    kept_out(gate, -32.0, 10)
    assert gate.gate(0.4, -22.0, True, False, THRESHOLD) == 0.4  # between the thresholds: the endpointer's hysteresis


def test_a_turn_mostly_far_below_its_own_level_hears_a_voice_behind_the_caller() -> None:
    """A call that opens on a television: one turn, the television and then the caller over it."""
    gate = CallerLevel(CONFIG, WINDOW_MS)
    for _ in range(40):
        gate.gate(0.9, -32.0, True, True, THRESHOLD)  # the television alone: level -32
    assert not gate.background
    for _ in range(15):
        gate.gate(0.9, -18.0, True, True, THRESHOLD)  # the caller: the turn's level rises to theirs
    assert gate.background  # most of the turn is more than stop_margin_db below it
    assert gate.gate(0.9, -31.0, True, True, THRESHOLD) == 0.0
    assert gate.gate(0.9, -20.0, True, True, THRESHOLD) == 0.9


def test_a_callers_own_turn_on_a_quiet_line_hears_no_voice_behind_them() -> None:
    gate = CallerLevel(CONFIG, WINDOW_MS)
    levels = [-18.0, -20.0, -22.0, -24.0, -26.0, -28.0, -32.0] * 6  # syllables rising and fading, a few far down
    for level in levels:
        gate.gate(0.9, level, True, True, THRESHOLD)
    assert not gate.background

