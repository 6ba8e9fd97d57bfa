"""The seam between the decoding engine and a causal language model runtime.

Two runtimes implement it: llama.cpp over a pack's own GGUF file (models/llm/llama_cpp_lm.py, the
default on CPU) and PyTorch over a Hugging Face folder (models/llm/torch_lm.py, the exactness reference
and the way to run Hugging Face ids). The plain and speculative decoders, the draft-model proposer
and the calibration see only this protocol.

Logits cross it as float32 NumPy arrays: [n, V] for the last n fed positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

Logits = npt.NDArray[np.float32]


@dataclass
class LMState:
    """One sequence: the runtime's handle on its KV cache (a PyTorch cache object, or a llama.cpp
    sequence id) and the ids of the tokens the cache holds (cache length == len(tokens))."""

    cache: Any
    tokens: list[int] = field(default_factory=list)


class CausalLM(Protocol):
    name: str
    runtime: str  # "llama.cpp" or "torch"
    precision: str  # what the weights compute in, e.g. "Q4_K_M" or "int8 linear layers"
    vocab_size: int
    stop_ids: frozenset[int]

    def chat_tokens(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The chat template's tokens for `messages` (and `tools`, in the Chat Completions shape)."""
        ...

    def encode(self, text: str) -> list[int]:
        """Plain text to token ids (no special tokens added)."""
        ...

    def decode(self, ids: list[int]) -> str:
        """Token ids to text, special tokens left out; an incomplete UTF-8 tail becomes U+FFFD."""
        ...

    def token_texts(self) -> list[bytes]:
        """Every token id's text, for comparing two models' vocabularies."""
        ...

    def token_bytes(self) -> list[bytes]:
        """Every token id's bytes as it reads in plain text (special tokens: b""), for grammars."""
        ...

    def special_id(self, text: str) -> int | None:
        """The id of the special token written `text` (e.g. "<tool_call>"), None if there is none."""
        ...

    def new_state(self) -> LMState: ...

    def release(self, state: LMState) -> None:
        """Free the sequence's cache (the state must not be used afterwards)."""
        ...

    def extend(self, state: LMState, tokens: list[int], keep_logits: int = 1) -> Logits:
        """Feed tokens after the cached ones in one pass; logits [keep_logits, V] for the last
        `keep_logits` fed positions (the distribution of the token following each)."""
        ...

    def truncate(self, state: LMState, length: int) -> None:
        """Roll the cache back so it holds exactly the first `length` tokens."""
        ...

    def prefill(self, state: LMState, prompt: list[int]) -> tuple[Logits, int]:
        """Make the cache hold `prompt`, computing only what it does not already hold (at least the
        last token). Returns (logits [V] for the token after the prompt, tokens computed)."""
        ...

    def remember_prefix(self, tokens: list[int], pinned: bool = False) -> None:
        """Keep the cache of a prefix many sequences start with (a system prompt), so a new
        sequence that starts with it copies it instead of computing it. A pinned prefix (the
        default system prompt) is never forgotten to make room for others. May do nothing."""
        ...


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
