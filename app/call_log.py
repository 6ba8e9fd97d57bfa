"""One call's QA record: the call, each finished turn and the call's audio, handed to the call store
(app/store) and the trace exporter as they happen. Nothing here waits: the store queues records for
its writer, and the recorder only keeps the arrays it is given. With the store off (storage.enabled
false, or it failed to open) and no trace endpoint, every method does nothing."""

from __future__ import annotations

import logging
from typing import Any

from app.runtime import Runtime
from app.store import CallRecord, CallRecorder, CallTimeline, TurnRecord, call_settings, fingerprint, spec_from_stats
from app.store.records import utc_now
from models.protocols import Audio
from pipeline.events import ResponseDone

log = logging.getLogger(__name__)


class CallLog:
    def __init__(self, runtime: Runtime, call_id: str, transport: str, caller: str | None = None,
                 placed: dict[str, Any] | None = None) -> None:
        """`placed`: a call the service placed (POST /api/calls/outbound): who placed it, why, to whom;
        kept in the record's settings under "placed" (outside the fingerprint, which is the setup's)."""
        self.store = runtime.store
        self.tracer = runtime.tracer
        kept = call_settings(runtime.settings)
        self.timeline = CallTimeline(started_at=utc_now(), started_mono=runtime.clock.now())
        self.call = CallRecord(call_id, transport, self.timeline.started_at, fingerprint=fingerprint(kept),
                               settings={**kept, **({"placed": placed} if placed else {})}, caller=caller)
        self.recorder: CallRecorder | None = None
        self.ended_already = False
        if self.store is not None:
            self.store.call_started(self.call)
            self.recorder = self.store.recorder(call_id, started_at=self.timeline.started_mono)

    def caller_audio(self, samples: Audio, rate: int, at: float) -> None:
        """A frame of the caller's audio as it arrived (for the recording's left channel)."""
        if self.recorder is not None:
            self.recorder.caller(samples, rate, at)

    def turn(self, done: ResponseDone) -> None:
        """A finished turn, written at once: a crash loses at most the turn in progress."""
        if self.store is None and self.tracer is None:
            return
        at = done.speech_end_at if done.speech_end_at is not None else self.timeline.started_mono
        record = TurnRecord(
            turn_id=done.turn_id, at=self.timeline.wall(at), offset_s=self.timeline.offset_s(at), status=done.status,
            user_text=done.user_text, generated_text=done.generated_text, sent_text=done.sent_text,
            heard_text=done.text, latency_ms=dict(done.latency_ms), voice_to_voice_ms=done.voice_to_voice_ms,
            spec=spec_from_stats(done.stats, done.llm_steps), error=done.error, barge_in=done.status == "interrupted",
            dtmf=done.dtmf, deadline_missed=done.deadline_missed, underruns=done.underruns,
            tool_calls=[dict(call) for call in done.tool_calls],
        )
        if self.store is not None:
            self.store.turn_ended(self.call.id, record)
        if self.tracer is not None:
            try:
                self.tracer.turn_ended(self.call, record)
            except Exception:  # a trace is worth less than the call
                log.exception("%s: turn %d could not be traced", self.call.id, done.turn_id)

    def ended(self, reason: str, error: str | None = None) -> None:
        """The call is over (once): why, and the error it failed with, if it did."""
        if self.ended_already:
            return
        self.ended_already = True
        if self.store is not None:
            self.store.call_ended(self.call.id, utc_now(), reason, error=error, recorder=self.recorder)


def turn_json(done: ResponseDone) -> dict[str, Any]:
    """A finished turn as every transport reports it: the native `response.done`, the phone line's
    log record. What was kept (heard), its latency marks, and how the reply went."""
    return {
        "turn_id": done.turn_id, "text": done.text, "status": done.status,
        "latency_ms": done.latency_ms, "voice_to_voice_ms": done.voice_to_voice_ms,
        **({"endpointing_ms": done.endpointing_ms} if done.endpointing_ms else {}),
        **({"taken_back": True} if done.taken_back else {}),
        "deadline_missed": done.deadline_missed, "underruns": done.underruns, "underrun_ms": done.underrun_ms,
        "preemptive": done.preemptive, "discarded": done.discarded, "discarded_words": done.discarded_words,
        "llm": done.stats.as_dict() if done.stats else {},
        **({"tool_calls": list(done.tool_calls)} if done.tool_calls else {}),
        **({"filler": True} if done.filler else {}),
        **({"llm_steps": list(done.llm_steps)} if len(done.llm_steps) > 1 else {}),
        **({"honesty": chance} if (chance := next((s["honesty"] for s in done.llm_steps if "honesty" in s), None))
           is not None else {}),
    }
