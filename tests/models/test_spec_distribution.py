"""Speculative sampling keeps the target's distribution: the same chi-square test that passes for
the real rejection sampler fails for a deliberately broken one that accepts every draft."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from scipy.stats import chisquare

from core.clock import MonotonicClock
from models.llm.sampling import Probs, Rng, probabilities, sample
from models.protocols import SamplingParams
from models.speculative import decoder as decoder_module
from models.speculative.decoder import SpeculativeStrategy
from models.speculative.verifier import Verdict, verify_sampled
from tests.models.spec_helpers import generate, params
from tests.models.tiny import tiny_lm

P_VALUE = 1e-3  # reject "same distribution" below this; fixed seeds make the outcome repeatable


def accept_everything(p: Probs, drafted: list[int], q: Probs | None, rng: Rng) -> Verdict:
    """A broken sampler: keeps every draft, so the output follows the draft, not the target."""
    return Verdict(len(drafted), sample(p[len(drafted)], rng))


def chi2_pvalue(counts: Counter[int] | Counter[tuple[int, int]], expected: dict, n: int) -> float:
    """Chi-square goodness of fit, pooling cells expected under 5 times into one."""
    observed, wanted, pool_obs, pool_exp = [], [], 0.0, 0.0
    for cell, prob in expected.items():
        if prob * n >= 5:
            observed.append(counts.get(cell, 0))
            wanted.append(prob * n)
        else:
            pool_obs += counts.get(cell, 0)
            pool_exp += prob * n
    extra = n - sum(counts.get(cell, 0) for cell in expected)  # outcomes the target gives probability 0
    observed.append(pool_obs + extra)
    wanted.append(pool_exp + 1e-9)
    total = sum(wanted)
    wanted = [w * n / total for w in wanted]
    return float(chisquare(observed, wanted).pvalue)


def softmax(x: np.ndarray) -> Probs:
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def run_verifier(verify, n: int = 20000) -> tuple[Counter[int], Counter[int], int, Probs]:  # type: ignore[no-untyped-def]
    gen = np.random.default_rng(0)
    vocab, k = 8, 3
    p = softmax(gen.standard_normal((k + 1, vocab)) * 1.5)  # [K + 1, V]
    q = softmax(gen.standard_normal((k, vocab)) * 1.5)  # [K, V]
    first: Counter[int] = Counter()
    second: Counter[int] = Counter()
    for _ in range(n):
        drafted = [sample(q[i], gen) for i in range(k)]
        verdict = verify(p, drafted, q, gen)
        out = [*drafted[: verdict.accepted], verdict.token]
        first[out[0]] += 1
        if len(out) > 1:
            second[out[1]] += 1
    return first, second, sum(second.values()), p


def test_rejection_sampler_reproduces_the_target_distribution() -> None:
    first, second, n_second, p = run_verifier(verify_sampled)
    assert chi2_pvalue(first, dict(enumerate(p[0].tolist())), 20000) > P_VALUE
    assert chi2_pvalue(second, dict(enumerate(p[1].tolist())), n_second) > P_VALUE


def test_the_same_check_catches_a_broken_sampler() -> None:
    first, _, _, p = run_verifier(accept_everything)
    assert chi2_pvalue(first, dict(enumerate(p[0].tolist())), 20000) < P_VALUE


def test_point_mass_drafts_are_handled_exactly() -> None:
    """n-gram drafts have no q: the rule becomes accept with p(x), else sample p without x."""
    gen = np.random.default_rng(1)
    p = softmax(gen.standard_normal((2, 6)) * 2)
    counts: Counter[int] = Counter()
    n = 20000
    for _ in range(n):
        verdict = verify_sampled(p, [2], None, gen)
        counts[2 if verdict.accepted else verdict.token] += 1
    assert chi2_pvalue(counts, dict(enumerate(p[0].tolist())), n) > P_VALUE


def joint_second_third(strategy: SpeculativeStrategy, prompt: list[int], sampling: SamplingParams) -> dict:
    """The target's exact distribution of its 2nd and 3rd tokens after `prompt` (summed over the
    1st, which plain prefill produces; the 2nd and 3rd come from a speculative step)."""
    lm = strategy.lm

    def dist(tokens: list[int]) -> Probs:
        state = lm.new_state()
        return probabilities(lm.extend(state, tokens)[-1], sampling)

    joint: dict[tuple[int, int], float] = {}
    p1 = dist(prompt)
    for a in np.flatnonzero(p1).tolist():
        p2 = dist([*prompt, a])
        for b in np.flatnonzero(p2).tolist():
            p3 = dist([*prompt, a, b])
            for c in np.flatnonzero(p3).tolist():
                joint[(b, c)] = joint.get((b, c), 0.0) + float(p1[a] * p2[b] * p3[c])
    return joint


@pytest.mark.parametrize(("method", "temperature", "top_p", "top_k"), [
    ("draft_model", 1.0, 1.0, 0),
    ("draft_model", 0.8, 0.9, 6),
    ("ngram", 1.0, 1.0, 0),
])
def test_engine_samples_the_target_joint_distribution(
    monkeypatch: pytest.MonkeyPatch, method: str, temperature: float, top_p: float, top_k: int
) -> None:
    target = tiny_lm(0, vocab_size=16, scale=2.0, name="target")
    target.stop_ids = frozenset()
    draft = tiny_lm(1, vocab_size=16, scale=2.0, name="draft")
    strategy = SpeculativeStrategy(target, MonotonicClock(), draft=draft, calibrate=False)
    # a prompt that repeats itself, so the n-gram proposer drafts the tokens that followed before
    prompt = [7, 8, 9, 10, 7, 8, 9, 10, 7, 8]
    base = params(method, temperature, k=2, max_tokens=3, top_p=top_p, top_k=top_k)
    expected = joint_second_third(strategy, prompt, base)
    n = 3000

    def sample_pairs() -> Counter[tuple[int, int]]:
        pairs: Counter[tuple[int, int]] = Counter()
        drafted = 0
        for seed in range(n):
            out, stats, _ = generate(strategy, prompt, SamplingParams(
                base.temperature, base.top_p, base.top_k, 3, seed, base.speculation))
            pairs[(out[1], out[2])] += 1
            drafted += stats.draft_tokens
        assert drafted > 0, "the proposer never drafted: the test would not test speculation"
        return pairs

    assert chi2_pvalue(sample_pairs(), expected, n) > P_VALUE
    monkeypatch.setattr(decoder_module, "verify_sampled", accept_everything)
    assert chi2_pvalue(sample_pairs(), expected, n) < P_VALUE
