"""The K controller chooses speculation only when it pays, from measured acceptance and costs."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from core.clock import FakeClock
from models.llm.sampling import Rng
from models.protocols import SamplingParams
from models.speculative.controller import CostModel, KController, expected_tokens
from models.speculative.decoder import SpeculativeStrategy
from models.speculative.proposer import Draft
from tests.models.spec_helpers import generate, params, prompt_of
from tests.models.tiny import tiny_lm


def costs(verify_ms: list[float], draft_ms: float) -> CostModel:
    model = CostModel(max_k=8)
    model.verify = [v / 1000 for v in verify_ms]
    model.draft_step = draft_ms / 1000
    return model


FLAT = [230, 200, 200, 210, 215, 220, 230, 235, 250]  # bf16 1.5B on this CPU: verifying 8 ~ 1 token


def test_expected_tokens_formula() -> None:
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert abs(expected_tokens(0.5, 2) - 1.75) < 1e-9


def test_good_cheap_drafts_get_a_large_k() -> None:
    controller = KController(costs(FLAT, 0.1), prior_accepted=9, prior_rejected=1)
    assert controller.choose(100) >= 6


def test_slow_draft_means_plain_decoding() -> None:
    controller = KController(costs(FLAT, 400), prior_accepted=9, prior_rejected=1)
    assert controller.choose(100) == 0


def test_useless_drafts_mean_plain_decoding() -> None:
    controller = KController(costs(FLAT, 0.1))
    for _ in range(30):
        controller.observe(drafted=4, accepted=0)
    assert controller.alpha < 0.05
    assert controller.choose(100) == 0


def test_costly_verification_limits_k() -> None:
    linear = [200 * (k + 1) for k in range(9)]  # float32-like: verifying k tokens costs k steps
    controller = KController(costs(linear, 80), prior_accepted=7, prior_rejected=3)
    assert controller.choose(100) == 0


def test_cap_fixed_k_and_the_remaining_budget_are_respected() -> None:
    controller = KController(costs(FLAT, 0.1), prior_accepted=9, prior_rejected=1)
    controller.cap = 2
    assert controller.choose(100) <= 2
    controller.cap = None
    assert controller.choose(3) <= 3
    controller.fixed_k = 5
    assert controller.choose(100) == 5
    controller.cap = 0
    assert controller.choose(100) == 0


def test_plain_streaks_probe_with_backoff() -> None:
    controller = KController(costs(FLAT, 0.1), probe_after=4, max_probe_after=128)
    for _ in range(30):
        controller.observe(drafted=4, accepted=0)
    chosen = [controller.choose(100) for _ in range(40)]
    probes = [i for i, k in enumerate(chosen) if k > 0]
    assert probes[:3] == [3, 11, 27]  # after 4, then 8, then 16 plain steps


# Measured on llama.cpp, 2-core AVX-512 EPYC: Qwen2.5-Coder-1.5B Q4_K_M over 1..9 tokens, and the
# 0.5B's step as its draft. Verification is compute-bound (9 tokens cost 8 steps).
LLAMA_1_5B = [39.4, 69.8, 87.9, 128.6, 136.2, 169.7, 200.5, 289.0, 378.3]


def test_where_even_perfect_drafts_lose_it_never_drafts_nor_probes() -> None:
    controller = KController(costs(LLAMA_1_5B, 28.0), probe_after=4, prior_accepted=99, prior_rejected=1)
    assert not controller.could_pay(8)
    assert [controller.choose(100) for _ in range(200)] == [0] * 200


def test_free_drafts_on_a_compute_bound_cpu_pay_only_when_nearly_always_right() -> None:
    free = costs(LLAMA_1_5B, 0.01)  # n-gram drafts cost microseconds
    assert KController(free).could_pay(8)
    assert KController(free, prior_accepted=1, prior_rejected=1).best_k(8) == 0
    assert KController(free, prior_accepted=199, prior_rejected=1).best_k(8) > 0


class SlowProposer:
    """A fake proposer whose drafts are good but take 5 fake seconds each."""

    name = "draft_model"

    def __init__(self, inner, clock: FakeClock) -> None:  # type: ignore[no-untyped-def]
        self.inner, self.clock = inner, clock

    def propose(self, context: list[int], k: int, params: SamplingParams, rng: Rng) -> Draft:
        self.clock.advance(5.0)
        return self.inner.propose(context, k, params, rng)

    def close(self) -> None:
        self.inner.close()


class RandomProposer:
    """A fake proposer of random tokens: costs nothing, never right."""

    name = "ngram"

    def __init__(self) -> None:
        self.gen = np.random.default_rng(0)

    def propose(self, context: list[int], k: int, params: SamplingParams, rng: Rng) -> Draft:
        return Draft(self.gen.integers(10, 60, k).tolist(), None)

    def close(self) -> None:
        pass


def _strategy(clock: FakeClock) -> Iterator[SpeculativeStrategy]:
    target = tiny_lm(0, scale=6.0)
    target.stop_ids = frozenset()
    strategy = SpeculativeStrategy(target, clock, draft=tiny_lm(0, scale=6.0), calibrate=False)
    for method in ("ngram", "draft_model"):
        strategy.costs[method].verify = [0.2] * 9
        strategy.costs[method].draft_step = 0.0001
    yield strategy


def test_engine_turns_speculation_off_when_the_draft_is_slow() -> None:
    clock = FakeClock()
    strategy = next(_strategy(clock))
    session = strategy.new_session()
    proposer = strategy.make_proposer("draft_model")
    session.proposers["draft_model"] = SlowProposer(proposer, clock)
    session.controllers["draft_model"] = strategy.make_controller("draft_model")
    _, stats, _ = generate(strategy, prompt_of(strategy.lm, "w1 w2 w3"), params("draft_model", max_tokens=80),
                           session=session)
    # the identical draft is always right, but 5 s a draft never pays: after the first measured
    # draft the controller stays plain except for its backed-off probes
    assert stats.k_chosen[0] > 0
    assert sum(1 for k in stats.k_chosen if k == 0) >= 0.85 * len(stats.k_chosen), stats.k_chosen


def test_engine_turns_speculation_off_when_drafts_are_useless() -> None:
    clock = FakeClock()
    strategy = next(_strategy(clock))
    session = strategy.new_session()
    session.proposers["ngram"] = RandomProposer()
    session.controllers["ngram"] = strategy.make_controller("ngram")
    _, stats, _ = generate(strategy, prompt_of(strategy.lm, "w1 w2 w3"), params("ngram", max_tokens=120),
                           session=session)
    assert stats.acceptance_rate < 0.2
    assert sum(1 for k in stats.k_chosen[20:] if k == 0) >= 0.85 * len(stats.k_chosen[20:]), stats.k_chosen


class CopyProposer:
    """A fake copying proposer whose drafts are always right, with a fixed match length."""

    name = "ngram"

    def __init__(self, inner, matched: int) -> None:  # type: ignore[no-untyped-def]
        self.inner, self.matched = inner, matched

    def propose(self, context: list[int], k: int, params: SamplingParams, rng: Rng) -> Draft:
        right = self.inner.propose(context, k, params, rng)
        return Draft(right.tokens, None, matched=self.matched)

    def close(self) -> None:
        self.inner.close()


def test_probes_verify_only_strong_copies() -> None:
    """Where only probes draft (verification as dear as k steps), a probe verifies a copied draft
    only when a long enough stretch matched: weak single-token matches mostly fail, and a failed
    probe costs a short reply a whole step. Strong matches are probed, and pay."""
    drafts = {}
    for matched in (1, 4):
        clock = FakeClock()
        strategy = next(_strategy(clock))
        for costs in strategy.costs.values():
            costs.verify = [0.2 + 0.12 * k for k in range(9)]  # each drafted token costs 0.6 of a step
            costs.smoothing = 0.0  # the fake clock measures 0 s: keep these costs as they are
        session = strategy.new_session()
        # the identical model as a copying proposer: drafts always right, at no cost
        session.proposers["ngram"] = CopyProposer(strategy.make_proposer("draft_model"), matched)
        session.controllers["ngram"] = strategy.make_controller("ngram")
        _, stats, _ = generate(strategy, prompt_of(strategy.lm, "w1 w2 w3"), params("ngram", max_tokens=60),
                               session=session)
        drafts[matched] = stats.drafts
    assert drafts[1] == 0
    assert drafts[4] > 0
