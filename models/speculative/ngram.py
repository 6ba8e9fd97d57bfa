"""Prompt-lookup (n-gram) proposer: drafts by copying what followed the latest earlier occurrence
of the sequence's last n tokens. Costs microseconds; strong when the reply repeats the caller's
words (a voice agent confirming an order) or earlier text."""

from __future__ import annotations

import numpy as np

from models.llm.sampling import Rng
from models.protocols import SamplingParams
from models.speculative.proposer import Draft


class NgramProposer:
    name = "ngram"

    def __init__(self, min_n: int = 1, max_n: int = 4, window: int = 4096) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {min_n}, {max_n}")
        self.min_n, self.max_n, self.window = min_n, max_n, window

    def propose(self, context: list[int], k: int, params: SamplingParams, rng: Rng) -> Draft:
        tokens, matched = lookup_match(context[-self.window:], k, self.min_n, self.max_n)
        return Draft(tokens, None, matched=matched)

    def close(self) -> None:
        pass


def lookup_match(context: list[int], k: int, min_n: int, max_n: int) -> tuple[list[int], int]:
    """Up to k tokens that followed the most recent earlier match of the longest suffix n-gram, and
    the length of that n-gram (0: none matched)."""
    if k <= 0 or len(context) < min_n + 1:
        return [], 0
    seq = np.asarray(context, dtype=np.int64)
    for n in range(min(max_n, len(seq) - 1), min_n - 1, -1):
        suffix = seq[-n:]
        windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)  # [L - n, n]: all but the suffix itself
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n  # continuation of the most recent match
            return [int(t) for t in seq[start:start + k]], n
    return [], 0
