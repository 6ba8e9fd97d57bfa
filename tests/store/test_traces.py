"""A turn as an OpenTelemetry trace: the turn's span from the caller's true end of speech to the first
audio sent, a child span per stage on the turn's marks, through the SDK's batch processor."""

from __future__ import annotations

import datetime as dt
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from app.store import OtelConfig, TurnRecord
from app.store.traces import TurnTracer, make_tracer
from tests.store.helpers import call, turn


def _export(*turns: TurnRecord) -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    tracer = TurnTracer(OtelConfig(endpoint="http://collector.invalid:4318/v1/traces", service_name="qa-test"),
                        exporter=exporter)
    for t in turns:
        tracer.turn_ended(call("c1"), t)
    tracer.shutdown()  # flushes the batch
    return list(exporter.get_finished_spans())


def _ms(span: ReadableSpan, origin: int) -> tuple[float, float]:
    assert span.start_time is not None and span.end_time is not None
    return round((span.start_time - origin) / 1e6, 3), round((span.end_time - origin) / 1e6, 3)


def test_a_turn_is_a_span_with_a_child_per_stage_on_its_marks() -> None:
    record = turn(2, v2v=450.0)  # marks: asr 80, first token 150, phrase 200, tts 260, sent 300 ms
    spans = _export(record)
    root = next(s for s in spans if s.name == "turn")
    children = {s.name: s for s in spans if s.parent is not None}
    assert all(s.parent is not None and s.parent.span_id == root.context.span_id for s in children.values())
    assert all(s.context.trace_id == root.context.trace_id for s in spans)
    speech_end = int(record.at.timestamp() * 1e9)
    assert _ms(root, speech_end) == (-150.0, 300.0)  # from the true end: 450 ms before first audio
    assert {name: _ms(span, speech_end) for name, span in children.items()} == {
        "endpointing": (-150.0, 0.0), "asr": (0.0, 80.0), "llm_first_token": (80.0, 150.0),
        "first_phrase": (150.0, 200.0), "tts": (200.0, 260.0), "first_audio": (260.0, 300.0)}
    assert root.attributes is not None
    assert root.attributes["voice_agent.call_id"] == "c1" and root.attributes["voice_agent.turn_id"] == 2
    assert root.attributes["voice_agent.spec.acceptance_rate"] == 0.5
    assert root.resource.attributes["service.name"] == "qa-test"


def test_a_failed_turn_has_an_error_status_and_missing_marks_no_span() -> None:
    record = turn(0, v2v=None, status="failed", error="llm_unavailable: connection refused")
    record.latency_ms = {"speech_end": 0.0, "asr_final": 90.0}
    record.at = dt.datetime(2025, 3, 1, 12, tzinfo=dt.UTC)
    spans = _export(record)
    assert sorted(s.name for s in spans) == ["asr", "turn"]
    root = next(s for s in spans if s.name == "turn")
    assert root.status.status_code == StatusCode.ERROR
    assert root.status.description == "llm_unavailable: connection refused"


def test_tracing_is_off_without_an_endpoint_and_posts_otlp_to_one() -> None:
    assert make_tracer(OtelConfig()) is None
    received: list[tuple[str, str, bytes]] = []
    returned = threading.Event()  # turn_ended has returned
    early: list[bool] = []  # a post that came before it had

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            early.append(not returned.is_set())
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, self.headers["Content-Type"], body))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        tracer = make_tracer(OtelConfig(endpoint=f"http://127.0.0.1:{server.server_port}/v1/traces"))
        assert tracer is not None
        tracer.turn_ended(call("otlp-call"), turn(0))
        returned.set()
        # queued for the SDK's thread, not sent here: no post came before it returned (`early`)
        tracer.shutdown()
    finally:
        server.shutdown()
    assert len(received) == 1 and early == [False]
    path, content_type, body = received[0]
    assert path == "/v1/traces" and content_type == "application/x-protobuf"
    assert b"otlp-call" in body and b"first_audio" in body
