"""Draft-model proposer: a small model of the target's family (the Qwen2.5 0.5B for the 1.5B)
drafts K tokens autoregressively from its own KV cache, sampling with the same filters as the
target so its q and the target's p are comparable.

When the conversation's last `copy_min` tokens already occurred earlier (the reply is repeating
the caller's words), it copies what followed them instead (an n-gram draft, a point mass): such
copies are accepted often and cost nothing, where the draft model would cost K forward passes."""

from __future__ import annotations

import numpy as np

from core.errors import IncompatibleModelsError
from models.llm.lm import CausalLM
from models.llm.sampling import Probs, Rng, probabilities, sample
from models.protocols import SamplingParams
from models.speculative.ngram import lookup_match
from models.speculative.proposer import Draft

PROBES = ("Hello! Your order: 2 pizzas, 1 salad.", "The meeting is at 7:30 pm on Tuesday, isn't it?")


def check_compatible(target: CausalLM, draft: CausalLM) -> None:
    """Refuse a draft whose vocabulary or tokenizer differs from the target's: its token ids would
    mean other words, and rejection sampling over them would be meaningless."""
    problems = []
    if target.vocab_size != draft.vocab_size:
        problems.append(f"vocabulary sizes differ ({target.vocab_size} vs {draft.vocab_size})")
    else:
        t_texts, d_texts = target.token_texts(), draft.token_texts()
        differing = sum(a != b for a, b in zip(t_texts, d_texts, strict=True))
        if differing:
            problems.append(f"tokenizers differ ({differing} token ids have other texts)")
    if not problems and any(target.encode(p) != draft.encode(p) for p in PROBES):
        problems.append("tokenizers split the same text differently")
    if problems:
        raise IncompatibleModelsError(
            f"draft model {draft.name!r} cannot draft for {target.name!r}: {'; '.join(problems)}. "
            "Use a draft of the same family (e.g. qwen2.5-coder-0.5b-instruct-q4_k_m for "
            "qwen2.5-coder-1.5b-instruct-q4_k_m), "
            "or the ngram method."
        )


class DraftModelProposer:
    name = "draft_model"

    def __init__(self, draft: CausalLM, copy_min: int = 3) -> None:
        self.lm = draft
        self.state = draft.new_state()
        self.copy_min = copy_min

    def propose(self, context: list[int], k: int, params: SamplingParams, rng: Rng) -> Draft:
        if k <= 0:
            return Draft([], None)
        if self.copy_min:
            copied, matched = lookup_match(context[-4096:], k, self.copy_min, max(self.copy_min, 6))
            if len(copied) >= min(k, 2):
                return Draft(copied, None, source="ngram", matched=matched)
        # The draft cache rolls back to its longest common prefix with the context (exactly what
        # the target kept) and computes only the rest.
        logits, _ = self.lm.prefill(self.state, context)  # [V]
        tokens: list[int] = []
        qs: list[Probs] = []
        for i in range(k):
            q = probabilities(logits, params)  # [V]
            token = int(logits.argmax()) if params.temperature <= 0 else sample(q, rng)
            tokens.append(token)
            qs.append(q)
            if i < k - 1:
                logits = self.lm.extend(self.state, [token])[-1]
        return Draft(tokens, np.stack(qs), source=self.name)  # q: [k, V]

    def close(self) -> None:
        self.lm.release(self.state)
