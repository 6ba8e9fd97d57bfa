"""Endpointing: deciding from speech probabilities when the caller starts and stops talking.

`Endpointer` is the pure decision logic (unit-tested with made-up probabilities); `vad_stage` runs
it on a real VAD, keeps the turn's audio, and yields SpeechStarted / SpeechAudio / SpeechStopped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

import numpy as np

from core.clock import Clock
from core.worker import ModelWorker
from models.protocols import VadStream
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
    """

    def __init__(self, config: EndpointingConfig, window_ms: float) -> None:
        self.config = config
        self.window_ms = window_ms
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
        if self._run_ms >= cfg.end_silence_ms:
            return self._stop(self.position_ms - self._run_ms, forced=False)
        if self.position_ms - self._turn_start_ms >= cfg.max_turn_s * 1000:
            return self._stop(self.position_ms, forced=True)
        if 0 < cfg.early_final_ms <= self._run_ms and not self._paused:
            self._paused = True
            return Decision("pause", self.position_ms - self._run_ms)
        if self._paused and self._run_ms == 0.0:
            self._paused = False
            return Decision("resume", self.position_ms)
        return None

    def _stop(self, end_ms: float, forced: bool) -> Decision:
        self.in_speech = False
        self._paused = False
        self._run_ms = 0.0
        return Decision("stop", end_ms, forced)


async def vad_stage(
    frames: AsyncIterator[AudioFrame],
    vad: VadStream,
    worker: ModelWorker,
    config: EndpointingConfig,
    clock: Clock,
    sample_rate: int = 16000,
    window_samples: int = 512,
) -> AsyncGenerator[SpeechEvent, None]:
    """Audio frames in; the caller's turns out, as start, audio chunks, stop."""
    window_ms = 1000.0 * window_samples / sample_rate
    endpointer = Endpointer(config, window_ms)
    # Audio kept from before a detected start: the padding plus the speech that confirmed it.
    keep = int(sample_rate * (config.prefix_padding_ms + config.min_speech_ms) / 1000) + window_samples
    history: deque[np.ndarray] = deque()
    history_len = 0
    pending = np.zeros(0, dtype=np.float32)  # samples not yet classified by the VAD
    consumed = 0  # samples classified so far
    turn_id = 0
    async for frame in frames:
        probs = await worker.run(vad.probabilities, frame.samples)
        pending = np.concatenate([pending, frame.samples])
        for prob in probs:
            window, pending = pending[:window_samples], pending[window_samples:]
            consumed += window_samples
            decision = endpointer.feed(prob)
            if endpointer.in_speech or (decision is not None and decision.kind == "stop"):
                if decision is not None and decision.kind == "start":
                    turn_id += 1
                    yield SpeechStarted(turn_id, clock.now(), decision.audio_ms)
                    pad_start = max(0.0, decision.audio_ms - config.prefix_padding_ms)
                    history.append(window)
                    yield SpeechAudio(turn_id, _tail(history, consumed, pad_start, sample_rate))
                    history.clear()
                    history_len = 0
                else:
                    yield SpeechAudio(turn_id, window)
                if decision is not None and decision.kind == "pause":
                    yield SpeechPaused(turn_id, clock.now())
                elif decision is not None and decision.kind == "resume":
                    yield SpeechResumed(turn_id, clock.now())
                elif decision is not None and decision.kind == "stop":
                    # Audio arrives in real time and the frame's last sample came at frame.at, so the
                    # caller stopped (unclassified samples + silence waited for) before that.
                    behind_s = (len(pending) + consumed) / sample_rate - decision.audio_ms / 1000
                    yield SpeechStopped(turn_id, clock.now(), decision.audio_ms, frame.at - behind_s, decision.forced)
            else:
                history.append(window)
                history_len += len(window)
                while history_len - len(history[0]) >= keep:
                    history_len -= len(history.popleft())


def _tail(history: deque[np.ndarray], consumed: int, start_ms: float, sample_rate: int) -> np.ndarray:
    """The kept audio from stream position start_ms up to `consumed` samples."""
    audio = np.concatenate(list(history)) if history else np.zeros(0, dtype=np.float32)
    want = consumed - int(start_ms * sample_rate / 1000)
    return audio[-want:] if 0 < want < len(audio) else audio

