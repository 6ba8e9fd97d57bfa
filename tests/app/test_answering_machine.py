"""Answering-machine detection's rules, fed made-up VAD probabilities and made tones (no models):
the beep, a short greeting and a pause, a long greeting, voicemail words, silence."""

from __future__ import annotations

import numpy as np

from app.transports.answering_machine import BeepFinder, MachineDetection, MachineDetector

RATE = 8000
WINDOW_S = 0.02  # one made-up VAD probability per 20 ms frame


def run(detector: MachineDetector, pattern: list[tuple[float, float]], audio: np.ndarray | None = None) -> None:
    """Feed (seconds, speech probability) stretches in 20 ms frames, with `audio` as the sound (silence
    by default) until a verdict."""
    frames = [p for seconds, p in pattern for _ in range(round(seconds / WINDOW_S))]
    sound = audio if audio is not None else np.zeros(len(frames) * 160, dtype=np.float32)
    for i, probability in enumerate(frames):
        if detector.feed(sound[i * 160:(i + 1) * 160], [probability], WINDOW_S) is not None:
            return


def tone(freq: float, seconds: float) -> np.ndarray:
    return (0.3 * np.sin(2 * np.pi * freq * np.arange(int(seconds * RATE)) / RATE)).astype(np.float32)


def test_a_short_greeting_then_a_pause_is_a_person() -> None:
    detector = MachineDetector(MachineDetection())
    run(detector, [(0.4, 0.0), (0.6, 0.9), (2.0, 0.0)])
    assert detector.verdict is not None and detector.verdict.kind == "human"
    assert detector.verdict.why == "short greeting" and detector.verdict.at_s <= 1.6


def test_a_greeting_that_talks_on_is_a_machine_even_with_pauses_between_sentences() -> None:
    detector = MachineDetector(MachineDetection())
    run(detector, [(0.3, 0.0), (1.2, 0.9), (0.4, 0.1), (1.0, 0.9), (0.3, 0.1), (1.0, 0.9)])
    assert detector.verdict is not None and detector.verdict.kind == "machine"
    assert detector.verdict.why == "long greeting"


def test_voicemail_words_decide_at_once() -> None:
    detector = MachineDetector(MachineDetection())
    run(detector, [(0.3, 0.0), (1.0, 0.9)])
    assert detector.verdict is None
    assert detector.heard("Hi, you've reached Dana, I can't") is not None
    assert detector.verdict is not None and (detector.verdict.kind, detector.verdict.why) == ("machine", "words")
    assert MachineDetector(MachineDetection()).heard("Hello, who is this?") is None


def test_a_beep_is_a_machine_and_its_end_is_where_the_message_may_begin() -> None:
    detector = MachineDetector(MachineDetection())
    audio = np.concatenate([np.zeros(int(0.5 * RATE), np.float32), tone(1000, 0.5), np.zeros(RATE, np.float32)])
    run(detector, [(2.0, 0.0)], audio)
    assert detector.verdict is not None and (detector.verdict.kind, detector.verdict.why) == ("machine", "beep")
    detector.feed(audio[int(1.0 * RATE):], [0.0] * 50, WINDOW_S)
    assert detector.greeting_over


def test_speech_and_noise_are_not_beeps() -> None:
    finder = BeepFinder(RATE, 0.15)
    rng = np.random.default_rng(3)
    finder.feed((0.2 * rng.standard_normal(2 * RATE)).astype(np.float32))  # noise
    sweep = np.sin(2 * np.pi * np.cumsum(np.linspace(300, 2000, RATE)) / RATE).astype(np.float32) * 0.3
    finder.feed(sweep)  # a gliding tone: never one frequency long enough
    assert finder.found_at is None
    finder.feed(tone(440, 0.1))  # too short
    finder.feed(np.zeros(800, np.float32))
    assert finder.found_at is None


def test_nobody_speaking_is_a_person_who_answered_silently() -> None:
    detector = MachineDetector(MachineDetection())
    run(detector, [(5.0, 0.0)])
    assert detector.verdict is not None and (detector.verdict.kind, detector.verdict.why) == ("human", "silence")
    assert detector.verdict.at_s == 3.0


def test_a_longer_greeting_then_a_wait_without_a_beep_is_a_person() -> None:
    detector = MachineDetector(MachineDetection())
    run(detector, [(0.3, 0.0), (2.2, 0.9), (3.0, 0.0)])  # "Good afternoon, Miller residence." and waits
    assert detector.verdict is not None and (detector.verdict.kind, detector.verdict.why) == ("human", "waited")
