"""Optional OpenTelemetry export of each turn as a trace: a span for the turn, from the caller's end
of speech to the first reply audio sent, with a child span per stage, so that Jaeger, Tempo or
Langfuse draw the same waterfall as the QA dashboard. Off unless otel.endpoint is set; it needs the
`otel` extra (opentelemetry-sdk and its OTLP/HTTP exporter).

Spans are made from a finished turn's record (its wall time and marks), never timed live, and handed
to a BatchSpanProcessor: ending a span is a queue append, and the export runs in the SDK's thread.

Hook point: `tracer.turn_ended(call, turn)` with the CallRecord and each TurnRecord the store gets
(runtime.tracer is None when tracing is off).
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING, Any

from app.store.config import OtelConfig
from app.store.records import CallRecord, TurnRecord, as_utc
from core.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger(__name__)
# (span name, the mark it ends at); each stage starts where the one before it ended
STAGES = (("asr", "asr_final"), ("llm_first_token", "llm_first_token"), ("first_phrase", "first_phrase"),
          ("tts", "tts_first_audio"), ("first_audio", "first_audio_sent"))


class TurnTracer:
    def __init__(self, config: OtelConfig, exporter: SpanExporter | None = None) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            raise ConfigError("otel.endpoint is set but OpenTelemetry is not installed: "
                              "pip install 'voice-agent[otel]'") from exc
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=config.endpoint)
        self._provider = TracerProvider(resource=Resource.create({"service.name": config.service_name}))
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("voice-agent.turns")

    def turn_ended(self, call: CallRecord, turn: TurnRecord) -> None:
        """One trace for the turn: a root span and a span per stage, from the turn's marks."""
        from opentelemetry.trace import Status, StatusCode, set_span_in_context

        speech_end = _ns(turn.at)
        marks = {name: speech_end + int(ms * 1e6) for name, ms in turn.latency_ms.items()}
        start = speech_end
        if turn.voice_to_voice_ms is not None and "first_audio_sent" in marks:
            start = marks["first_audio_sent"] - int(turn.voice_to_voice_ms * 1e6)  # the caller's true end of speech
        start = min(start, *marks.values())  # a preemptive reply's work can precede speech_end
        end = max(speech_end, *marks.values())
        root = self._tracer.start_span("turn", start_time=start, attributes=_attributes(call, turn))
        if turn.status == "failed":
            root.set_status(Status(StatusCode.ERROR, turn.error or "the turn failed"))
        context = set_span_in_context(root)
        if start < speech_end:
            self._tracer.start_span("endpointing", context=context, start_time=start).end(end_time=speech_end)
        previous = speech_end
        for name, mark in STAGES:
            if mark in marks:
                span = self._tracer.start_span(name, context=context, start_time=min(previous, marks[mark]))
                span.end(end_time=marks[mark])
                previous = marks[mark]
        root.end(end_time=end)

    def shutdown(self) -> None:
        """Export what is queued (the SDK waits up to its export timeout) and stop."""
        self._provider.shutdown()


def make_tracer(config: OtelConfig) -> TurnTracer | None:
    if not config.endpoint:
        return None
    tracer = TurnTracer(config)
    log.info("traces: each turn exported over OTLP/HTTP to %s", config.endpoint)
    return tracer


def _ns(when: dt.datetime) -> int:
    return int(as_utc(when).timestamp() * 1e9)


def _attributes(call: CallRecord, turn: TurnRecord) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "voice_agent.call_id": call.id,
        "voice_agent.transport": call.transport,
        "voice_agent.fingerprint": call.fingerprint,
        "voice_agent.turn_id": turn.turn_id,
        "voice_agent.status": turn.status,
        "voice_agent.barge_in": turn.barge_in,
        "voice_agent.deadline_missed": turn.deadline_missed,
        "voice_agent.underruns": turn.underruns,
    }
    if turn.voice_to_voice_ms is not None:
        attributes["voice_agent.voice_to_voice_ms"] = turn.voice_to_voice_ms
    for name, ms in turn.latency_ms.items():
        attributes[f"voice_agent.latency_ms.{name}"] = ms
    if turn.spec:
        for key in ("method", "drafts", "draft_tokens", "accepted_tokens", "acceptance_rate", "tokens_per_second",
                    "completion_tokens"):
            if turn.spec.get(key) is not None:
                attributes[f"voice_agent.spec.{key}"] = turn.spec[key]
    if turn.error:
        attributes["voice_agent.error"] = turn.error
    return attributes
