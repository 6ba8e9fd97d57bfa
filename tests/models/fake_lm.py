"""FakeByteLM: a fake causal LM for unit tests of constrained decoding, not a model.

Its vocabulary is every printable ASCII character plus a few multi-character pieces that JSON and
the tool-call format are made of, and the specials of Qwen's tool calls. Its logits are a
deterministic pseudo-random function of the last few tokens, so plain and speculative decoding can
be compared token for token, with no rounding difference between a pass over one token and a pass
over many (which the real runtimes have).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from models.llm.lm import LMState, Logits

SPECIALS = ["<|im_end|>", "<tool_call>", "</tool_call>"]
PIECES = ['{"', '":', ' "', '",', '", "', ': ', ', "', '"}', '}}', '"}}', "name", "arguments", "book", "_table",
          "party", "_size", "time", "day", "order", "_status", "\n", "  ", "ing", " the", "00", "12"]


class FakeByteLM:
    runtime = "fake"
    precision = "fake"

    def __init__(self, name: str = "fake-byte-lm", context: int = 3, scale: float = 3.0,
                 bias: dict[str, float] | None = None) -> None:
        self.name = name
        self.pieces: list[str] = SPECIALS + [chr(c) for c in range(32, 127)] + PIECES
        self.vocab_size = len(self.pieces)
        self.index = {p: i for i, p in enumerate(self.pieces)}
        self.stop_ids = frozenset({0})
        self.context, self.scale = context, scale
        self.bias = np.zeros(self.vocab_size, dtype=np.float32)  # e.g. to make "<tool_call>" likely
        for piece, value in (bias or {}).items():
            self.bias[self.index[piece]] = value
        self.passes = 0  # forward passes, to count the steps jump-forward saves

    # -- text ------------------------------------------------------------------------------------
    def chat_tokens(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None) -> list[int]:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return self.encode(text + ("assistant: " if add_generation_prompt else ""))

    def encode(self, text: str) -> list[int]:
        """Longest match first over the non-special pieces."""
        out, i = [], 0
        ordinary = sorted((p for p in self.pieces if p not in SPECIALS), key=len, reverse=True)
        while i < len(text):
            piece = next((p for p in ordinary if text.startswith(p, i)), None)
            if piece is None:
                raise ValueError(f"the fake vocabulary cannot write {text[i]!r}")
            out.append(self.index[piece])
            i += len(piece)
        return out

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids if self.pieces[i] not in SPECIALS)

    def token_texts(self) -> list[bytes]:
        return [p.encode() for p in self.pieces]

    def token_bytes(self) -> list[bytes]:
        return [b"" if p in SPECIALS else p.encode() for p in self.pieces]

    def special_id(self, text: str) -> int | None:
        return self.index[text] if text in SPECIALS else None

    # -- the "model" -----------------------------------------------------------------------------
    def _logits(self, tokens: list[int]) -> Logits:
        key = hashlib.sha256(np.asarray(tokens[-self.context:], dtype=np.int64).tobytes()).digest()
        rng = np.random.default_rng(int.from_bytes(key[:8], "little"))
        return (rng.standard_normal(self.vocab_size).astype(np.float32) * self.scale + self.bias).astype(np.float32)

    def new_state(self) -> LMState:
        return LMState(cache=None)

    def release(self, state: LMState) -> None:
        state.tokens = []

    def extend(self, state: LMState, tokens: list[int], keep_logits: int = 1) -> Logits:
        self.passes += 1
        start = len(state.tokens)
        state.tokens.extend(tokens)
        rows = [self._logits(state.tokens[: start + i + 1]) for i in range(len(tokens) - keep_logits, len(tokens))]
        return np.stack(rows)

    def truncate(self, state: LMState, length: int) -> None:
        del state.tokens[length:]

    def prefill(self, state: LMState, prompt: list[int]) -> tuple[Logits, int]:
        keep = 0
        while keep < min(len(state.tokens), len(prompt) - 1) and state.tokens[keep] == prompt[keep]:
            keep += 1
        self.truncate(state, keep)
        return self.extend(state, prompt[keep:])[-1], len(prompt) - keep

    def remember_prefix(self, tokens: list[int], pinned: bool = False) -> None:
        pass

    def close(self) -> None:
        pass
