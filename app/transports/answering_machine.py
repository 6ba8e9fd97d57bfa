"""Answering-machine detection for calls placed out (docs/sip.md#answering-machines): in the first
seconds after the answer, before the agent says a word, is it a person or a machine?

The evidence, as it comes (`MachineDetector.feed`, 8 kHz audio, the callee's side only):
- the greeting's length: a person says a word or two ("Hello?") and waits; a machine talks on
  ("Hi, you've reached Dana, I can't take your call right now...");
- the beep: a steady pure tone (300-2500 Hz) of at least `beep_min_s` is a machine's, and the moment
  its message may begin;
- the words: the greeting's transcript (`heard`) with a voicemail phrase in it ("leave a message",
  "not available", "after the tone") is a machine's.

Nobody speaking for `silence_s` is taken for a person who answered without a word (the agent then
speaks, as a person expects). Every verdict says when (seconds since the answer) and why."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.settings import MachineDetection
from models.protocols import Audio
from pipeline.audio import resample

MACHINE_WORDS = re.compile(
    r"leave (?:me |us )?(?:a |your )?(?:brief |short )?(?:message|name|number)|after the (?:tone|beep)|"
    r"(?:is|am|are) not available|(?:isn't|aren't|not) available|unavailable|can(?:'t|not) (?:take|come to|answer)|"
    r"voice ?mail|mailbox|reached the|you have reached|you've reached|get back to you|return your call|"
    r"at the (?:tone|beep)|record your message|away from (?:the|my) phone",
    re.IGNORECASE)


@dataclass(frozen=True)
class Verdict:
    kind: str  # "human" or "machine"
    at_s: float  # seconds of audio since the answer when it was decided
    why: str  # "short greeting", "long greeting", "beep", "words", "silence"


class BeepFinder:
    """A steady pure tone: over each 20 ms frame, the share of energy at the strongest frequency
    (with its neighbours) and that frequency; a run of frames with a share over 0.6 at the same
    frequency (within 40 Hz) is a beep."""

    FRAME = 160  # 20 ms at 8 kHz

    def __init__(self, rate: int, min_s: float) -> None:
        self.rate = rate
        self.frame = rate // 50
        self.need = max(1, round(min_s * 50))
        self.pending = np.zeros(0, dtype=np.float32)
        self.run = 0
        self.freq = 0.0
        self.window = np.hanning(self.frame * 2).astype(np.float32)
        self.frames = 0
        self.found_at: float | None = None  # seconds: when the beep's tone had lasted long enough
        self.ended_at: float | None = None  # seconds: when that beep stopped

    def feed(self, samples: Audio) -> None:
        self.pending = np.concatenate([self.pending, samples])
        while len(self.pending) >= 2 * self.frame:
            chunk, self.pending = self.pending[:2 * self.frame], self.pending[self.frame:]
            self.frames += 1
            self._frame(chunk)

    def _frame(self, chunk: Audio) -> None:
        spectrum = np.abs(np.fft.rfft(chunk * self.window)) ** 2
        freqs = np.fft.rfftfreq(len(chunk), 1 / self.rate)
        total = float(spectrum.sum())
        peak = int(np.argmax(spectrum))
        share = float(spectrum[max(0, peak - 1):peak + 2].sum()) / total if total > 0 else 0.0
        loud = float(np.sqrt(np.mean(chunk ** 2))) > 0.01
        tone = loud and share > 0.6 and 300 <= freqs[peak] <= 2500
        now = self.frames * self.frame / self.rate
        if tone and (self.run == 0 or abs(freqs[peak] - self.freq) <= 40):
            self.run += 1
            self.freq = float(freqs[peak])
            if self.run == self.need and self.found_at is None:
                self.found_at = now
        else:
            if self.found_at is not None and self.ended_at is None and self.run >= self.need:
                self.ended_at = now
            self.run = 1 if tone else 0
            self.freq = float(freqs[peak]) if tone else 0.0


class MachineDetector:
    """Feed the callee's audio from the answer on; `verdict` once decided (see the module doc)."""

    def __init__(self, config: MachineDetection, rate: int = 8000) -> None:
        self.config = config
        self.rate = rate
        self.beeps = BeepFinder(rate, config.beep_min_s)
        self.samples = 0  # audio fed, counted exactly (times are derived, never summed)
        self.window_s = 0.0  # the VAD's window
        self.speech_windows = 0  # windows of speech so far
        self.pause_windows = 0  # the current stretch of windows without speech, once speech began
        self.started = False  # someone has spoken
        self.verdict: Verdict | None = None

    @property
    def elapsed(self) -> float:
        return self.samples / self.rate

    @property
    def speech_s(self) -> float:
        return self.speech_windows * self.window_s

    @property
    def pause_run_s(self) -> float:
        return self.pause_windows * self.window_s

    def feed(self, samples: Audio, speech: list[float], window_s: float) -> Verdict | None:
        """`samples`, and the VAD's speech probabilities that became known with them, each over a
        window of `window_s` seconds (a VAD's windows need not match the frames fed)."""
        self.beeps.feed(samples)
        self.samples += len(samples)
        self.window_s = window_s
        for probability in speech:
            if probability >= self.config.speech_threshold:
                self.started = True
                self.speech_windows += 1
                self.pause_windows = 0
            elif self.started:
                self.pause_windows += 1
        if self.verdict is None:
            self.verdict = self._decide()
        return self.verdict

    def heard(self, text: str) -> Verdict | None:
        """The greeting's transcript so far: a voicemail phrase decides it."""
        if self.verdict is None and MACHINE_WORDS.search(text):
            self.verdict = Verdict("machine", round(self.elapsed, 2), "words")
        return self.verdict

    def _decide(self) -> Verdict | None:
        c, at = self.config, round(self.elapsed, 2)
        if self.beeps.found_at is not None:
            return Verdict("machine", at, "beep")
        if self.speech_s >= c.machine_speech_s:
            return Verdict("machine", at, "long greeting")
        if self.started and self.pause_run_s >= c.pause_s and self.speech_s <= c.human_max_speech_s:
            return Verdict("human", at, "short greeting")
        if self.started and self.pause_run_s >= c.wait_s:
            return Verdict("human", at, "waited")
        if not self.started and self.samples >= round(c.silence_s * self.rate):
            return Verdict("human", at, "silence")
        return None

    @property
    def greeting_over(self) -> bool:
        """A machine's greeting has ended: its beep has stopped, or (no beep heard) it fell silent."""
        if self.beeps.ended_at is not None:
            return True
        return self.beeps.found_at is None and self.started and self.pause_run_s >= 1.2


WORD_CHECKS = (1.0, 1.8)  # seconds of greeting speech at which its words are asked for


class Screening:
    """The detector on a live call: the callee's audio (`feed`, 8 kHz) through the shared VAD and,
    at WORD_CHECKS, the recognizer, on their worker threads. `decided` is set with the verdict;
    after a machine's verdict it goes on listening until the greeting is over (`greeting_over`:
    the beep ended, or it fell silent), the moment a message may begin."""

    def __init__(self, backends: Any, config: MachineDetection, rate: int = 8000) -> None:
        self.backends = backends
        self.rate = rate
        self.detector = MachineDetector(config, rate)
        self.vad = backends.vad.new_stream()
        self.window_s = backends.vad.window_samples / backends.vad.sample_rate
        self.audio: list[Audio] = []
        self.asked: set[float] = set()
        self.decided = asyncio.Event()
        self.greeting_over = asyncio.Event()

    @property
    def verdict(self) -> Verdict | None:
        return self.detector.verdict

    def decide(self, verdict: Verdict) -> None:
        """A verdict from outside (none came in time)."""
        self.detector.verdict = verdict
        self.decided.set()

    async def feed(self, samples: Audio) -> None:
        if self.greeting_over.is_set():
            return
        if self.verdict is None:  # the greeting's words are asked for until the verdict
            self.audio.append(samples)
        vad_rate = self.backends.vad.sample_rate
        speech = await self.backends.vad_worker.run(self.vad.probabilities, resample(samples, self.rate, vad_rate))
        if self.detector.feed(samples, speech, self.window_s) is None:
            await self._words()
        if self.verdict is not None:
            self.decided.set()
            if self.verdict.kind == "human" or self.detector.greeting_over:
                self.greeting_over.set()

    async def _words(self) -> None:
        for checkpoint in WORD_CHECKS:
            if self.detector.speech_s >= checkpoint and checkpoint not in self.asked:
                self.asked.add(checkpoint)
                asr = self.backends.asr
                greeting = resample(np.concatenate(self.audio), self.rate, asr.sample_rate)
                self.detector.heard(await self.backends.asr_worker.run(asr.transcribe, greeting))
                return
