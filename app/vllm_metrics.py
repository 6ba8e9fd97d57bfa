"""vLLM's speculative-decoding counters, read from its Prometheus endpoint, and the rates derived
from them (see shared/DESIGN.md):

    acceptance rate            = accepted tokens / drafted tokens
    mean acceptance length     = 1 + accepted tokens / drafts        (tokens emitted per target step)
    acceptance at position i   = accepted tokens at position i / drafts

Glossary: a *draft* is one proposal of up to K tokens; *drafted tokens* counts the tokens of all
drafts; *accepted tokens* those the target model kept. vLLM labels its counters (model_name,
engine, ...); every label set is summed.

`VllmMetricsPoller` scrapes the endpoint every few seconds and republishes the rates as gauges in
the voice service's own registry, so they show up beside its metrics at /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from dataclasses import dataclass, field

import httpx
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.parser import text_string_to_metric_families

from core.clock import Clock

log = logging.getLogger(__name__)

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


@dataclass(frozen=True)
class SpecDecodeCounters:
    """vLLM's speculative-decoding counters at one scrape (or the change between two scrapes),
    summed over every label set except `position`."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    accepted_per_position: dict[int, float] = field(default_factory=dict)

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens; None when nothing was drafted."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens > 0 else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted tokens / drafts; None when there were no drafts."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts > 0 else None

    @property
    def acceptance_by_position(self) -> list[float]:
        """Share of drafts whose token at each position (0, 1, ...) was accepted; empty without drafts."""
        if self.drafts <= 0 or not self.accepted_per_position:
            return []
        last = max(self.accepted_per_position)
        return [self.accepted_per_position.get(i, 0.0) / self.drafts for i in range(last + 1)]

    def since(self, earlier: SpecDecodeCounters) -> SpecDecodeCounters:
        """What happened between `earlier` and this scrape. A counter that went down means vLLM
        restarted; then this scrape's values are the change (as Prometheus' rate() treats resets)."""
        reset = (
            self.drafts < earlier.drafts
            or self.draft_tokens < earlier.draft_tokens
            or self.accepted_tokens < earlier.accepted_tokens
            or any(v < earlier.accepted_per_position.get(p, 0.0) for p, v in self.accepted_per_position.items())
        )
        if reset:
            return self
        return SpecDecodeCounters(
            drafts=self.drafts - earlier.drafts,
            draft_tokens=self.draft_tokens - earlier.draft_tokens,
            accepted_tokens=self.accepted_tokens - earlier.accepted_tokens,
            accepted_per_position={
                p: v - earlier.accepted_per_position.get(p, 0.0) for p, v in self.accepted_per_position.items()
            },
        )


def parse_spec_decode(text: str) -> SpecDecodeCounters | None:
    """The speculative-decoding counters in a Prometheus text exposition; None when it has none
    (a vLLM serving without speculative decoding). Raises ValueError on text that does not parse."""
    totals = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED_TOKENS: 0.0}
    per_position: dict[int, float] = {}
    found = False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
                found = True
            elif sample.name == ACCEPTED_PER_POS:
                position = int(sample.labels.get("position", "0"))
                per_position[position] = per_position.get(position, 0.0) + sample.value
                found = True
    if not found:
        return None
    return SpecDecodeCounters(totals[DRAFTS], totals[DRAFT_TOKENS], totals[ACCEPTED_TOKENS], per_position)


class VllmMetricsPoller:
    """Scrapes vLLM's /metrics every `interval_s` and publishes into `registry`:

    - voice_agent_vllm_up: 1 after a good scrape, 0 after a failed one;
    - voice_agent_vllm_spec_decode_acceptance_rate, ..._mean_acceptance_length and
      ..._acceptance_rate_by_position{position}: over the interval between the last two scrapes
      that saw new drafts (the first scrape: since vLLM started). An idle interval keeps the last
      values; they are NaN until vLLM has drafted (e.g. when it runs without speculative decoding).

    A bad scrape (refused, timeout, HTTP error, text that does not parse) is logged and sets up=0;
    it never stops the poller.
    """

    def __init__(self, url: str, registry: CollectorRegistry, clock: Clock, *, interval_s: float = 5.0,
                 timeout_s: float = 2.0) -> None:
        self.url = url
        self.clock = clock
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.last: SpecDecodeCounters | None = None
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self.scrapes = 0  # tried, worked or not
        self.up = Gauge("voice_agent_vllm_up", "1 if the last scrape of vLLM's /metrics worked", registry=registry)
        self.acceptance_rate = Gauge(
            "voice_agent_vllm_spec_decode_acceptance_rate",
            "vLLM draft acceptance rate (accepted / drafted tokens) over the last scrape interval", registry=registry)
        self.mean_acceptance_length = Gauge(
            "voice_agent_vllm_spec_decode_mean_acceptance_length",
            "vLLM tokens per target step (1 + accepted tokens / drafts) over the last scrape interval",
            registry=registry)
        self.by_position = Gauge(
            "voice_agent_vllm_spec_decode_acceptance_rate_by_position",
            "Share of vLLM drafts whose token at this position was accepted, over the last scrape interval",
            ["position"], registry=registry)
        for gauge in (self.acceptance_rate, self.mean_acceptance_length):
            gauge.set(math.nan)  # no data yet (a 0 would read as "nothing accepted")

    async def scrape_once(self, client: httpx.AsyncClient) -> bool:
        """One scrape; publishes what it finds. Returns whether it worked; never raises (cancellation
        aside)."""
        self.scrapes += 1
        try:
            response = await client.get(self.url)
            response.raise_for_status()
            counters = parse_spec_decode(response.text)
        except Exception as exc:  # refused, timeout, HTTP error, bad text: none may stop the poller
            self.up.set(0)
            if not self._failing:  # log the first failure of a run of them, not every one
                log.warning("cannot read vLLM metrics from %s: %s", self.url, exc or type(exc).__name__)
            self._failing = True
            return False
        if self._failing:
            log.info("vLLM metrics at %s readable again", self.url)
        self._failing = False
        self.up.set(1)
        if counters is not None:
            self._publish(counters if self.last is None else counters.since(self.last), counters)
        return True

    def _publish(self, window: SpecDecodeCounters, current: SpecDecodeCounters) -> None:
        if window.drafts <= 0:
            return  # nothing drafted since the last scrape: keep the last values
        self.last = current
        if (rate := window.acceptance_rate) is not None:
            self.acceptance_rate.set(rate)
        if (length := window.mean_acceptance_length) is not None:
            self.mean_acceptance_length.set(length)
        for position, share in enumerate(window.acceptance_by_position):
            self.by_position.labels(str(position)).set(share)

    async def run(self) -> None:
        """Scrape until cancelled."""
        timeout = httpx.Timeout(self.timeout_s)
        async with httpx.AsyncClient(timeout=timeout) as client:
            while True:
                await self.scrape_once(client)
                await self.clock.sleep(self.interval_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="vllm-metrics")
            log.info("reading vLLM metrics from %s every %.0f s", self.url, self.interval_s)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
