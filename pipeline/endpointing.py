"""Endpointing: deciding from speech probabilities when the caller starts and stops talking.

`Endpointer` is the pure decision logic (unit-tested with made-up probabilities); `vad_stage` runs
it on a real VAD (gated on the line's noise floor where the background sounds like speech:
pipeline/noise_floor.py, and on the caller's own level: pipeline/caller_level.py), keeps the
turn's audio, and yields SpeechStarted / SpeechAudio / SpeechStopped.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from core.clock import Clock
from core.worker import ModelWorker
from models.protocols import VadStream
from pipeline.caller_level import CallerLevel
from pipeline.config import EndpointingConfig
from pipeline.events import (
    AudioFrame,
    SpeechAudio,
    SpeechEvent,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
)
from pipeline.noise_floor import NoiseFloor
from pipeline.turn_judge import TurnJudge

log = logging.getLogger(__name__)

TURN_MODEL_S = 8.0  # the end-of-turn model hears at most the turn's last 8 s


AUDIBLE = 0.01  # -40 dBFS, of full scale 1.0: a sample this loud is sound (the true end of speech is the last)
END_LOOKBACK_MS = 300.0  # how far before the VAD's silence the caller's last sound is looked for


@dataclass(frozen=True)
class Decision:
    kind: str  # "start" | "pause" | "resume" | "stop"
    audio_ms: float  # position in the stream: where speech began (start) or ended (stop)
    forced: bool = False


class Endpointer:
    """A two-threshold state machine over fixed-length VAD windows.

    Silence -> speech once probabilities stay >= threshold for min_speech_ms.
    Speech -> silence once they stay < neg_threshold for end_silence_ms, or the turn reaches
    max_turn_s. Probabilities between the thresholds keep the current state (hysteresis).
    Within speech, `early_final_ms` of silence is a pause (the turn may be ending) and speech after
    a pause a resume.

    With end-of-turn evidence (`judged=True`), the caller of `feed` gathers it at each pause and
    calls `end_turn` when the policy says the silence so far is enough; otherwise the turn ends only
    after `max_patience_ms`, the patience for a caller who stopped mid-sentence.
    """

    def __init__(self, config: EndpointingConfig, window_ms: float, judged: bool = False,
                 patience_ms: int | None = None) -> None:
        """`patience_ms`: the longest pause waited out when judged (default config.max_patience_ms;
        a learned decision brings its own)."""
        self.config = config
        self.window_ms = window_ms
        patience = config.max_patience_ms if patience_ms is None else patience_ms
        self.end_silence_ms = patience if judged else config.end_silence_ms
        self.pauses = 0  # pauses so far: tells whether a model's answer is about the pause still going on
        self.neg_threshold = (
            config.neg_threshold if config.neg_threshold is not None else max(0.01, config.threshold - 0.15)
        )
        self.position_ms = 0.0
        self.in_speech = False
        self._run_ms = 0.0  # speech run (while silent) or silence run (while in speech)
        self._turn_start_ms = 0.0
        self._paused = False

    def feed(self, probability: float) -> Decision | None:
        self.position_ms += self.window_ms
        cfg = self.config
        if not self.in_speech:
            self._run_ms = self._run_ms + self.window_ms if probability >= cfg.threshold else 0.0
            if self._run_ms >= max(cfg.min_speech_ms, self.window_ms):
                self.in_speech = True
                self._turn_start_ms = self.position_ms - self._run_ms
                self._run_ms = 0.0
                return Decision("start", self._turn_start_ms)
            return None
        if probability < self.neg_threshold:
            self._run_ms += self.window_ms
        elif probability >= cfg.threshold:
            self._run_ms = 0.0
        if self._run_ms >= self.end_silence_ms:
            return self._stop(self.position_ms - self._run_ms, forced=False)
        if self.position_ms - self._turn_start_ms >= cfg.max_turn_s * 1000:
            return self._stop(self.position_ms, forced=True)
        if 0 < cfg.early_final_ms <= self._run_ms and not self._paused:
            self._paused = True
            self.pauses += 1
            return Decision("pause", self.position_ms - self._run_ms)
        if self._paused and self._run_ms == 0.0:
            self._paused = False
            return Decision("resume", self.position_ms)
        return None

    def in_pause(self, pause: int | None = None) -> bool:
        """Whether a pause (number `pause`, or any) is going on: no speech since it began."""
        return self.in_speech and self._paused and (pause is None or self.pauses == pause)

    @property
    def silence_ms(self) -> float:
        """The silence since the caller last spoke (within a turn)."""
        return self._run_ms if self.in_speech else 0.0

    def end_turn(self) -> Decision:
        """The end-of-turn model says the caller has finished: the turn ends where the silence began."""
        return self._stop(self.position_ms - self._run_ms, forced=False)

    def _stop(self, end_ms: float, forced: bool) -> Decision:
        self.in_speech = False
        self._paused = False
        self._run_ms = 0.0
        return Decision("stop", end_ms, forced)


def feed_gated(endpointer: Endpointer, floor: NoiseFloor, caller: CallerLevel, probability: float,
               window: np.ndarray) -> Decision | None:
    """One VAD window into the endpointer, gated on the line's noise floor and on the caller's level: the margins they
    ask for depend on whether the caller is talking (in a turn and not in a pause)."""
    talking = endpointer.in_speech and not endpointer.in_pause()
    gated = floor.gate(probability, window, talking)
    decision = endpointer.feed(caller.gate(gated, floor.level_db, endpointer.in_speech, talking,
                                           endpointer.config.threshold))
    if decision is not None and decision.kind == "stop":
        caller.turn_ended()
    return decision


def replay(probabilities: Sequence[float], audio: np.ndarray, config: EndpointingConfig, window_samples: int,
           window_ms: float) -> list[Decision]:
    """The endpointer's decisions (at its fixed silence, no end-of-turn model) over a whole recording and its VAD
    probabilities, one per window: the offline replay of what `vad_stage` decides live."""
    endpointer = Endpointer(config, window_ms)
    floor = NoiseFloor(config.noise_floor, window_ms)
    caller = CallerLevel(config.caller_level, window_ms)
    decisions = []
    for i, probability in enumerate(probabilities):
        window = audio[i * window_samples:(i + 1) * window_samples]
        decision = feed_gated(endpointer, floor, caller, probability, window)
        if decision is not None:
            decisions.append(decision)
    return decisions


async def vad_stage(
    frames: AsyncIterator[AudioFrame],
    vad: VadStream,
    worker: ModelWorker,
    config: EndpointingConfig,
    clock: Clock,
    sample_rate: int = 16000,
    window_samples: int = 512,
    judge: TurnJudge | None = None,
    turn_ids: Iterator[int] | None = None,
) -> AsyncGenerator[SpeechEvent, None]:
    """Audio frames in; the caller's turns out, as start, audio chunks, pause, resume, stop.

    With a judge, each pause gathers end-of-turn evidence (the end-of-turn model on its worker,
    the words' probability from the session) while audio keeps flowing, and at every window of the
    pause the policy (pipeline/turn_policy.py) says how much silence that evidence asks for: once
    the silence so far reaches it, the turn ends. Turns are numbered from `turn_ids` (the session's,
    which numbers its keypad turns from the same counter), or from 1."""
    window_ms = 1000.0 * window_samples / sample_rate
    judged = judge is not None and judge.active and config.early_final_ms > 0
    endpointer = Endpointer(config, window_ms, judged=judged,
                            patience_ms=int(judge.policy.max_patience_ms) if judge is not None else None)
    floor = NoiseFloor(config.noise_floor, window_ms)
    caller = CallerLevel(config.caller_level, window_ms)
    # Audio kept from before a detected start: the padding plus the speech that confirmed it.
    keep = int(sample_rate * (config.prefix_padding_ms + config.min_speech_ms) / 1000) + window_samples
    history: deque[np.ndarray] = deque()
    history_len = 0
    spoken: deque[np.ndarray] = deque()  # the turn's audio so far, the last TURN_MODEL_S of it
    spoken_len = 0
    pending = np.zeros(0, dtype=np.float32)  # samples not yet classified by the VAD
    # the same samples as the recognizer hears them, where the frames carry that apart (AudioFrame.heard: a line's
    # frames all do or none do)
    pending_heard = np.zeros(0, dtype=np.float32)
    consumed = 0  # samples classified so far
    ids = turn_ids if turn_ids is not None else itertools.count(1)
    turn_id = 0

    def stopped(decision: Decision, frame: AudioFrame, probability: float | None) -> SpeechStopped:
        # Audio arrives in real time and the frame's last sample came at frame.at, so the caller
        # stopped (unclassified samples + silence waited for) before that.
        end_ms = decision.audio_ms
        if not decision.forced:
            end_ms = last_sound_ms(spoken, consumed, decision.audio_ms, sample_rate)
        behind_s = (len(pending) + consumed) / sample_rate - end_ms / 1000
        return SpeechStopped(turn_id, clock.now(), decision.audio_ms, frame.at - behind_s, decision.forced,
                             probability)

    try:
        async for frame in frames:
            probs = await worker.run(vad.probabilities, frame.samples)
            pending = np.concatenate([pending, frame.samples])
            if frame.heard is not None:
                pending_heard = np.concatenate([pending_heard, frame.heard])
            for prob in probs:
                window, pending = pending[:window_samples], pending[window_samples:]
                heard = window
                if frame.heard is not None:
                    heard, pending_heard = pending_heard[:window_samples], pending_heard[window_samples:]
                consumed += window_samples
                decision = feed_gated(endpointer, floor, caller, prob, window)
                answer: float | None = None
                if decision is None and judge is not None and judged and endpointer.in_pause():
                    evidence = judge.evidence()
                    if endpointer.silence_ms >= judge.policy.wait_ms(evidence):  # enough silence for what is known
                        answer = judge.policy.probability(evidence)
                        decision = endpointer.end_turn()
                        caller.turn_ended()
                if endpointer.in_speech or (decision is not None and decision.kind == "stop"):
                    if decision is not None and decision.kind == "start":
                        turn_id = next(ids)
                        yield SpeechStarted(turn_id, clock.now(), decision.audio_ms)
                        pad_start = max(0.0, decision.audio_ms - config.prefix_padding_ms)
                        history.append(heard)
                        first = _tail(history, consumed, pad_start, sample_rate)
                        history.clear()
                        history_len = 0
                        spoken.clear()
                        spoken.append(first)
                        spoken_len = len(first)
                        yield SpeechAudio(turn_id, first)
                    else:
                        spoken.append(heard)
                        spoken_len += len(heard)
                        while spoken_len - len(spoken[0]) >= TURN_MODEL_S * sample_rate:
                            spoken_len -= len(spoken.popleft())
                        yield SpeechAudio(turn_id, heard)
                    if decision is not None and decision.kind == "pause":
                        if judge is not None and judged:
                            judge.pause(turn_id, np.concatenate(list(spoken)))
                        yield SpeechPaused(turn_id, clock.now())
                    elif decision is not None and decision.kind == "resume":
                        if judge is not None:
                            judge.clear()
                        yield SpeechResumed(turn_id, clock.now())
                    elif decision is not None and decision.kind == "stop":
                        if judge is not None:
                            judge.clear()
                        yield stopped(decision, frame, answer)
                else:
                    history.append(heard)
                    history_len += len(heard)
                    while history_len - len(history[0]) >= keep:
                        history_len -= len(history.popleft())
    finally:
        if judge is not None:
            judge.clear()


def last_sound_ms(spoken: deque[np.ndarray], consumed: int, silence_from_ms: float, sample_rate: int) -> float:
    """Where the caller's last sound ended: the last sample above -40 dBFS (AUDIBLE, the level the
    benchmarks time the true end of speech at) within END_LOOKBACK_MS before the VAD's silence began,
    since the VAD hears the end a window or two late. `spoken` ends at stream sample `consumed`. The
    VAD's own estimate stands where nothing before it was that loud (a quiet line), and on a line
    whose noise is that loud the last such sample is the silence's start: it never moves later."""
    silence_from = int(silence_from_ms * sample_rate / 1000)
    kept = sum(len(piece) for piece in spoken)
    first = consumed - kept  # the stream position of spoken's first sample
    low = max(first, silence_from - int(END_LOOKBACK_MS * sample_rate / 1000))
    if silence_from <= low:
        return silence_from_ms
    audio = np.concatenate(list(spoken))[low - first:silence_from - first]
    loud = np.flatnonzero(np.abs(audio) >= AUDIBLE)
    if not len(loud):
        return silence_from_ms
    return 1000.0 * (low + int(loud[-1]) + 1) / sample_rate


def _tail(history: deque[np.ndarray], consumed: int, start_ms: float, sample_rate: int) -> np.ndarray:
    """The kept audio from stream position start_ms up to `consumed` samples."""
    audio = np.concatenate(list(history)) if history else np.zeros(0, dtype=np.float32)
    want = consumed - int(start_ms * sample_rate / 1000)
    return audio[-want:] if 0 < want < len(audio) else audio

