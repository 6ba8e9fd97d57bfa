"""What a proposer is: something that drafts tokens to follow a sequence.

Draft-model and n-gram proposers exist; heads on the target's own hidden states (Medusa/EAGLE
style) fit the same protocol: they would read the target's last hidden state instead of a cache of
their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from models.llm.sampling import Probs, Rng
from models.protocols import SamplingParams


@dataclass(frozen=True)
class Draft:
    tokens: list[int]  # [k] drafted token ids, k <= the K asked for (may be 0)
    q: Probs | None  # [k, V] distributions they were drawn from; None: each is a point mass
    source: str = ""  # what drafted them, when a proposer has more than one way
    matched: int = 0  # copied drafts: how many tokens of the context's end matched where they were copied


class Proposer(Protocol):
    name: str

    def propose(self, context: list[int], k: int, params: SamplingParams, rng: Rng) -> Draft:
        """Draft up to k tokens to follow `context` (every token so far, including the last
        produced one). Blocking; runs on the model's worker thread."""
        ...

    def close(self) -> None:
        """Free what the proposer holds for its conversation (a draft model's cache)."""
        ...
