"""Choosing K, the number of tokens to draft, from what was measured.

With an acceptance rate alpha (each drafted token kept independently), a step that drafts K tokens
yields E(K) = (1 - alpha^(K+1)) / (1 - alpha) tokens and costs K * c + v(K): c the draft's cost per
token, v(K) the target's cost to verify K tokens (one forward pass over K + 1). Plain decoding
yields 1 token for v(0). The controller picks the K with the best E(K) / (K c + v(K)), and K = 0
(plain decoding) unless some K beats plain by a margin. Alpha is a decayed count of accepted and
rejected drafted tokens; the choice uses a cautious alpha, as if `caution` more drafts had been
rejected, so that two lucky drafts do not buy a K = 7 that a compute-bound CPU pays 5 steps for.
Costs are decayed averages of measured seconds, seeded by a calibration.
While K = 0, it probes now and then (backing off exponentially) so it notices when drafts start
paying again, but only where drafting could pay at all: when even drafts that are always accepted
would be slower than plain decoding (a compute-bound CPU, where verifying K tokens costs about K
steps, with a draft model that costs a third of a step), it never drafts and never probes.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CostModel:
    """Measured seconds, as exponential moving averages: verify[k] for a target pass over k + 1
    tokens, and draft_step for one drafted token. Shared by the sessions of one engine."""

    max_k: int
    verify: list[float | None] = field(default_factory=list)
    draft_step: float | None = None
    smoothing: float = 0.2

    def __post_init__(self) -> None:
        if not self.verify:
            self.verify = [None] * (self.max_k + 1)

    def observe_verify(self, k: int, seconds: float) -> None:
        old = self.verify[k]
        self.verify[k] = seconds if old is None else old + self.smoothing * (seconds - old)

    def observe_draft(self, tokens: int, seconds: float) -> None:
        if tokens <= 0:
            return
        per_token = seconds / tokens
        old = self.draft_step
        self.draft_step = per_token if old is None else old + self.smoothing * (per_token - old)

    def verify_cost(self, k: int) -> float:
        """v(k), never less than verifying fewer tokens: timings of nearly equal passes are noisy,
        and a noisy v(1) < v(0) must not make drafting look free."""
        return max(self._measured(j) for j in range(k + 1))

    def _measured(self, k: int) -> float:
        """The measured v(k); unmeasured sizes are interpolated from the nearest measured ones."""
        if self.verify[k] is not None:
            return self.verify[k]  # type: ignore[return-value]
        known = [(i, v) for i, v in enumerate(self.verify) if v is not None]
        if not known:
            return 1.0
        below = [(i, v) for i, v in known if i < k]
        above = [(i, v) for i, v in known if i > k]
        if below and above:
            (i0, v0), (i1, v1) = below[-1], above[0]
            return v0 + (v1 - v0) * (k - i0) / (i1 - i0)
        i, v = below[-1] if below else above[0]
        return v * (k + 1) / (i + 1) if i < k else v


def expected_tokens(alpha: float, k: int) -> float:
    """E(K): tokens a step yields when each of K drafted tokens is kept with probability alpha."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class KController:
    def __init__(
        self,
        costs: CostModel,
        *,
        max_k: int = 8,
        fixed_k: int | None = None,
        prior_accepted: float = 3.0,
        prior_rejected: float = 2.0,
        decay: float = 0.9,
        margin: float = 0.05,
        caution: float = 2.0,
        probe_after: int = 16,
        max_probe_after: int = 256,
    ) -> None:
        self.costs = costs
        self.max_k = max_k
        self.fixed_k = fixed_k
        self.cap: int | None = None  # set by the pipeline (e.g. from the TTS token-rate budget)
        self.accepted = prior_accepted
        self.rejected = prior_rejected
        self.decay = decay
        self.margin = margin
        self.caution = caution
        self.base_probe_after = probe_after
        self.probe_after = probe_after
        self.max_probe_after = max_probe_after
        self.plain_streak = 0
        self.probing = False  # the K last chosen is a probe, not a choice the measurements back

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejected) if self.accepted + self.rejected > 0 else 0.0

    @property
    def cautious_alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejected + self.caution)

    def rate(self, k: int) -> float:
        """Expected tokens per second when drafting k (k = 0: plain decoding), at the cautious alpha."""
        draft = self.costs.draft_step or 0.0
        return expected_tokens(self.cautious_alpha, k) / (k * draft + self.costs.verify_cost(k))

    def could_pay(self, upper: int) -> bool:
        """Whether some K <= upper beats plain decoding by the margin when every draft is accepted."""
        draft = self.costs.draft_step or 0.0
        plain = 1.0 / self.costs.verify_cost(0)
        return any((k + 1) / (k * draft + self.costs.verify_cost(k)) > plain * (1.0 + self.margin)
                   for k in range(1, upper + 1))

    def best_k(self, upper: int) -> int:
        plain = self.rate(0)
        best_k, best = 0, plain * (1.0 + self.margin)
        for k in range(1, upper + 1):
            rate = self.rate(k)
            if rate > best:
                best_k, best = k, rate
        return best_k

    def choose(self, limit: int) -> int:
        """K for the next step; `limit` is how many more tokens may be drafted."""
        self.probing = False
        upper = min(self.max_k, limit, self.cap if self.cap is not None else self.max_k)
        if upper <= 0:
            return 0
        if self.fixed_k is not None:
            return min(self.fixed_k, upper)
        k = self.best_k(upper)
        if k > 0:
            self.plain_streak = 0
            self.probe_after = self.base_probe_after
            return k
        self.plain_streak += 1
        if self.plain_streak >= self.probe_after and self.could_pay(upper):
            self.plain_streak = 0
            self.probe_after = min(2 * self.probe_after, self.max_probe_after)
            self.probing = True
            return min(2, upper)
        return 0

    def defer_probe(self) -> None:
        """The probe found no draft worth verifying: probe again at the next step instead."""
        self.probing = False
        self.probe_after = max(self.base_probe_after, self.probe_after // 2)
        self.plain_streak = self.probe_after - 1

    def observe(self, drafted: int, accepted: int) -> None:
        """A verified draft: `accepted` of `drafted` kept (a rejection ends the run)."""
        if drafted <= 0:
            return
        self.accepted = self.accepted * self.decay + accepted
        self.rejected = self.rejected * self.decay + (1 if accepted < drafted else 0)
