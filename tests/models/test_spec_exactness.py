"""Speculative decoding is exact: at temperature 0 it reproduces plain decoding token for token,
a draft identical to the target is always accepted, and rejected positions leave no trace in the
KV caches (tiny random models: same architecture and code as the real ones)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.clock import MonotonicClock
from models.speculative.decoder import SpeculativeStrategy
from models.speculative.draft_model import DraftModelProposer
from tests.models.spec_helpers import generate, params, prompt_of
from tests.models.tiny import tiny_lm

PROMPTS = ["w1 w2 w3 w4", "w5 w9 w5 w9 w5 w9", "w10 w11 w12 w10 w11 w12 w13 w14", "w20"]


@pytest.fixture(scope="module")
def strategy() -> SpeculativeStrategy:
    target = tiny_lm(0, scale=6.0, name="target")
    draft = tiny_lm(1, scale=6.0, layers=1, name="draft")
    return SpeculativeStrategy(target, MonotonicClock(), draft=draft, calibrate=False)


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
@pytest.mark.parametrize("k", [1, 3, 8, None])
def test_greedy_speculation_equals_plain_decoding(strategy: SpeculativeStrategy, method: str, k: int | None) -> None:
    for text in PROMPTS:
        prompt = prompt_of(strategy.lm, text)
        plain, _, _ = generate(strategy, prompt, params("off", max_tokens=40))
        fast, stats, _ = generate(strategy, prompt, params(method, k=k, max_tokens=40))
        assert fast == plain, (method, k, text)
        if k is not None and method == "draft_model":
            assert stats.drafts > 0


def test_repetitive_text_is_drafted_by_ngram(strategy: SpeculativeStrategy) -> None:
    prompt = prompt_of(strategy.lm, "w5 w9 w5 w9 w5 w9 w5 w9")
    _, stats, _ = generate(strategy, prompt, params("ngram", k=4, max_tokens=40))
    assert stats.drafts > 0 and stats.draft_tokens >= stats.drafts


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_draft_identical_to_target_is_always_accepted(temperature: float) -> None:
    target = tiny_lm(3, scale=3.0, name="target")
    twin = tiny_lm(3, scale=3.0, name="twin")
    # draft_copy_min=0: every draft comes from the twin model, none is copied from earlier text
    strategy = SpeculativeStrategy(target, MonotonicClock(), draft=twin, draft_copy_min=0, calibrate=False)
    total = 0
    for seed, text in enumerate(PROMPTS):
        _, stats, _ = generate(strategy, prompt_of(target, text),
                               params("draft_model", temperature=temperature, k=4, max_tokens=30, seed=seed))
        assert stats.draft_tokens > 0
        assert stats.acceptance_rate == 1.0, stats.as_dict()
        total += stats.accepted_tokens
    assert total > 0


def _assert_cache_equals_fresh_prefill(lm, state) -> None:  # type: ignore[no-untyped-def]
    fresh = lm.new_state()
    lm.extend(fresh, list(state.tokens))
    assert state.cache.get_seq_length() == len(state.tokens)
    for got, want in zip(state.cache.layers, fresh.cache.layers, strict=True):
        torch.testing.assert_close(got.keys, want.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.values, want.values, atol=1e-5, rtol=1e-5)


def test_kv_caches_after_rejections_equal_a_fresh_prefill() -> None:
    target = tiny_lm(0, scale=2.0, name="target")
    draft = tiny_lm(1, scale=2.0, name="draft")
    target.stop_ids = frozenset()  # generate the full length, whatever the random model says
    strategy = SpeculativeStrategy(target, MonotonicClock(), draft=draft, calibrate=False)
    session = strategy.new_session()
    prompt = prompt_of(target, "w1 w2 w3 w4 w5")
    produced, stats, state = generate(strategy, prompt, params("draft_model", temperature=1.0, k=4, max_tokens=40),
                                      session=session)
    assert stats.draft_tokens > stats.accepted_tokens > 0, "the test needs both accepted and rejected drafts"
    # the target holds the accepted sequence (the last produced token is pending, not yet fed)
    assert stats.finish_reason == "length" and state.tokens == prompt + produced[:-1]
    _assert_cache_equals_fresh_prefill(target, state)
    # the draft rolls back to the accepted sequence at its next proposal
    proposer = session.proposers["draft_model"]
    assert isinstance(proposer, DraftModelProposer)
    draft.prefill(proposer.state, prompt + produced)
    assert proposer.state.tokens == prompt + produced
    _assert_cache_equals_fresh_prefill(draft, proposer.state)


def test_truncate_rolls_back_exactly() -> None:
    lm = tiny_lm(5)
    state = lm.new_state()
    lm.extend(state, [5, 6, 7, 8])
    lm.extend(state, [9, 10, 11])
    lm.truncate(state, 5)
    assert state.tokens == [5, 6, 7, 8, 9]
    _assert_cache_equals_fresh_prefill(lm, state)
    logits_after = lm.extend(state, [12])
    fresh = lm.new_state()
    np.testing.assert_allclose(logits_after, lm.extend(fresh, [5, 6, 7, 8, 9, 12]), atol=1e-5, rtol=1e-5)
