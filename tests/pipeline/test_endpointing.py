import numpy as np
import pytest

from core.clock import FakeClock
from core.worker import ModelWorker
from pipeline.config import EndpointingConfig
from pipeline.endpointing import Endpointer, vad_stage
from pipeline.events import AudioFrame, SpeechAudio, SpeechStarted, SpeechStopped

WINDOW_MS = 32.0


def run(probs: list[float], **cfg: float) -> list[tuple[str, float, bool]]:
    ep = Endpointer(EndpointingConfig(**cfg), WINDOW_MS)
    out = []
    for p in probs:
        d = ep.feed(p)
        if d:
            out.append((d.kind, d.audio_ms, d.forced))
    return out


def test_speech_starts_only_after_min_speech() -> None:
    # 4 windows (128 ms) of speech is under min_speech_ms=160: no turn.
    assert run([0.9] * 4 + [0.0] * 30, min_speech_ms=160) == []
    # 5 windows: a turn starting where the speech began.
    decisions = run([0.0] * 3 + [0.9] * 5 + [0.0] * 30, min_speech_ms=160, end_silence_ms=480)
    assert decisions[0] == ("start", 3 * WINDOW_MS, False)


def test_turn_ends_after_the_silence_and_reports_where_speech_ended() -> None:
    probs = [0.9] * 20 + [0.05] * 20
    decisions = run(probs, min_speech_ms=96, end_silence_ms=480, early_final_ms=0)
    assert [d[0] for d in decisions] == ["start", "stop"]
    assert decisions[1][1] == 20 * WINDOW_MS  # speech ended where the silence began


def test_a_pause_comes_before_the_end_and_a_resume_cancels_it() -> None:
    probs = [0.9] * 10 + [0.05] * 10 + [0.9] * 10 + [0.05] * 20
    decisions = run(probs, min_speech_ms=96, end_silence_ms=480, early_final_ms=192)
    assert [d[0] for d in decisions] == ["start", "pause", "resume", "pause", "stop"]
    assert decisions[1][1] == 10 * WINDOW_MS  # the pause began where the silence did
    assert decisions[-1][1] == 30 * WINDOW_MS


def test_short_pause_does_not_end_the_turn() -> None:
    probs = [0.9] * 10 + [0.05] * 5 + [0.9] * 10 + [0.05] * 20
    decisions = run(probs, min_speech_ms=96, end_silence_ms=480, early_final_ms=192)
    assert [d[0] for d in decisions] == ["start", "pause", "stop"]
    assert decisions[-1][1] == 25 * WINDOW_MS


def test_hysteresis_between_thresholds_keeps_speech_going() -> None:
    # 0.4 is under threshold 0.5 but over neg_threshold 0.35: it neither starts silence nor speech.
    probs = [0.9] * 10 + [0.4] * 30 + [0.0] * 16
    decisions = run(probs, min_speech_ms=96, end_silence_ms=480, early_final_ms=0)
    assert decisions[1][1] == 40 * WINDOW_MS


def test_long_turn_is_forced_to_end() -> None:
    decisions = run([0.9] * 100, min_speech_ms=96, max_turn_s=2.0, early_final_ms=0)
    assert ("stop", pytest.approx(decisions[1][1]), True) == decisions[1]
    assert decisions[1][1] - decisions[0][1] >= 2000


class ScriptedVad:
    """A fake VAD for the stage test: speech wherever the window's mean amplitude is high."""

    def __init__(self) -> None:
        self.pending = np.zeros(0, dtype=np.float32)

    def probabilities(self, samples: np.ndarray) -> list[float]:
        buf = np.concatenate([self.pending, samples])
        n = len(buf) // 512
        self.pending = buf[n * 512:]
        return [1.0 if np.abs(buf[i * 512:(i + 1) * 512]).mean() > 0.1 else 0.0 for i in range(n)]


async def test_vad_stage_yields_turn_with_padded_audio() -> None:
    clock = FakeClock()
    silence, speech = np.zeros(16000, np.float32), np.full(16000, 0.5, np.float32)
    audio = np.concatenate([silence, speech, silence])

    async def frames():  # 20 ms frames
        for i in range(0, len(audio), 320):
            clock.advance(0.02)
            yield AudioFrame(audio[i:i + 320], clock.now())

    cfg = EndpointingConfig(min_speech_ms=96, end_silence_ms=320, prefix_padding_ms=200)
    worker = ModelWorker("test-vad")
    events = [e async for e in vad_stage(frames(), ScriptedVad(), worker, cfg, clock)]
    worker.shutdown()
    kinds = [type(e).__name__ for e in events]
    assert kinds[0] == "SpeechStarted" and kinds[-1] == "SpeechStopped"
    started, stopped = events[0], events[-1]
    assert isinstance(started, SpeechStarted) and isinstance(stopped, SpeechStopped)
    assert started.audio_ms == pytest.approx(1000, abs=32)
    assert stopped.audio_ms == pytest.approx(2000, abs=32)
    turn_audio = np.concatenate([e.samples for e in events if isinstance(e, SpeechAudio)])
    # the speech plus ~200 ms of padding before it plus the silence waited for
    assert len(turn_audio) / 16000 == pytest.approx(1.0 + 0.2 + 0.32, abs=0.07)
    # the true end of speech is estimated from arrival times: 1 s of audio after it was sent
    assert stopped.at - stopped.ended_at == pytest.approx(0.32, abs=0.05)
