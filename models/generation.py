"""The decoding loop of the embedded LLM, one step at a time.

A Decoder turns the state of a sequence into its next token(s): plain decoding gives one token a
step; the speculative decoder (models/spec) gives one or more. The loop runs each step as one job on
the model's worker thread, so several conversations interleave at step granularity and a cancelled
turn stops after at most one step.

Invariant between steps: the target's cache holds every token of the sequence except `pending`,
the last token produced, which the next step feeds first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from models.lm import CausalLM, LMState, Logits
from models.protocols import GenerationStats, SamplingParams
from models.sampling import make_generator, probabilities, sample


class Decoder(Protocol):
    method: str

    def first(self, prompt: list[int]) -> list[int]:
        """Prefill the prompt (reusing the cache) and produce the first token(s)."""
        ...

    def next(self, pending: int, budget: int) -> list[int]:
        """Feed `pending` and produce up to `budget` more tokens (at least one)."""
        ...


class PlainDecoder:
    """One target forward pass per token."""

    method = "off"

    def __init__(self, lm: CausalLM, state: LMState, params: SamplingParams, stats: GenerationStats) -> None:
        self.lm, self.state, self.params, self.stats = lm, state, params, stats
        self.rng = make_generator(params.seed)

    def first(self, prompt: list[int]) -> list[int]:
        logits, self.stats.prefill_tokens = self.lm.prefill(self.state, prompt)  # [V]
        return [self._pick(logits)]

    def next(self, pending: int, budget: int) -> list[int]:
        logits = self.lm.extend(self.state, [pending])[-1]  # [V]
        return [self._pick(logits)]

    def _pick(self, logits: Logits) -> int:
        if self.params.temperature <= 0:
            return int(logits.argmax())
        return sample(probabilities(logits, self.params), self.rng)


@dataclass
class StepResult:
    tokens: list[int]
    done: bool


class GenerationLoop:
    """Drives a Decoder until a stop token or the token limit. Not thread-safe: one thread steps it."""

    def __init__(self, lm: CausalLM, decoder: Decoder, prompt: list[int], params: SamplingParams,
                 stats: GenerationStats) -> None:
        self.lm, self.decoder, self.prompt, self.params, self.stats = lm, decoder, prompt, params, stats
        self.produced: list[int] = []
        self.started = False
        self.done = False
        stats.prompt_tokens = len(prompt)
        stats.method = decoder.method

    def step(self) -> StepResult:
        if self.done:
            return StepResult([], True)
        budget = self.params.max_tokens - len(self.produced)
        if not self.started:
            self.started = True
            new = self.decoder.first(self.prompt)
        else:
            new = self.decoder.next(self.produced[-1], budget)
        out: list[int] = []
        for tok in new[:budget]:
            if tok in self.lm.stop_ids:
                self.done = True
                self.stats.finish_reason = "stop"
                break
            out.append(tok)
        self.produced.extend(out)
        if not self.done and len(self.produced) >= self.params.max_tokens:
            self.done = True
            self.stats.finish_reason = "length"
        self.stats.completion_tokens = len(self.produced)
        return StepResult(out, self.done)


class Detokenizer:
    """Incremental detokenization: text deltas that never split a multi-byte character."""

    def __init__(self, lm: CausalLM) -> None:
        self.lm = lm
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, tokens: list[int]) -> str:
        self.ids.extend(tokens)
        text = self.lm.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        delta = text[len(self.emitted):] if text.startswith(self.emitted) else ""
        self.emitted = text
        return delta
