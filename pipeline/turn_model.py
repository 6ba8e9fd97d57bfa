"""The learned end-of-turn decision: a logistic model of P(the caller has finished | what is known at
the pause), trained by `bench/turn_detection.py --train` on the tuned voice families' pauses and
shipped as a small JSON file (pipeline/turn_decision.json), with the patience curve chosen with it.

The features are read off the evidence (pipeline/turn_policy.Evidence):
- the words: whether the language model's probability that the sentence ends has come, its natural
  log (clipped to [-12, 0]) and that log's excess over a few knees (a piecewise-linear response, so
  the model can trust a very likely end far more than a likely one);
- how Whisper ended the transcript: "?" or "!", "." , a trailing "..." or "," or none (Whisper's
  mark alone cannot be trusted, "Can you book me a table for?", but it is evidence all the same);
- the recognizer's own confidence: the transcript's mean token log-probability, and its log-
  probability of the last word and of the final punctuation mark (a word cut mid-way, or a
  sentence Whisper closed on a guess, is written with low confidence however complete it looks);
- the sound: whether the end-of-turn model has answered, and its log-odds (weight 0 where the
  training found it does not carry across voices);
- the prosody at the pause, against the caller's own voice in the turn (pipeline/prosody.py): where
  the pitch ends in the caller's range and how it moves, whether the last stretch was drawn out, and
  how much the voice faded.
A feature the file does not weigh counts 0. The silence waited follows the probability: none at or
above `sure_probability`, `max_patience_ms` at or below `doubt_probability`, and in between from
`hold_ms` (just under sure) up to `max_patience_ms`, in proportion. A hold longer than the pauses a
caller makes mid-sentence keeps the doubtful turns from being cut off, and the confident ones end at
once: a step, where the hand-set rule's straight line had to push its "sure" out of reach.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import ConfigError
from pipeline.prosody import NAMES as PROSODY_NAMES

if TYPE_CHECKING:
    from pipeline.turn_policy import Evidence

SHIPPED = Path(__file__).with_name("turn_decision.json")
FORMAT = "voice-agent-turn-decision/1"
LOG_FLOOR = -12.0
KNEES = (-6.0, -3.0, -1.5, -0.75)
EDGE = 1e-4
ASR_LOGPROB_UNKNOWN = -0.27  # a recognizer that gives no confidence: the median pause transcript's (faster-whisper)
TAIL_FLOOR = -5.0  # the last word's and the end mark's log-probabilities are clipped here
# ... and, where the recognizer gives none (its full-window fallback), taken as the median pause
# transcript's on the tuned families (docs/bench/turn_detection_issue31b_full.json.gz)
LAST_WORD_UNKNOWN = -0.1
END_MARK_UNKNOWN = -0.19

END_CONFIDENCE_FEATURES = ("asr_last_word", "asr_end_mark")  # need asr.end_confidence
PROSODY_FEATURES = ("prosody", *(f"prosody_{n}" for n in PROSODY_NAMES))  # need the turn's sound measured
PROSODY_LIMITS = {"pitch_end": 3.0, "pitch_slope": 5.0, "final_stretch": 2.0, "energy_drop": 30.0}  # clipped to +-
FEATURES = (
    "bias", "words", "log_p_words", *(f"log_p_words_above_{k:g}" for k in KNEES),
    "ends_question", "ends_period", "ends_open", "asr_logprob", "asr_last_word", "asr_end_mark", "sound",
    "sound_logit", *PROSODY_FEATURES,
)


def features(evidence: Evidence) -> dict[str, float]:
    """The evidence as the model's named inputs (all 0 for a kind not known yet)."""
    f = dict.fromkeys(FEATURES, 0.0)
    f["bias"] = 1.0
    if evidence.text is not None:
        log_p = max(LOG_FLOOR, math.log(max(evidence.text, 1e-30)))
        f["words"] = 1.0
        f["log_p_words"] = log_p
        for k in KNEES:
            f[f"log_p_words_above_{k:g}"] = max(0.0, log_p - k)
        words = (evidence.words or "").strip()
        if re.search(r"(\.\.\.|…|,)$", words) or not re.search(r"[.?!]$", words):
            f["ends_open"] = 1.0
        elif words.endswith(("?", "!")):
            f["ends_question"] = 1.0
        else:
            f["ends_period"] = 1.0
        confidence = ASR_LOGPROB_UNKNOWN if evidence.asr_logprob is None else evidence.asr_logprob
        f["asr_logprob"] = max(-3.0, min(0.0, confidence))
        f["asr_last_word"] = _log_or(evidence.asr_last_word, LAST_WORD_UNKNOWN)
        if not f["ends_open"]:  # an open end has no mark to be sure of
            f["asr_end_mark"] = _log_or(evidence.asr_end_mark, END_MARK_UNKNOWN)
    if evidence.prosody is not None:
        f["prosody"] = 1.0
        for name, value in evidence.prosody.as_dict().items():
            limit = PROSODY_LIMITS[name]
            f[f"prosody_{name}"] = max(-limit, min(limit, value))
    if evidence.audio is not None:
        p = min(1.0 - EDGE, max(EDGE, evidence.audio))
        f["sound"] = 1.0
        f["sound_logit"] = math.log(p / (1.0 - p))
    return f


def _log_or(p: float | None, unknown: float) -> float:
    return unknown if p is None else max(TAIL_FLOOR, math.log(max(p, 1e-30)))


@dataclass(frozen=True)
class TurnModel:
    weights: dict[str, float]
    sure_probability: float
    doubt_probability: float
    max_patience_ms: int
    trained_on: str  # what the file says it was trained and tuned on
    hold_ms: int = 0  # the silence waited just under sure_probability

    @property
    def weighs_prosody(self) -> bool:
        """Whether the turn's prosody (pipeline/prosody.py) counts (else it need not be measured)."""
        return any(self.weights.get(name, 0.0) != 0.0 for name in PROSODY_FEATURES)

    @property
    def hears(self) -> bool:
        """Whether the end-of-turn model's answer counts."""
        return self.weights.get("sound", 0.0) != 0.0 or self.weights.get("sound_logit", 0.0) != 0.0

    def wait_ms(self, p: float) -> float:
        """The silence to wait at probability `p` (from the pause's start)."""
        if p >= self.sure_probability:
            return 0.0
        if p <= self.doubt_probability:
            return float(self.max_patience_ms)
        share = (self.sure_probability - p) / (self.sure_probability - self.doubt_probability)
        return self.hold_ms + (self.max_patience_ms - self.hold_ms) * share

    def probability(self, evidence: Evidence) -> float:
        z = sum(self.weights.get(name, 0.0) * value for name, value in features(evidence).items())
        return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "weights": self.weights, "sure_probability": self.sure_probability,
                "doubt_probability": self.doubt_probability, "max_patience_ms": self.max_patience_ms,
                "hold_ms": self.hold_ms, "trained_on": self.trained_on}


@functools.lru_cache(maxsize=8)
def load_turn_model(path: str = "") -> TurnModel:
    """The decision file at `path` (empty: the shipped one); a missing or malformed file is a
    ConfigError that says which and what to do."""
    where = Path(path) if path else SHIPPED
    fix = ("set endpointing.decision_file to a file written by `bench/turn_detection.py --train`, or "
           "endpointing.decision=rule for the hand-set rule")
    try:
        data = json.loads(where.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read the end-of-turn decision file {str(where)!r}: {exc.strerror or exc}; "
                          f"{fix}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"the end-of-turn decision file {str(where)!r} is not JSON ({exc}); {fix}") from exc
    try:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"its format is not {FORMAT!r}")
        weights = {str(k): float(v) for k, v in data["weights"].items()}
        unknown = sorted(set(weights) - set(FEATURES))
        if unknown:
            raise ValueError(f"unknown features {unknown}")
        if not all(math.isfinite(w) for w in weights.values()):
            raise ValueError("a weight is not a finite number")
        model = TurnModel(weights, float(data["sure_probability"]), float(data["doubt_probability"]),
                          int(data["max_patience_ms"]), str(data.get("trained_on", "")), int(data.get("hold_ms", 0)))
        if not 0 < model.doubt_probability <= model.sure_probability < 1:
            raise ValueError("it needs 0 < doubt_probability <= sure_probability < 1")
        if model.max_patience_ms < 64:
            raise ValueError("max_patience_ms is under 64")
        if not 0 <= model.hold_ms <= model.max_patience_ms:
            raise ValueError("hold_ms must lie between 0 and max_patience_ms")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"the end-of-turn decision file {str(where)!r} is not usable: {exc}; {fix}") from exc
    return model
