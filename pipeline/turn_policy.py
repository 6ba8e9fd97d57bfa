"""The end-of-turn decision at a pause, from two kinds of evidence:

- the sound: the end-of-turn model's probability that the caller has finished (Smart Turn, from the
  turn's audio; ready ~0.1 s into the pause);
- the words: the language model's probability that the caller's sentence ends with the words said
  so far (its chat template's end-of-message token or a sentence mark after the transcript made at
  the pause, without Whisper's own final mark; ready when that transcript and one LLM prefill are,
  ~0.25 s into the pause on 2 cores). "What time does the" gets ~1e-6, "What time does the pharmacy
  close" ~0.9, whatever the voice.

Fused in log-odds, a missing kind counting as neutral:

    z = audio_weight * logit(p_audio) + text_weight * (clip(log p_text, -12, 0) - text_neutral) + bias
    p = sigmoid(z)

and the pause the caller is given follows from it: none at or above `sure_probability`, the whole
`max_patience_ms` at or below `doubt_probability`, in between in proportion. The decision is taken
again at every VAD window of the pause, so a later, surer answer (the words after the sound) ends
the turn as soon as the silence so far is enough for it. Without any evidence yet, the pause waits
`max_patience_ms`. Where the words will not come (an LLM that gives no probabilities), the
`without_words` rule weighs the sound alone.

The rule before this one ("end at the pause if p_audio >= 0.95, else after 1.5 s") is the special
case audio_weight 1, text_weight 0, bias 0, sure = doubt = 0.95, max_patience_ms 1500.

With `endpointing.decision` "learned" (the default) and the words coming, the probability is the
learned model's instead (pipeline/turn_model.py: more of the evidence, weights and patience trained
and chosen by bench/turn_detection.py --train), and the silence waited follows it the same way.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from core.errors import ConfigError
from pipeline.config import EndpointingConfig
from pipeline.prosody import Prosody
from pipeline.turn_model import END_CONFIDENCE_FEATURES, SHIPPED, TurnModel, load_turn_model

LOG_FLOOR = -12.0  # log p_text below this says no more: "the" never ends a question
EDGE = 1e-4  # probabilities are clipped this far from 0 and 1 before their logit


@dataclass(frozen=True)
class Evidence:
    """What is known at a pause: each probability once its model has answered."""

    audio: float | None = None
    text: float | None = None
    words: str | None = None  # the transcript `text` was asked about, as the recognizer wrote it
    asr_logprob: float | None = None  # the recognizer's mean token log-probability for it
    asr_last_word: float | None = None  # its confidence in the last word (a probability)
    asr_end_mark: float | None = None  # ... and in the final punctuation mark (None: no mark, or not given)
    prosody: Prosody | None = None  # how the turn sounds at the pause (None: not measured, or too little voice)

    @property
    def empty(self) -> bool:
        return self.audio is None and self.text is None


def check_decision(config: EndpointingConfig, end_confidence: bool = True) -> None:
    """Load the learned decision the settings name, so that a missing or malformed file stops the
    server as it starts (a ConfigError), not at its first call; as well a file that weighs the
    recognizer's confidence in the transcript's end where the recognizer is not asked for it
    (`end_confidence`: asr.end_confidence)."""
    if config.decision == "learned" and config.text_signal:
        model = load_turn_model(config.decision_file)
        weighed = sorted(f for f in END_CONFIDENCE_FEATURES if model.weights.get(f, 0.0))
        if weighed and not end_confidence:
            raise ConfigError(f"the end-of-turn decision file {config.decision_file or str(SHIPPED)!r} weighs "
                              f"{', '.join(weighed)}, the recognizer's confidence in a transcript's end: set "
                              "asr.end_confidence=true (or choose another endpointing.decision_file)")


def bare_words(text: str) -> str:
    """The transcript without its final punctuation: Whisper ends even a cut-off phrase with "?" or
    ".", and the language model believes it ("Can you book me a table for?" gets 0.9)."""
    return re.sub(r"[\s.?!,;:…-]+$", "", text.strip())


def _logit(p: float) -> float:
    p = min(1.0 - EDGE, max(EDGE, p))
    return math.log(p / (1.0 - p))


@dataclass(frozen=True)
class Rule:
    audio_weight: float
    text_weight: float
    text_neutral: float
    bias: float
    sure_probability: float
    doubt_probability: float


class TurnPolicy:
    """`words`: whether the words' probability will come (else the `without_words` rule decides)."""

    def __init__(self, config: EndpointingConfig, words: bool = True, model: TurnModel | None = None) -> None:
        """`model`: the learned decision to use in place of config.decision_file's (the tuner's)."""
        self.max_patience_ms = config.max_patience_ms
        self.model: TurnModel | None = None
        if words and config.text_signal and config.decision == "learned":
            self.model = model or load_turn_model(config.decision_file)
            self.max_patience_ms = self.model.max_patience_ms
            self.rule = Rule(0.0, 0.0, 0.0, 0.0, self.model.sure_probability, self.model.doubt_probability)
        elif words and config.text_signal:
            self.rule = Rule(config.audio_weight, config.text_weight, config.text_neutral, config.bias,
                             config.sure_probability, config.doubt_probability)
        else:
            alone = config.without_words
            self.rule = Rule(alone.audio_weight, 0.0, 0.0, alone.bias, alone.sure_probability,
                             alone.doubt_probability)

    @property
    def hears(self) -> bool:
        """Whether the end-of-turn model's answer counts (else it need not be asked)."""
        if self.model is not None:
            return self.model.hears
        return self.rule.audio_weight > 0

    def probability(self, evidence: Evidence) -> float | None:
        """The fused probability that the caller has finished, or None with no evidence."""
        if evidence.empty:
            return None
        if self.model is not None:  # trained on pauses whose words had come: without them, no answer
            return None if evidence.text is None else self.model.probability(evidence)
        rule = self.rule
        z = rule.bias
        if evidence.audio is not None:
            z += rule.audio_weight * _logit(evidence.audio)
        if evidence.text is not None:
            log_text = max(LOG_FLOOR, math.log(max(evidence.text, 1e-30)))
            z += rule.text_weight * (log_text - rule.text_neutral)
        return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))

    def wait_ms(self, evidence: Evidence) -> float:
        """How much silence this evidence asks for before the turn ends (from the pause's start)."""
        rule = self.rule
        p = self.probability(evidence)
        if p is not None and self.model is not None:
            return self.model.wait_ms(p)
        if p is None or p <= rule.doubt_probability:
            return float(self.max_patience_ms)
        if p >= rule.sure_probability:
            return 0.0
        return self.max_patience_ms * (rule.sure_probability - p) / (rule.sure_probability - rule.doubt_probability)
