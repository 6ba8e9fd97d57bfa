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

from models.llm.lm import CausalLM, LMState, Logits
from models.llm.sampling import make_generator, probabilities, sample
from models.llm.tool_guide import GuideState, ToolGuide
from models.protocols import GenerationStats, SamplingParams


class Decoder(Protocol):
    method: str

    def first(self, prompt: list[int]) -> list[int]:
        """Prefill the prompt (reusing the cache) and produce the first token(s)."""
        ...

    def next(self, pending: int, budget: int) -> list[int]:
        """Feed `pending` and produce up to `budget` more tokens (at least one)."""
        ...


class PlainDecoder:
    """One target forward pass per token; with a tool guide, the grammar's mask on each choice and
    its forced tokens emitted without a pass (they are fed with the next step's token)."""

    method = "off"

    def __init__(self, lm: CausalLM, state: LMState, params: SamplingParams, stats: GenerationStats,
                 guide: ToolGuide | None = None) -> None:
        self.lm, self.state, self.params, self.stats = lm, state, params, stats
        self.rng = make_generator(params.seed)
        self.guide = guide
        self.position: GuideState | None = guide.start() if guide else None
        self.unfed: list[int] = []  # tokens produced but not in the cache yet, before the pending one
        self.queue: list[int] = []  # forced tokens still to emit one step each (a guide without jump-forward)

    def first(self, prompt: list[int]) -> list[int]:
        opening = self._opening()
        logits, self.stats.prefill_tokens = self.lm.prefill(self.state, prompt + opening)  # [V]
        return opening + self._choose(logits)

    def next(self, pending: int, budget: int) -> list[int]:
        logits = self.lm.extend(self.state, [*self.unfed, pending])[-1]  # [V]
        if self.queue:  # the model's step was paid for, but the grammar already chose
            self.unfed = []
            return [self.queue.pop(0)]
        return self._choose(logits)

    def _opening(self) -> list[int]:
        """What the reply must start with (a tool call the request requires), fed with the prompt."""
        if self.guide is None or self.position is None:
            return []
        opening: list[int] = []
        for token in self.guide.opening():
            self.position = self.guide.advance(self.position, token)
            assert self.position is not None
            opening.append(token)
        forced, self.position = self.guide.forced(self.position)
        self.stats.forced_tokens += len(opening) + len(forced)
        return opening + forced  # fed with the prompt: no step of its own, jump-forward or not

    def _choose(self, logits: Logits) -> list[int]:
        """The next token, then whatever the grammar forces after it."""
        if self.guide is None or self.position is None:
            return [self._pick(logits)]
        token = self._pick(self.guide.mask(self.position, logits))
        return self._after(self.position, [token])

    def _after(self, position: GuideState, tokens: list[int]) -> list[int]:
        """Move the guide over `tokens` (all allowed), add what it forces, and note what is unfed."""
        assert self.guide is not None
        for token in tokens:
            nxt = self.guide.advance(position, token)
            assert nxt is not None, "a token the grammar does not allow was chosen"
            position = nxt
        forced, self.position = self.guide.forced(position)
        self.stats.forced_tokens += len(forced)
        if not self.guide.jump_forward:
            self.queue = forced
            forced = []
        out = [*tokens, *forced]
        self.unfed = out[:-1]
        return out

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
