"""Training the learned end-of-turn decision (pipeline/turn_model.py) on gathered pauses.

One row per pause whose transcript is evidence (pipeline/transcript_trust.py): the model's features
with the words known, labelled 1 where the pause is the caller's true end (no speech follows) and 0
where the caller went on. A logistic regression (L2, Newton's method, a dozen weights) gives a
calibrated P(finished | evidence); the silence waited for each probability (the patience curve) is
then chosen by `bench/turn_detection.py`'s tuner on the same tuned families, never on held-out ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from bench.turn_evidence import Pause
from bench.turn_set import Sample
from pipeline.prosody import Prosody
from pipeline.transcript_trust import doubt
from pipeline.turn_model import FEATURES, KNEES, PROSODY_FEATURES, TurnModel, features
from pipeline.turn_policy import Evidence

FINAL_TOLERANCE_MS = 300.0  # a pause that begins this close to the true end (or after) is the end
TEXT_FEATURES = tuple(f for f in FEATURES if f not in ("words", "sound", "sound_logit", *PROSODY_FEATURES))
SOUND_FEATURES = ("sound", "sound_logit")


def is_final(sample: Sample, pause: Pause) -> bool:
    return pause.silence_from_ms >= sample.true_end_ms - FINAL_TOLERANCE_MS


def pause_evidence(pause: Pause, words_known: bool, sound_known: bool) -> Evidence:
    """The evidence at a pause as the session would hand it over (an untrusted transcript: none)."""
    trusted = words_known and pause.p_text is not None and doubt(
        pause.words, pause.speech_ms / 1000, pause.avg_logprob, pause.no_speech_prob) is None
    return Evidence(audio=pause.p_audio if sound_known else None,
                    text=pause.p_text if trusted else None,
                    words=pause.words if trusted else None,
                    asr_logprob=pause.avg_logprob if trusted else None,
                    asr_last_word=pause.last_word_prob if trusted else None,
                    asr_end_mark=pause.end_mark_prob if trusted else None,
                    prosody=None if pause.prosody is None else Prosody(**pause.prosody))


def rows(pairs: Iterable[tuple[Sample, Pause]], names: Sequence[str], sound: bool) -> tuple[np.ndarray, np.ndarray]:
    x, y = [], []
    for sample, pause in pairs:
        evidence = pause_evidence(pause, True, sound)
        if evidence.text is None:
            continue
        f = features(evidence)
        x.append([f[n] for n in names])
        y.append(1.0 if is_final(sample, pause) else 0.0)
    return np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1.0, iterations: int = 50) -> np.ndarray:
    """Weights (x: [rows, features], the first column the bias, which is not penalized)."""
    w = np.zeros(x.shape[1])
    penalty = np.full(x.shape[1], l2)
    penalty[0] = 0.0
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(x @ w, -60, 60)))  # [rows]
        gradient = x.T @ (p - y) + penalty * w  # [features]
        hessian = (x * (p * (1 - p))[:, None]).T @ x + np.diag(penalty) + 1e-9 * np.eye(len(w))
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if np.max(np.abs(step)) < 1e-8:
            break
    return w


def slopes(weights: dict[str, float]) -> list[float]:
    """The model's slope in the words' log-probability on each segment between the knees."""
    out, slope = [], weights.get("log_p_words", 0.0)
    out.append(slope)
    for k in KNEES:
        slope += weights.get(f"log_p_words_above_{k:g}", 0.0)
        out.append(slope)
    return out


def train(pairs: list[tuple[Sample, Pause]], sound: bool, trained_on: str,
          without: Sequence[str] = (), prosody: bool = False) -> TurnModel:
    """The model's weights from these pauses; the patience curve is a placeholder for the tuner.
    The words' response is kept monotone (a likelier end never lowers the probability): a knee whose
    segment would slope down is dropped and the model fitted again. `without`: features left out;
    `prosody`: weigh the turn's prosody too (off by default: measured, it does not carry across voices)."""
    names = [n for n in (*TEXT_FEATURES, *(SOUND_FEATURES if sound else ()), *(PROSODY_FEATURES if prosody else ()))
             if n not in without]
    x, y = rows(pairs, names, sound)
    if len(y) == 0 or y.min() == y.max():
        raise ValueError("training needs pauses of both kinds with trusted transcripts")
    keep = list(range(len(names)))
    while True:
        w = fit_logistic(x[:, keep], y)
        weights = {names[i]: round(float(v), 5) for i, v in zip(keep, w, strict=True)}
        falling = [k for k, slope in zip((None, *KNEES), slopes(weights), strict=True) if slope < 0]
        if not falling:
            return TurnModel(weights, 0.9, 0.1, 1500, trained_on)
        knee = falling[0]
        name = "log_p_words" if knee is None else f"log_p_words_above_{knee:g}"
        if name not in weights or name == "log_p_words":
            return TurnModel(weights, 0.9, 0.1, 1500, trained_on)  # the base slope itself: leave it to the tuner
        keep.remove(names.index(name))
