"""The service's own Prometheus metrics (served at /metrics).

Latency histograms follow the turn marks; speculative-decoding counters are named after vLLM's
(`vllm:spec_decode_*`) with the `voice_agent_` prefix, so one dashboard reads both.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from models.protocols import GenerationStats
from pipeline.events import ResponseDone
from pipeline.turns import MARKS

LATENCY_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)
STAGES = tuple(m for m in MARKS if m != "speech_end")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.stage_latency = Histogram(
            "voice_agent_stage_latency_seconds", "Time from speech_end to each turn mark", ["stage"],
            buckets=LATENCY_BUCKETS, registry=r)
        self.voice_to_voice = Histogram(
            "voice_agent_voice_to_voice_seconds",
            "From the end of the caller's speech (in their audio) to the first reply audio sent",
            buckets=LATENCY_BUCKETS, registry=r)
        self.active_sessions = Gauge("voice_agent_active_sessions", "Calls in progress", registry=r)
        self.sessions = Counter("voice_agent_sessions_total", "Calls started", registry=r)
        self.turns = Counter("voice_agent_turns_total", "Replies by how they ended", ["status"], registry=r)
        self.interruptions = Counter("voice_agent_interruptions_total", "Replies cut short by barge-in", registry=r)
        self.errors = Counter("voice_agent_errors_total", "Errors by code", ["code"], registry=r)
        self.tokens_per_second = Histogram(
            "voice_agent_llm_tokens_per_second", "LLM decoding speed per reply",
            buckets=(1, 2, 4, 6, 8, 10, 15, 20, 30, 50, 100, 200), registry=r)
        self.completion_tokens = Counter("voice_agent_llm_completion_tokens_total", "Tokens generated", registry=r)
        self.api_requests = Counter(
            "voice_agent_api_requests_total", "Chat completion API requests by outcome", ["outcome"], registry=r)
        self.spec_drafts = Counter(
            "voice_agent_spec_decode_num_drafts_total", "Speculative drafts proposed", registry=r)
        self.spec_draft_tokens = Counter(
            "voice_agent_spec_decode_num_draft_tokens_total", "Tokens proposed by drafts", registry=r)
        self.spec_accepted_tokens = Counter(
            "voice_agent_spec_decode_num_accepted_tokens_total", "Drafted tokens the target accepted", registry=r)
        self.spec_accepted_per_pos = Counter(
            "voice_agent_spec_decode_num_accepted_tokens_per_pos_total",
            "Accepted drafted tokens by position in the draft", ["position"], registry=r)

    def observe_turn(self, done: ResponseDone) -> None:
        self.turns.labels(done.status).inc()
        if done.status == "interrupted":
            self.interruptions.inc()
        for stage in STAGES:
            if stage in done.latency_ms:
                self.stage_latency.labels(stage).observe(done.latency_ms[stage] / 1000)
        if done.voice_to_voice_ms is not None:
            self.voice_to_voice.observe(done.voice_to_voice_ms / 1000)

    def observe_generation(self, stats: GenerationStats) -> None:
        if stats.completion_tokens:
            self.completion_tokens.inc(stats.completion_tokens)
            if stats.duration_ms > 0:
                self.tokens_per_second.observe(stats.tokens_per_second)
        if stats.drafts:
            self.spec_drafts.inc(stats.drafts)
            self.spec_draft_tokens.inc(stats.draft_tokens)
            self.spec_accepted_tokens.inc(stats.accepted_tokens)
            for position, count in enumerate(stats.accepted_per_position):
                if count:
                    self.spec_accepted_per_pos.labels(str(position)).inc(count)

    def error(self, code: str) -> None:
        self.errors.labels(code).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
