"""/metrics after one real end-to-end turn: every latency histogram holds exactly one observation."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import ask_once, start_server, stop_server

pytestmark = pytest.mark.slow


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_metrics_after_one_turn(tmp_path: Path) -> None:
    server, proc = start_server(tmp_path)
    try:
        client = await ask_once(server, "What is the capital of France?", tmp_path)
        done = client.events("response.done")[0]
        metrics = samples(httpx.get(server.base_url + "/metrics", timeout=10).text)
        await client.close()
    finally:
        stop_server(proc)
    assert done["status"] == "completed"
    for stage in ("asr_final", "llm_first_token", "first_phrase", "tts_first_audio", "first_audio_sent"):
        assert metrics[("voice_agent_stage_latency_seconds_count", (("stage", stage),))] == 1, stage
        assert metrics[("voice_agent_stage_latency_seconds_sum", (("stage", stage),))] == pytest.approx(
            max(0.0, done["latency_ms"][stage]) / 1000, abs=1e-3)  # a preemptive reply's early marks count as 0
    assert metrics[("voice_agent_voice_to_voice_seconds_count", ())] == 1
    assert metrics[("voice_agent_turns_total", (("status", "completed"),))] == 1
    assert metrics[("voice_agent_sessions_total", (("transport", "ws"),))] == 1
    assert metrics[("voice_agent_active_sessions", (("transport", "ws"),))] == 1
    assert metrics[("voice_agent_sessions_total", (("transport", "twilio"),))] == 0
    assert metrics[("voice_agent_llm_tokens_per_second_count", ())] == 1
