"""Turning logits into a next-token distribution, the same way for every decoder.

The speculative verifier relies on this being the single definition: the target's p and the
draft's q must be filtered identically (temperature, then top-k, then top-p) for rejection
sampling to keep the target's distribution exactly.
"""

from __future__ import annotations

import torch

from models.protocols import SamplingParams


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [..., V] -> probabilities [..., V] in float32 after temperature, top-k and top-p.

    At temperature 0 the result is one-hot on the argmax (greedy decoding as a distribution,
    which makes greedy speculative decoding a special case of the same rule)."""
    logits = logits.float()
    vocab = logits.shape[-1]
    if params.temperature <= 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), vocab).float()
    logits = logits / params.temperature
    if 0 < params.top_k < vocab:
        # Work on the k best only (sorting 150k logits per position would cost more than the filter).
        values, index = torch.topk(logits, params.top_k, dim=-1)  # [..., k], sorted descending
        probs = _top_p_sorted(values.softmax(-1), params.top_p)
        return torch.zeros_like(logits).scatter_(-1, index, probs)
    if params.top_p < 1.0:
        values, index = torch.sort(logits, dim=-1, descending=True)
        probs = _top_p_sorted(values.softmax(-1), params.top_p)
        return torch.zeros_like(logits).scatter_(-1, index, probs)
    return logits.softmax(-1)


def _top_p_sorted(sorted_probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest head of a descending distribution whose mass reaches top_p; renormalize."""
    if top_p >= 1.0:
        return sorted_probs
    # drop a token when the tokens ranked above it already reach top_p (the top token always stays)
    drop = (sorted_probs.cumsum(-1) - sorted_probs) >= top_p
    kept = sorted_probs.masked_fill(drop, 0.0)
    return kept / kept.sum(-1, keepdim=True)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token id from a distribution [V]."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def make_generator(seed: int | None) -> torch.Generator:
    gen = torch.Generator()
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen
