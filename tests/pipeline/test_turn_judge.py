"""The end-of-turn judge hands the policy everything the session weighed at the pause (fakes: no models)."""

from __future__ import annotations

import numpy as np

from core.worker import ModelWorker
from pipeline.config import EndpointingConfig
from pipeline.turn_judge import TurnJudge
from pipeline.turn_policy import Evidence, TurnPolicy


def test_the_words_and_the_recognizer_s_confidence_reach_the_evidence_for_their_pause_only() -> None:
    judge = TurnJudge(TurnPolicy(EndpointingConfig()), None, ModelWorker("test-judge"), words=True)
    judge.pause(3, np.zeros(1600, np.float32))
    judge.words(2, 0.9, "An earlier pause.", -0.1, 0.9, 0.9)  # another pause's words: ignored
    assert judge.evidence() == Evidence()
    judge.words(3, 0.7, "Can I pay with her?", -0.3, 0.05, 0.6)
    assert judge.evidence() == Evidence(text=0.7, words="Can I pay with her?", asr_logprob=-0.3, asr_last_word=0.05,
                                        asr_end_mark=0.6)
    judge.clear()
    assert judge.evidence() == Evidence() and judge.turn_id is None
