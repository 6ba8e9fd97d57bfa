"""Turning logits into a next-token distribution, the same way for every decoder.

The speculative verifier relies on this being the single definition: the target's p and the
draft's q must be filtered identically (temperature, then top-k, then top-p) for rejection
sampling to keep the target's distribution exactly.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from models.protocols import SamplingParams

Probs = npt.NDArray[np.float32]
Rng = np.random.Generator


def probabilities(logits: npt.NDArray[np.float32], params: SamplingParams) -> Probs:
    """logits [..., V] -> probabilities [..., V] in float32 after temperature, top-k and top-p.

    At temperature 0 the result is one-hot on the argmax (greedy decoding as a distribution,
    which makes greedy speculative decoding a special case of the same rule)."""
    logits = np.asarray(logits, dtype=np.float32)
    vocab = logits.shape[-1]
    if params.temperature <= 0:
        out = np.zeros_like(logits)
        np.put_along_axis(out, logits.argmax(-1)[..., None], 1.0, axis=-1)
        return out
    scaled = logits / np.float32(params.temperature)
    if 0 < params.top_k < vocab:
        # Work on the k best only (sorting 150k logits per position would cost more than the filter).
        part = np.argpartition(-scaled, params.top_k - 1, axis=-1)[..., : params.top_k]  # [..., k]
        values = np.take_along_axis(scaled, part, axis=-1)
        order = np.argsort(-values, axis=-1, kind="stable")
        index = np.take_along_axis(part, order, axis=-1)  # [..., k], best first
        probs = _top_p_sorted(_softmax(np.take_along_axis(values, order, axis=-1)), params.top_p)
    elif params.top_p < 1.0:
        index = np.argsort(-scaled, axis=-1, kind="stable")
        probs = _top_p_sorted(_softmax(np.take_along_axis(scaled, index, axis=-1)), params.top_p)
    else:
        return _softmax(scaled)
    out = np.zeros_like(scaled)
    np.put_along_axis(out, index, probs, axis=-1)
    return out


def _softmax(x: npt.NDArray[np.float32]) -> Probs:
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def _top_p_sorted(sorted_probs: Probs, top_p: float) -> Probs:
    """Keep the smallest head of a descending distribution whose mass reaches top_p; renormalize."""
    if top_p >= 1.0:
        return sorted_probs
    # drop a token when the tokens ranked above it already reach top_p (the top token always stays)
    drop = (np.cumsum(sorted_probs, -1) - sorted_probs) >= top_p
    kept = np.where(drop, np.float32(0.0), sorted_probs)
    return (kept / kept.sum(-1, keepdims=True)).astype(np.float32)


def sample(probs: Probs, rng: Rng) -> int:
    """One token id from a distribution [V] (inverse-CDF on one uniform draw)."""
    cdf = np.cumsum(probs, dtype=np.float64)
    u = rng.random() * cdf[-1]
    return int(min(np.searchsorted(cdf, u, side="right"), len(cdf) - 1))


def make_generator(seed: int | None) -> Rng:
    return np.random.default_rng(seed)
