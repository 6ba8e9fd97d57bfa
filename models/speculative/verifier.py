"""Modified rejection sampling (Leviathan et al. 2023; Chen et al. 2023).

Given the target's distributions p over the K drafted positions plus one, and the draft's q, keep
drafted tokens left to right with probability min(1, p(x)/q(x)); at the first rejection, sample a
recovered token from the normalized max(0, p - q); if all K are kept, sample a bonus token from
p[K]. The tokens produced are then distributed exactly as if sampled from the target alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.llm.lm import Logits
from models.llm.sampling import Probs, Rng, sample


@dataclass(frozen=True)
class Verdict:
    accepted: int  # how many drafted tokens were kept (0..K)
    token: int  # the recovered token (accepted < K) or the bonus token (accepted == K)


def verify_greedy(target_logits: Logits, drafted: list[int]) -> Verdict:
    """Temperature 0: keep drafted tokens while each equals the target's argmax.
    target_logits: [K + 1, V]."""
    best = target_logits.argmax(-1).tolist()  # [K + 1]
    accepted = 0
    while accepted < len(drafted) and drafted[accepted] == best[accepted]:
        accepted += 1
    return Verdict(accepted, int(best[accepted]))


def verify_sampled(p: Probs, drafted: list[int], q: Probs | None, rng: Rng) -> Verdict:
    """p: [K + 1, V] target distributions; q: [K, V] draft distributions, or None when each drafted
    token was proposed deterministically (q is then a point mass on it)."""
    k = len(drafted)
    uniforms = rng.random(k).tolist() if k else []  # [K]
    for i, token in enumerate(drafted):
        p_x = float(p[i, token])
        q_x = float(q[i, token]) if q is not None else 1.0
        if q_x > 0 and uniforms[i] < min(1.0, p_x / q_x):
            continue
        if q is not None:
            residual = np.maximum(p[i] - q[i], 0.0)  # [V]
        else:
            residual = p[i].copy()
            residual[token] = 0.0  # max(0, p - onehot(x)): p with the rejected token removed
        total = float(residual.sum())
        # total is > 0 whenever a rejection is possible; guard against float round-off anyway
        recovered = sample(residual / total, rng) if total > 1e-12 else sample(p[i], rng)
        return Verdict(i, recovered)
    return Verdict(k, sample(p[k], rng))
