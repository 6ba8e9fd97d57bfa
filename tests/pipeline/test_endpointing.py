import asyncio
import math
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from core.clock import FakeClock
from core.worker import ModelWorker
from pipeline.config import EndpointingConfig, SoundAlone
from pipeline.endpointing import Endpointer, vad_stage
from pipeline.events import AudioFrame, SpeechAudio, SpeechPaused, SpeechStarted, SpeechStopped
from pipeline.turn_judge import TurnJudge
from pipeline.turn_model import TurnModel, load_turn_model
from pipeline.turn_policy import Evidence, TurnPolicy

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


class LateVad(ScriptedVad):
    """A fake VAD that, like a real one, hears the end of speech late: speech for `late` windows more."""

    def __init__(self, late: int) -> None:
        super().__init__()
        self.late, self.since = late, late

    def probabilities(self, samples: np.ndarray) -> list[float]:
        out = []
        for p in super().probabilities(samples):
            self.since = 0 if p else self.since + 1
            out.append(1.0 if self.since <= self.late else 0.0)
        return out


@pytest.mark.parametrize("tail", [0.0, 0.004])
async def test_the_end_of_speech_is_where_the_sound_ended_not_where_the_vad_heard_it(tail: float) -> None:
    """The VAD hears silence 3 windows (96 ms) after the sound ends at 2.0 s; the estimate of when the
    caller stopped is the last sample above -40 dBFS, before that. `tail`: a sound under -40 dBFS after
    the end (a breath), which does not count."""
    clock = FakeClock()
    speech = np.full(16000, 0.5, np.float32)
    after = np.full(16000, tail, np.float32)
    audio = np.concatenate([np.zeros(16000, np.float32), speech, after])
    sent_at: list[float] = []

    async def frames():  # 20 ms frames, each arriving as its last sample is spoken
        for i in range(0, len(audio), 320):
            clock.advance(0.02)
            if i + 320 == 32000:
                sent_at.append(clock.now())  # the last sample of speech arrived here
            yield AudioFrame(audio[i:i + 320], clock.now())

    cfg = EndpointingConfig(min_speech_ms=96, end_silence_ms=320, prefix_padding_ms=200, early_final_ms=0)
    worker = ModelWorker("test-late-vad")
    events = [e async for e in vad_stage(frames(), LateVad(3), worker, cfg, clock)]
    worker.shutdown()
    stopped = events[-1]
    assert isinstance(stopped, SpeechStopped)
    assert stopped.audio_ms == pytest.approx(2000 + 96, abs=32)  # where the VAD heard silence begin
    assert stopped.ended_at == pytest.approx(sent_at[0], abs=0.002)  # where the sound really ended


def test_the_last_sound_is_looked_for_only_just_before_the_vad_s_silence() -> None:
    from collections import deque

    from pipeline.endpointing import last_sound_ms

    rate = 16000
    turn = np.concatenate([np.full(8000, 0.3, np.float32), np.zeros(8000, np.float32)])  # sound to 500 ms
    spoken = deque([turn[:5000], turn[5000:]])
    assert last_sound_ms(spoken, 16000, 600.0, rate) == pytest.approx(500.0)  # 100 ms back: found
    assert last_sound_ms(spoken, 16000, 900.0, rate) == 900.0  # 400 ms back: too far, the VAD's stands
    noisy = deque([turn + 0.02])  # a line whose noise is louder than -40 dBFS: never later, never moved
    assert last_sound_ms(noisy, 16000, 600.0, rate) == pytest.approx(600.0)
    assert last_sound_ms(deque([turn[-100:]]), 16000, 999.0, rate) == 999.0  # nothing kept before it


async def test_the_turns_audio_is_what_the_recognizer_hears_and_the_vad_decides_on_its_own() -> None:
    clock = FakeClock()
    silence, speech = np.zeros(16000, np.float32), np.full(16000, 0.5, np.float32)
    audio = np.concatenate([silence, speech, silence])
    marked = np.arange(len(audio), dtype=np.float32) / len(audio) * 0.01  # what the recognizer hears: too quiet

    async def frames() -> AsyncIterator[AudioFrame]:
        for i in range(0, len(audio), 320):
            clock.advance(0.02)
            yield AudioFrame(audio[i:i + 320], clock.now(), heard=marked[i:i + 320])

    cfg = EndpointingConfig(min_speech_ms=96, end_silence_ms=320, prefix_padding_ms=200)
    worker = ModelWorker("test-vad")
    events = [e async for e in vad_stage(frames(), ScriptedVad(), worker, cfg, clock)]
    worker.shutdown()
    started = events[0]
    assert isinstance(started, SpeechStarted) and started.audio_ms == pytest.approx(1000, abs=32)  # the VAD's audio
    turn_audio = np.concatenate([e.samples for e in events if isinstance(e, SpeechAudio)])
    at = int(np.round(turn_audio[0] / 0.01 * len(audio)))  # where in the stream the turn's audio begins
    assert np.array_equal(turn_audio, marked[at:at + len(turn_audio)])  # sample for sample the recognizer's


def test_with_end_of_turn_evidence_silence_alone_waits_the_longer_patience() -> None:
    ep = Endpointer(EndpointingConfig(min_speech_ms=96, end_silence_ms=480, early_final_ms=192,
                                      max_patience_ms=960), WINDOW_MS, judged=True)
    kinds = [(d.kind, ep.position_ms) for p in [0.9] * 10 + [0.05] * 40 if (d := ep.feed(p))]
    assert [k for k, _ in kinds] == ["start", "pause", "stop"]
    assert kinds[-1][1] - 10 * WINDOW_MS == 960  # not 480: the model did not say the turn was over


def test_a_models_yes_ends_the_turn_at_its_pause_but_not_after_the_caller_went_on() -> None:
    cfg = EndpointingConfig(min_speech_ms=96, early_final_ms=192, max_patience_ms=960)
    ep = Endpointer(cfg, WINDOW_MS, judged=True)
    for p in [0.9] * 10 + [0.05] * 7:
        ep.feed(p)
    pause = ep.pauses
    assert ep.in_pause(pause)
    ep.feed(0.9)  # the caller goes on before the answer came
    assert not ep.in_pause(pause)
    for p in [0.05] * 7:
        ep.feed(p)
    assert ep.in_pause(ep.pauses)
    stop = ep.end_turn()
    assert stop.kind == "stop" and stop.audio_ms == 18 * WINDOW_MS and not ep.in_speech


class FakeTurnModel:
    """A fake end-of-turn model with a fixed answer, named as one."""

    name = "fake-turn"
    sample_rate = 16000

    def __init__(self, answer: float) -> None:
        self.answer = answer
        self.heard: list[int] = []

    def probability(self, audio: np.ndarray) -> float:
        self.heard.append(len(audio))
        return self.answer


# the sound alone, as it decided before the words were weighed: the model's yes (>= 0.95) ends the turn
SOUND_RULE = SoundAlone(audio_weight=1.0, bias=0.0, sure_probability=0.95, doubt_probability=0.95)


async def stop_after(answer: float, gap_s: float = 0.0, words: float | None = None, said: str = "Is it open?",
                     model_file: TurnModel | None = None,
                     **settings: Any) -> tuple[SpeechStopped, FakeTurnModel, list[object]]:
    """One second of speech (a second burst after `gap_s` of silence, if given), then silence. With
    `words`, the session's part is played too: at each pause, the words' probability is handed to
    the judge once the pause has lasted 300 ms (when a transcript and an LLM prefill are ready)."""
    clock = FakeClock()
    speech, silence = np.full(16000, 0.5, np.float32), np.zeros(32000, np.float32)
    parts = [np.zeros(8000, np.float32), speech]
    if gap_s:
        parts += [np.zeros(int(16000 * gap_s), np.float32), speech]
    audio = np.concatenate([*parts, silence])

    model = FakeTurnModel(answer)
    worker, turn_worker = ModelWorker("test-vad"), ModelWorker("test-turn")
    paused_at: list[float] = []

    async def frames():  # 20 ms frames, in real time: the model's answer comes between two of them
        for i in range(0, len(audio), 320):
            clock.advance(0.02)
            await asyncio.sleep(0.002)
            if judge.turn_id is not None:
                paused_at.append(paused_at[-1] if paused_at else clock.now())
                if words is not None and clock.now() - paused_at[0] >= 0.3:
                    judge.words(judge.turn_id, words, said)
            else:
                paused_at.clear()
            yield AudioFrame(audio[i:i + 320], clock.now())

    cfg = EndpointingConfig(**{"min_speech_ms": 96, "end_silence_ms": 480, "early_final_ms": 192, "decision": "rule",
                               "max_patience_ms": 960, "without_words": SOUND_RULE, **settings})
    judge = TurnJudge(TurnPolicy(cfg, words is not None, model_file), model, turn_worker, words=words is not None)
    events = [e async for e in vad_stage(frames(), ScriptedVad(), worker, cfg, clock, judge=judge)]
    worker.shutdown()
    turn_worker.shutdown()
    stops = [e for e in events if isinstance(e, SpeechStopped)]
    assert len(stops) == 1, events
    return stops[0], model, events


async def test_vad_stage_ends_the_turn_at_a_pause_the_model_calls_complete() -> None:
    stopped, model, _ = await stop_after(0.99)
    assert model.heard and model.heard[0] / 16000 >= 1.0  # it heard the turn's speech
    assert stopped.turn_probability == pytest.approx(0.99)
    assert stopped.audio_ms == pytest.approx(1500, abs=32)
    # decided within a few windows of the 192 ms pause, not after 480 or 960 ms of silence
    assert stopped.at - stopped.ended_at < 0.35


async def test_vad_stage_waits_out_a_pause_the_model_calls_unfinished() -> None:
    stopped, _, events = await stop_after(0.1, gap_s=0.7)
    # the 0.7 s pause mid-turn did not end it; the silence after the second burst did, after 960 ms
    assert stopped.audio_ms == pytest.approx(3200, abs=32)
    assert stopped.turn_probability is None
    assert stopped.at - stopped.ended_at == pytest.approx(0.96, abs=0.06)
    assert sum(isinstance(e, SpeechPaused) for e in events) == 2


async def test_the_words_end_a_turn_the_sound_left_in_doubt() -> None:
    """The sound says 0.3 (doubt: the whole patience), the words 0.96 once the pause has lasted
    300 ms: with the words weighed, the turn ends then, not after 960 ms."""
    fused = {"audio_weight": 1.0, "bias": 0.0, "text_weight": 2.0, "text_neutral": -2.0, "sure_probability": 0.9,
             "doubt_probability": 0.5}
    stopped, _, _ = await stop_after(0.3, words=0.96, **fused)
    assert stopped.turn_probability is not None and stopped.turn_probability > 0.9
    assert 0.192 + 0.3 <= stopped.at - stopped.ended_at < 0.6  # the pause, then 300 ms for the words
    waited, _, _ = await stop_after(0.3, words=0.0001, **fused)  # "what time does the": it waits
    assert waited.turn_probability is None and waited.at - waited.ended_at == pytest.approx(0.96, abs=0.06)


def test_the_policy_is_today_s_rule_at_its_defaults_and_grades_patience_otherwise() -> None:
    today = TurnPolicy(EndpointingConfig(decision="rule", audio_weight=1.0, text_weight=0.0, bias=0.0,
                                         sure_probability=0.95, doubt_probability=0.95, max_patience_ms=1500))
    assert today.wait_ms(Evidence(audio=0.96)) == 0 and today.wait_ms(Evidence(audio=0.94)) == 1500
    assert today.wait_ms(Evidence(audio=0.94, text=1.0)) == 1500  # the words weigh nothing there
    graded = TurnPolicy(EndpointingConfig(decision="rule", audio_weight=1.0, bias=0.0, text_weight=1.0,
                                          text_neutral=-2.0, sure_probability=0.9, doubt_probability=0.1,
                                          max_patience_ms=1000))
    assert graded.wait_ms(Evidence()) == 1000  # nothing known yet: the whole patience
    assert graded.wait_ms(Evidence(audio=0.5)) == pytest.approx(500)  # halfway between the marks
    assert graded.probability(Evidence(audio=0.5, text=math.exp(-2.0))) == pytest.approx(0.5)  # neutral words
    assert graded.wait_ms(Evidence(audio=0.5, text=1e-9)) == 1000  # "the" at the end: no
    assert graded.wait_ms(Evidence(audio=0.5, text=0.95)) < graded.wait_ms(Evidence(audio=0.5))  # a "?": sooner


async def test_at_the_defaults_the_learned_decision_weighs_the_words_and_the_sound_is_not_asked() -> None:
    """The defaults: the learned decision (pipeline/turn_decision.json) over the words; the end-of-turn
    model is not run, sure words end the turn once they are in, and unlikely ones wait it out."""
    defaults = EndpointingConfig()
    shipped = load_turn_model()
    assert TurnPolicy(defaults).hears is shipped.hears is False and TurnPolicy(defaults, words=False).hears is True
    learned = {"decision": "learned", "max_patience_ms": shipped.max_patience_ms}
    said = "What time does the pharmacy close?"
    stopped, model, _ = await stop_after(0.99, words=0.97, said=said, without_words=defaults.without_words, **learned)
    assert model.heard == []
    p = shipped.probability(Evidence(text=0.97, words=said))
    assert stopped.turn_probability == pytest.approx(p)
    # once the words are in (the pause, then 300 ms) and the silence is what their probability asks for
    waited_s = max(0.192 + 0.3, shipped.wait_ms(p) / 1000)
    assert stopped.at - stopped.ended_at == pytest.approx(waited_s, abs=0.07)
    assert waited_s < shipped.max_patience_ms / 1000 - 0.3
    waited, _, _ = await stop_after(0.99, words=1e-6, said="What time does the", gap_s=1.0,
                                    without_words=defaults.without_words, **learned)
    assert waited.audio_ms == pytest.approx(3500, abs=32)  # the 1 s pause after "the" was waited out
    assert waited.at - waited.ended_at == pytest.approx(shipped.max_patience_ms / 1000, abs=0.06)


async def test_a_learned_decision_ends_a_likely_turn_at_once_and_waits_on_an_unlikely_one() -> None:
    model = TurnModel({"bias": 3.0, "log_p_words": 2.0}, 0.8, 0.2, 960, "a test")
    sure, _, _ = await stop_after(0.5, words=0.99, said="Thank you.", model_file=model, decision="learned")
    assert 0.192 + 0.3 <= sure.at - sure.ended_at < 0.6  # p = sigmoid(3 + 2 log 0.99) = 0.95: at once
    unsure, _, _ = await stop_after(0.5, words=0.01, said="I want to", model_file=model, decision="learned")
    # p = sigmoid(3 + 2 log 0.01) = 0.002: the whole patience
    assert unsure.at - unsure.ended_at == pytest.approx(0.96, abs=0.06)


def test_without_words_the_sound_alone_decides_by_its_own_rule() -> None:
    cfg = EndpointingConfig()
    alone = TurnPolicy(cfg, words=False)
    sure, unsure = alone.wait_ms(Evidence(audio=0.9999)), alone.wait_ms(Evidence(audio=0.3))
    assert sure < unsure < cfg.max_patience_ms  # the surer, the sooner: graded, not one threshold
    assert alone.wait_ms(Evidence(audio=0.0001)) == cfg.max_patience_ms  # unfinished: the whole patience
    assert TurnPolicy(cfg.model_copy(update={"text_signal": False})).rule == alone.rule
