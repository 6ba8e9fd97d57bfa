"""The learned end-of-turn decision: its file, its loading and fallbacks, and how the policy uses it."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import numpy as np
import pytest

from core.errors import ConfigError
from core.worker import ModelWorker
from pipeline.config import EndpointingConfig
from pipeline.prosody import Prosody
from pipeline.turn_judge import TurnJudge
from pipeline.turn_model import FEATURES, FORMAT, SHIPPED, TurnModel, features, load_turn_model
from pipeline.turn_policy import Evidence, TurnPolicy, check_decision


def _write(path: Path, data: object) -> str:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    load_turn_model.cache_clear()
    return str(path)


GOOD = {"format": FORMAT, "weights": {"bias": -1.0, "log_p_words": 1.0, "log_p_words_above_-1.5": 2.0},
        "sure_probability": 0.8, "doubt_probability": 0.1, "max_patience_ms": 1200, "hold_ms": 300,
        "trained_on": "a test"}


def test_the_shipped_decision_loads_and_trusts_a_likelier_end_more() -> None:
    model = load_turn_model()
    assert set(model.weights) <= set(FEATURES)
    assert 0 < model.doubt_probability <= model.sure_probability < 1 and model.max_patience_ms >= 1200
    words = "What time does the pharmacy close?"
    probabilities = [model.probability(Evidence(text=p, words=words)) for p in (1e-9, 1e-4, 0.01, 0.1, 0.3, 0.6, 0.95)]
    assert probabilities == sorted(probabilities)
    assert probabilities[0] < model.doubt_probability  # "what time does the": the whole patience
    assert model.trained_on  # it says what it was trained on


def test_a_decision_file_is_read_with_its_patience(tmp_path: Path) -> None:
    policy = TurnPolicy(EndpointingConfig(decision_file=_write(tmp_path / "d.json", GOOD)))
    assert policy.model is not None and policy.max_patience_ms == 1200
    assert policy.wait_ms(Evidence()) == 1200  # nothing known: the whole patience
    assert policy.wait_ms(Evidence(audio=0.99)) == 1200  # the sound alone is not what it was trained on
    sure = policy.wait_ms(Evidence(text=0.9, words="Thank you."))
    assert sure == 0  # z = -1 + log 0.9 + 2 (log 0.9 + 1.5) = 1.69: p 0.84 >= 0.8
    assert policy.wait_ms(Evidence(text=1e-6, words="What time does the")) == 1200
    low = policy.wait_ms(Evidence(text=math.exp(-1.5), words="Book it"))  # z = -2.5: p 0.076 < doubt
    assert low == 1200
    p = policy.probability(Evidence(text=math.exp(-0.75), words="Book it."))  # z = -0.25: p 0.44
    assert p is not None and 0.1 < p < 0.8
    share = (0.8 - p) / (0.8 - 0.1)  # from the hold just under sure up to the whole patience
    assert policy.wait_ms(Evidence(text=math.exp(-0.75), words="Book it.")) == pytest.approx(300 + 900 * share)
    assert policy.hears is False  # no weight on the sound: the end-of-turn model is not run


def test_the_rule_is_still_there_by_name() -> None:
    policy = TurnPolicy(EndpointingConfig(decision="rule"))
    assert policy.model is None and policy.max_patience_ms == EndpointingConfig().max_patience_ms
    assert TurnPolicy(EndpointingConfig(), words=False).model is None  # without words: the sound's own rule


@pytest.mark.parametrize(("content", "says"), [
    (None, "cannot read"),
    ("{not json", "is not JSON"),
    ({**GOOD, "format": "something/else"}, "format"),
    ({**GOOD, "weights": {"bias": 1.0, "shoe_size": 2.0}}, "unknown features"),
    ({**GOOD, "weights": {"bias": "NaN"}}, "finite"),
    ({**GOOD, "sure_probability": 0.1, "doubt_probability": 0.5}, "doubt_probability <= sure_probability"),
    ({k: v for k, v in GOOD.items() if k != "max_patience_ms"}, "max_patience_ms"),
    ([1, 2, 3], "format"),
])
def test_a_missing_or_broken_decision_file_is_a_clear_start_up_error(tmp_path: Path, content: object,
                                                                        says: str) -> None:
    path = tmp_path / "decision.json"
    where = str(path) if content is None else _write(path, content)
    with pytest.raises(ConfigError) as caught:
        TurnPolicy(EndpointingConfig(decision_file=where))
    message = str(caught.value)
    assert says in message and where in message
    assert "endpointing.decision_file" in message  # and what to do about it


def test_features_read_the_transcript_s_end_and_the_recognizer_s_confidence() -> None:
    asked = features(Evidence(text=0.5, words="Can you book me a table for...", asr_logprob=-0.4))
    assert asked["ends_open"] == 1 and asked["ends_question"] == 0 and asked["asr_logprob"] == -0.4
    assert features(Evidence(text=0.5, words="Is it open?"))["ends_question"] == 1
    assert features(Evidence(text=0.5, words="Cancel it."))["ends_period"] == 1
    assert features(Evidence(audio=0.5))["words"] == 0 and features(Evidence(audio=0.5))["sound"] == 1
    assert features(Evidence(text=1e-40))["log_p_words"] == -12  # clipped


def test_a_model_round_trips_through_its_file(tmp_path: Path) -> None:
    model = TurnModel({"bias": 0.5, "log_p_words": 1.0}, 0.8, 0.2, 1500, "a test")
    path = tmp_path / "m.json"
    path.write_text(json.dumps(model.to_json()))
    load_turn_model.cache_clear()
    assert load_turn_model(str(path)) == model


def test_the_shipped_file_is_where_the_settings_say() -> None:
    assert SHIPPED.is_file() and EndpointingConfig().decision_file == "" and EndpointingConfig().decision == "learned"


def test_features_read_the_recognizer_s_confidence_in_the_transcript_s_end() -> None:
    sure = features(Evidence(text=0.5, words="Can I pay with cash?", asr_last_word=0.9, asr_end_mark=0.95))
    cut = features(Evidence(text=0.5, words="Can I pay with her?", asr_last_word=0.05, asr_end_mark=0.4))
    assert sure["asr_last_word"] == pytest.approx(math.log(0.9))
    assert cut["asr_last_word"] == pytest.approx(math.log(0.05))
    assert sure["asr_end_mark"] > cut["asr_end_mark"]
    assert features(Evidence(text=0.5, words="x", asr_last_word=1e-9))["asr_last_word"] == -5  # clipped
    # an open end has no mark to be sure of; a recognizer that gives no confidence counts as a typical one
    assert features(Evidence(text=0.5, words="Can I pay with...", asr_end_mark=0.3))["asr_end_mark"] == 0
    unknown = features(Evidence(text=0.5, words="Can I pay with cash?"))
    assert unknown["asr_last_word"] < 0 and unknown["asr_end_mark"] < 0
    assert features(Evidence(audio=0.5))["asr_last_word"] == 0  # no words: nothing about them


def test_a_decision_weighs_the_last_word_s_confidence(tmp_path: Path) -> None:
    data = {**GOOD, "weights": {**GOOD["weights"], "asr_last_word": 2.0}}  # type: ignore[dict-item]
    policy = TurnPolicy(EndpointingConfig(decision_file=_write(tmp_path / "d.json", data)))
    confident = policy.probability(Evidence(text=0.5, words="Can I pay with cash?", asr_last_word=0.9))
    doubtful = policy.probability(Evidence(text=0.5, words="Can I pay with her?", asr_last_word=0.05))
    assert confident is not None and doubtful is not None and confident > doubtful


def test_a_decision_that_weighs_the_end_s_confidence_needs_the_recognizer_to_give_it(tmp_path: Path) -> None:
    data = {**GOOD, "weights": {**GOOD["weights"], "asr_end_mark": 1.0}}  # type: ignore[dict-item]
    config = EndpointingConfig(decision_file=_write(tmp_path / "d.json", data))
    with pytest.raises(ConfigError) as caught:
        check_decision(config, end_confidence=False)
    assert "asr.end_confidence=true" in str(caught.value) and "asr_end_mark" in str(caught.value)
    check_decision(config, end_confidence=True)
    check_decision(EndpointingConfig(decision_file=_write(tmp_path / "plain.json", GOOD)), end_confidence=False)


def test_features_read_the_turn_s_prosody_clipped_and_only_where_measured() -> None:
    falling = features(Evidence(text=0.5, words="Is it open?", prosody=Prosody(-2.0, -3.0, 0.8, -9.0)))
    assert falling["prosody"] == 1 and falling["prosody_pitch_end"] == -2 and falling["prosody_energy_drop"] == -9
    assert features(Evidence(text=0.5, words="x", prosody=Prosody(-50.0, 0, 0, 0)))["prosody_pitch_end"] == -3
    unmeasured = features(Evidence(text=0.5, words="Is it open?"))
    assert unmeasured["prosody"] == 0 and unmeasured["prosody_pitch_end"] == 0


def test_a_decision_that_weighs_prosody_says_so_and_the_judge_measures_it(tmp_path: Path) -> None:
    data = {**GOOD, "weights": {**GOOD["weights"], "prosody_pitch_end": -1.0}}  # type: ignore[dict-item]
    policy = TurnPolicy(EndpointingConfig(decision_file=_write(tmp_path / "d.json", data)))
    assert policy.model is not None and policy.model.weighs_prosody
    assert not TurnModel({"bias": 1.0}, 0.8, 0.2, 1500, "").weighs_prosody
    fell = policy.probability(Evidence(text=0.5, words="Is it open?", prosody=Prosody(-2.0, 0, 0, 0)))
    level = policy.probability(Evidence(text=0.5, words="Is it open?", prosody=Prosody(0.5, 0, 0, 0)))
    assert fell is not None and level is not None and fell > level

    async def judged() -> Evidence:
        judge = TurnJudge(policy, None, ModelWorker("test-prosody"), words=True)
        falling_voice = 0.3 * np.sin(2 * np.pi * np.cumsum(np.geomspace(200, 120, 16000)) / 16000)
        judge.pause(1, falling_voice.astype(np.float32))
        for _ in range(200):
            if judge.evidence().prosody is not None:
                break
            await asyncio.sleep(0.01)
        return judge.evidence()

    assert asyncio.run(judged()).prosody is not None
