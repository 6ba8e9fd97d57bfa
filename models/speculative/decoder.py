"""The speculative decoding step, and the strategy that plugs it into the embedded backend.

A step (SpeculativeDecoder.next), with the target cache holding everything but `pending`:

    K = controller.choose(...)                       # 0: a plain step
    draft = proposer.propose(tokens + [pending], K)  # d_1..d_k, q [k, V]
    logits = target.extend([pending, d_1..d_k])      # [k + 1, V], one forward pass
    verdict = verify(p(logits), draft, q)            # a accepted, plus a recovered or bonus token
    target.truncate(.. + 1 + a)                      # roll back the rejected positions exactly
    -> d_1..d_a + [token]                            # the new pending is the last of these

The draft model's own cache rolls back at its next proposal (to its common prefix with the new
sequence), so both caches always equal a fresh prefill of the accepted sequence.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from core.clock import Clock
from core.errors import ConfigError
from models.llm.generation import Decoder, PlainDecoder
from models.llm.lm import CausalLM, LMState
from models.llm.sampling import probabilities
from models.llm.tool_guide import GuideState, ToolGuide
from models.protocols import GenerationStats, SamplingParams
from models.speculative.controller import CostModel, KController
from models.speculative.draft_model import DraftModelProposer, check_compatible
from models.speculative.ngram import NgramProposer
from models.speculative.proposer import Proposer
from models.speculative.verifier import verify_greedy, verify_sampled

log = logging.getLogger(__name__)
METHODS = ("off", "ngram", "draft_model")
# A probe (K chosen to test acceptance, not backed by it) verifies a copied draft only when at least
# this many tokens matched where it was copied from: a failed probe costs a whole step, which a
# short reply on a compute-bound CPU feels (-10 % on a 10-token reply), and weak matches mostly fail.
PROBE_MIN_MATCH = 3


class SpeculativeDecoder(PlainDecoder):
    def __init__(self, lm: CausalLM, state: LMState, params: SamplingParams, stats: GenerationStats,
                 proposer: Proposer, controller: KController, costs: CostModel, clock: Clock,
                 guide: ToolGuide | None = None) -> None:
        super().__init__(lm, state, params, stats, guide)
        self.method = proposer.name
        self.proposer, self.controller, self.costs, self.clock = proposer, controller, costs, clock
        if len(stats.accepted_per_position) < controller.max_k:
            stats.accepted_per_position.extend([0] * (controller.max_k - len(stats.accepted_per_position)))

    def next(self, pending: int, budget: int) -> list[int]:
        k = self.controller.choose(budget - 1)  # the step adds one more token after the drafted ones
        self.stats.k_chosen.append(k)
        if k == 0:
            return self._plain(pending)
        started = self.clock.now()
        draft = self.proposer.propose([*self.state.tokens, *self.unfed, pending], k, self.params, self.rng)
        tokens, positions = self._allowed(draft.tokens)
        drafted = len(tokens)
        weak_probe = self.controller.probing and draft.q is None and draft.matched < PROBE_MIN_MATCH
        if drafted == 0 or weak_probe:
            if self.controller.probing:
                self.controller.defer_probe()
            self.stats.k_chosen[-1] = 0
            return self._plain(pending)
        if draft.source in ("", self.proposer.name):  # a copied draft says nothing of the model's cost
            self.costs.observe_draft(len(draft.tokens), self.clock.now() - started)

        base = len(self.state.tokens)
        fed = [*self.unfed, pending, *tokens]
        started = self.clock.now()
        logits = self.lm.extend(self.state, fed, keep_logits=drafted + 1)  # [k + 1, V]
        if self.guide is not None:
            logits = np.stack([self.guide.mask(positions[i], logits[i]) for i in range(drafted + 1)])
        if self.params.temperature <= 0:
            verdict = verify_greedy(logits, tokens)
        else:
            q = draft.q[:drafted] if draft.q is not None else None
            verdict = verify_sampled(probabilities(logits, self.params), tokens, q, self.rng)
        self.lm.truncate(self.state, base + len(fed) - drafted + verdict.accepted)
        self.costs.observe_verify(drafted, self.clock.now() - started)

        self.controller.observe(drafted, verdict.accepted)
        self.stats.drafts += 1
        self.stats.draft_tokens += drafted
        self.stats.accepted_tokens += verdict.accepted
        for position in range(verdict.accepted):
            self.stats.accepted_per_position[position] += 1
        kept = tokens[: verdict.accepted]
        if self.guide is None:
            return [*kept, verdict.token]
        tail = self._tail(positions[verdict.accepted], verdict.token)
        self.unfed = tail[:-1]
        return [*kept, *tail]

    def _allowed(self, drafted: list[int]) -> tuple[list[int], list[GuideState]]:
        """The draft up to its first token the grammar rules out, or up to where the grammar forces
        what follows (plain decoding jumps forward there, so the step ends there too); and the
        guide's state before each kept token and after the last."""
        if self.guide is None or self.position is None:
            return drafted, []
        positions = [self.position]
        for token in drafted:
            nxt = self.guide.advance(positions[-1], token)
            if nxt is None:
                break
            positions.append(nxt)
            if self.guide.forced(nxt)[0]:
                break
        return drafted[: len(positions) - 1], positions

    def _tail(self, position: GuideState, token: int) -> list[int]:
        """After the kept drafted tokens: the forced tokens where the grammar has some (the target's
        own next token is not used there, as plain decoding would not ask for it), else the
        target's token and what it forces."""
        assert self.guide is not None
        forced, after = self.guide.forced(position)
        if forced:
            self.position = after
            self.stats.forced_tokens += len(forced)
            return forced
        nxt = self.guide.advance(position, token)
        assert nxt is not None, "the verifier chose a token the grammar does not allow"
        forced, self.position = self.guide.forced(nxt)
        self.stats.forced_tokens += len(forced)
        return [token, *forced]

    def _plain(self, pending: int) -> list[int]:
        started = self.clock.now()
        tokens = super().next(pending, 1)
        self.costs.observe_verify(0, self.clock.now() - started)
        return tokens


@dataclass
class SpecSession:
    """One conversation's speculation: its proposers' state and a K controller per method."""

    strategy: SpeculativeStrategy
    proposers: dict[str, Proposer] = field(default_factory=dict)
    controllers: dict[str, KController] = field(default_factory=dict)
    _cap: int | None = None

    @property
    def cap(self) -> int | None:
        return self._cap

    @cap.setter
    def cap(self, cap: int | None) -> None:
        """The most tokens to draft per step, from now on: the running generation's controller reads
        it at its next step, not only the next turn's."""
        self._cap = cap
        for controller in self.controllers.values():
            controller.cap = cap

    def close(self) -> None:
        for proposer in self.proposers.values():
            proposer.close()
        self.proposers.clear()

    def decoder(self, state: LMState, params: SamplingParams, stats: GenerationStats,
                guide: ToolGuide | None = None) -> Decoder:
        strategy = self.strategy
        method = params.speculation.method if params.speculation else strategy.method
        fixed = params.speculation.k if params.speculation else strategy.fixed_k
        if method == "off" or fixed == 0:
            return PlainDecoder(strategy.lm, state, params, stats, guide)
        if method not in self.proposers:
            self.proposers[method] = strategy.make_proposer(method)
            self.controllers[method] = strategy.make_controller(method)
        controller = self.controllers[method]
        controller.fixed_k = fixed
        controller.cap = self.cap
        return SpeculativeDecoder(strategy.lm, state, params, stats, self.proposers[method], controller,
                                  strategy.costs[method], strategy.clock, guide)


class SpeculativeStrategy:
    """The embedded engine's decoding: plain, n-gram or draft-model speculation, chosen per request
    (default from settings). Costs are measured per method and shared by all sessions."""

    def __init__(self, lm: CausalLM, clock: Clock, *, method: str = "ngram", fixed_k: int | None = None,
                 max_k: int = 8, draft: CausalLM | None = None, ngram_min: int = 1, ngram_max: int = 4,
                 draft_copy_min: int = 3, calibrate: bool = True) -> None:
        if method not in METHODS:
            raise ConfigError(f"unknown speculative method {method!r}; use one of {METHODS}")
        if method == "draft_model" and draft is None:
            raise ConfigError("speculative method draft_model needs a draft model (llm.speculative.draft_model)")
        if draft is not None:
            check_compatible(lm, draft)
        self.lm, self.clock, self.method, self.fixed_k, self.max_k = lm, clock, method, fixed_k, max_k
        self.draft = draft
        self.ngram = (ngram_min, ngram_max)
        self.draft_copy_min = draft_copy_min
        self.costs: dict[str, CostModel] = {m: CostModel(max_k) for m in METHODS if m != "off"}
        if calibrate:
            self.calibrate()

    @property
    def methods(self) -> tuple[str, ...]:
        return ("off", "ngram", "draft_model") if self.draft is not None else ("off", "ngram")

    def new_session(self) -> SpecSession:
        return SpecSession(self)

    def make_proposer(self, method: str) -> Proposer:
        if method == "ngram":
            return NgramProposer(*self.ngram)
        if method == "draft_model":
            if self.draft is None:
                raise ConfigError("draft_model speculation was asked for, but no draft model is loaded "
                                  "(set llm.speculative.draft_model and restart)")
            return DraftModelProposer(self.draft, copy_min=self.draft_copy_min)
        raise ConfigError(f"unknown speculative method {method!r}; use one of {METHODS}")

    def make_controller(self, method: str) -> KController:
        # A neutral prior of two pseudo-counts: where verifying is nearly free (bfloat16) it already
        # pays to draft, where it is not (int8) drafting waits for probes to show high acceptance.
        return KController(self.costs[method], max_k=self.max_k, prior_accepted=1.0, prior_rejected=1.0)

    def calibrate(self, context: int = 64, repeats: int = 3) -> None:
        """Measure the target's forward pass over 1..max_k+1 tokens (and a draft step) once, so the
        controller starts from real costs; later steps keep refining them. Each shape runs
        `repeats` times after one untimed pass (the first pass of a shape pays for set-up), and the
        median counts."""
        prompt = [(1000 + i) % self.lm.vocab_size for i in range(context)]
        state = self.lm.new_state()
        try:
            self.lm.extend(state, prompt)
            verify: list[float] = []
            for k in range(self.max_k + 1):
                seconds = []
                for _ in range(repeats + 1):
                    started = self.clock.now()
                    self.lm.extend(state, prompt[: k + 1], keep_logits=k + 1)
                    seconds.append(self.clock.now() - started)
                    self.lm.truncate(state, context)
                verify.append(sorted(seconds[1:])[len(seconds[1:]) // 2])
        finally:
            self.lm.release(state)
        for costs in self.costs.values():
            costs.verify = list(verify)
        self.costs["ngram"].draft_step = 1e-4
        if self.draft is not None:
            state = self.draft.new_state()
            try:
                self.draft.extend(state, prompt)
                seconds = []
                for i in range(repeats + 1):
                    started = self.clock.now()
                    self.draft.extend(state, [prompt[i]])
                    seconds.append(self.clock.now() - started)
            finally:
                self.draft.release(state)
            self.costs["draft_model"].draft_step = sorted(seconds[1:])[len(seconds[1:]) // 2]
        log.info("speculation costs on %s (%s, ms): verify 1..%d tokens %s, draft step %s",
                 self.lm.name, self.lm.runtime, self.max_k + 1, [round(v * 1000, 1) for v in verify],
                 round((self.costs["draft_model"].draft_step or 0) * 1000, 1) if self.draft else "-")
