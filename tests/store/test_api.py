"""The QA API against the app on a temporary SQLite file: the fixed JSON shapes, filters and pages,
one call with its turns, its recording, the exports (not taken for a call id) and the overview."""

from __future__ import annotations

import asyncio
import csv
import datetime as dt
import io
import json
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from app.store import CallStore
from pipeline.session import Backends
from tests.pipeline.fakes import FakeLLM, FakeRecognizer, FakeSynthesizer, FakeVad
from tests.store.helpers import T0, call, storage, turn

CALL_KEYS = {"id", "transport", "started_at", "ended_at", "duration_s", "end_reason", "status", "fingerprint",
             "settings", "caller", "turns", "interruptions", "errors", "v2v_median_ms", "v2v_max_ms", "has_recording"}
TURN_KEYS = {"turn_id", "at", "offset_s", "user_text", "generated_text", "sent_text", "heard_text", "status",
             "latency_ms", "voice_to_voice_ms", "spec", "error", "barge_in", "dtmf", "deadline_missed", "underruns",
             "tool_calls"}
SPEC_KEYS = {"method", "drafts", "draft_tokens", "accepted_tokens", "accepted_per_position", "k_chosen",
             "tokens_per_second", "acceptance_rate", "completion_tokens", "time_to_first_token_ms",
             "prompt_tokens", "prefill_tokens", "steps"}  # the prompt's cost, per LLM step too (docs/qa.md)


async def _fill(tmp: Path) -> None:
    """Five calls a minute apart (c0..c4; c1 and c3 by phone), three turns each; c2 recorded."""
    store = CallStore(storage(tmp, recordings=True))
    await store.open()
    for i in range(5):
        start = T0 + dt.timedelta(minutes=i)
        call_id = f"c{i}"
        store.call_started(call(call_id, started=start, transport="twilio" if i % 2 else "ws"))
        recorder = store.recorder(call_id, started_at=10.0) if i == 2 else None
        for n in range(3):
            store.turn_ended(call_id, turn(n, start=start, v2v=200.0 + 100 * i + 10 * n,
                                           status="interrupted" if (i, n) == (3, 1) else "completed"))
        if recorder is not None:
            recorder.caller(np.full(1600, 0.5, dtype=np.float32), 16000, at=11.1)  # arrived by 1.1 s
            recorder.bot(np.full(1600, -0.5, dtype=np.float32), 16000, at=12.0)
        store.call_ended(call_id, start + dt.timedelta(seconds=20), "hangup", recorder=recorder)
    await store.close()


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    asyncio.run(_fill(tmp_path))
    settings = Settings(storage=storage(tmp_path, recordings=True))
    backends = Backends(FakeVad(), FakeRecognizer([]), FakeSynthesizer(), FakeLLM([]))
    with TestClient(create_app(settings, backends=backends), base_url="http://127.0.0.1") as test_client:
        yield test_client


def test_calls_list_in_the_fixed_shape_newest_first(client: TestClient) -> None:
    body = client.get("/api/calls").json()
    assert body["total"] == 5 and body["next_offset"] is None
    assert [c["id"] for c in body["calls"]] == ["c4", "c3", "c2", "c1", "c0"]
    c3 = body["calls"][1]
    assert set(c3) == CALL_KEYS
    assert c3["started_at"] == "2025-03-01T12:03:00.000Z" and c3["ended_at"] == "2025-03-01T12:03:20.000Z"
    assert c3["duration_s"] == 20.0 and c3["status"] == "interrupted" and c3["interruptions"] == 1
    assert (c3["turns"], c3["errors"], c3["v2v_median_ms"], c3["v2v_max_ms"]) == (3, 0, 510.0, 520.0)
    assert c3["transport"] == "twilio" and c3["settings"] == {"llm": {"model": "qwen"}}
    assert [c["has_recording"] for c in body["calls"]] == [False, False, True, False, False]


def test_calls_filters_and_pages(client: TestClient) -> None:
    def ids(query: str) -> list[str]:
        response = client.get(f"/api/calls?{query}")
        assert response.status_code == 200, response.text
        return [c["id"] for c in response.json()["calls"]]

    assert ids("transport=twilio") == ["c3", "c1"]
    assert ids("status=interrupted") == ["c3"]
    assert ids("min_v2v_ms=500") == ["c4", "c3"]
    assert ids("since=2025-03-01T12:02:00Z&until=2025-03-01T12:04:00Z") == ["c3", "c2"]
    epoch = (T0 + dt.timedelta(minutes=3)).timestamp()
    assert ids(f"since={epoch}") == ["c4", "c3"]
    assert ids("since=2025-03-01T13:03:00+01:00") == ["c4", "c3"]  # another zone, the same instant
    assert ids("since=2025-03-01T13:03:00 01:00") == ["c4", "c3"]  # its "+" unescaped in the query string
    page = client.get("/api/calls?limit=2&offset=2").json()
    assert [c["id"] for c in page["calls"]] == ["c2", "c1"] and page["next_offset"] == 4 and page["total"] == 5
    assert client.get("/api/calls?limit=2&offset=4").json()["next_offset"] is None
    assert client.get("/api/calls?limit=501").status_code == 422
    bad = client.get("/api/calls?since=yesterday")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_time"


def test_times_out_of_range_or_unreadable_are_bad_time_not_a_server_error(tmp_path: Path) -> None:
    asyncio.run(_fill(tmp_path))
    settings = Settings(storage=storage(tmp_path, recordings=True))
    backends = Backends(FakeVad(), FakeRecognizer([]), FakeSynthesizer(), FakeLLM([]))
    app = create_app(settings, backends=backends)
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
        for value in ("1e20", "-1e20", "100000000000000000000", "-100000000000000000000", "9999999999999999",
                      "nan", "inf", "2025-13-01", "9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00"):
            for path, params in (("calls", {"since": value}), ("calls", {"until": value}),
                                 ("overview", {"since": value}), ("calls/export", {"format": "csv", "until": value})):
                response = client.get(f"/api/{path}", params=params)
                assert response.status_code == 400, (path, params, response.status_code, response.text)
                assert response.json()["error"]["code"] == "bad_time", (path, params)
                assert repr(value) in response.json()["error"]["message"], (path, params)
        # the overview's default window is the 24 hours before `until`, which year 1 does not have
        response = client.get("/api/overview?until=0001-01-01T00:00:00Z")
        assert response.status_code == 400 and response.json()["error"]["code"] == "bad_time"
        # the ends of the range are times, and a number above 2e10 is epoch milliseconds
        assert client.get("/api/calls?since=0001-01-01T00:00:00Z&until=9999-12-31T23:59:59Z").json()["total"] == 5
        since_ms = int((T0 + dt.timedelta(minutes=3)).timestamp() * 1000)
        assert [c["id"] for c in client.get(f"/api/calls?since={since_ms}").json()["calls"]] == ["c4", "c3"]


def test_one_call_with_its_turns(client: TestClient) -> None:
    body = client.get("/api/calls/c3").json()
    assert set(body) == {"call", "turns"} and body["call"]["id"] == "c3"
    turns = body["turns"]
    assert [t["turn_id"] for t in turns] == [0, 1, 2]
    assert all(set(t) == TURN_KEYS for t in turns) and set(turns[0]["spec"]) == SPEC_KEYS
    second = turns[1]
    assert second["status"] == "interrupted" and second["barge_in"] is True and second["dtmf"] == "12#"
    assert second["at"] == "2025-03-01T12:03:07.000Z" and second["offset_s"] == 7.0
    assert second["latency_ms"]["asr_final"] == 80.0 and second["voice_to_voice_ms"] == 510.0
    assert (second["user_text"], second["sent_text"], second["heard_text"]) == (
        "question 1", "answer 1, all", "answer 1")
    missing = client.get("/api/calls/nobody")
    assert missing.status_code == 404
    assert missing.json() == {"error": {"code": "call_not_found", "message": "no call with id 'nobody'"}}


def test_a_calls_recording(client: TestClient) -> None:
    response = client.get("/api/calls/c2/recording")
    assert response.status_code == 200 and response.headers["content-type"] == "audio/wav"
    with wave.open(io.BytesIO(response.content)) as wav:
        assert (wav.getnchannels(), wav.getframerate()) == (2, 16000)
        frames = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").reshape(-1, 2)
    assert frames[16000 + 800, 0] > 10000 and frames[16000 + 800, 1] == 0  # the caller at 1.0 s, left
    assert frames[32000 + 800, 1] < -10000 and frames[32000 + 800, 0] == 0  # the bot at 2.0 s, right
    assert response.headers["content-disposition"].startswith("inline")
    part = client.get("/api/calls/c2/recording", headers={"Range": "bytes=44-143"})  # a player seeking
    assert part.status_code == 206 and part.content == response.content[44:144]
    assert client.get("/api/calls/c1/recording").json()["error"]["code"] == "recording_not_found"
    assert client.get("/api/calls/nobody/recording").status_code == 404


def test_exports_are_streamed_files_and_not_taken_for_a_call_id(client: TestClient) -> None:
    jsonl = client.get("/api/calls/export?format=jsonl&transport=ws")
    assert jsonl.status_code == 200 and jsonl.headers["content-type"].startswith("application/x-ndjson")
    assert 'filename="calls-' in jsonl.headers["content-disposition"]
    lines = [json.loads(line) for line in jsonl.text.splitlines()]
    assert [line["call"]["id"] for line in lines] == ["c4", "c2", "c0"]
    assert lines[0] == client.get("/api/calls/c4").json()
    exported = client.get("/api/calls/export?format=csv")
    assert exported.headers["content-type"].startswith("text/csv")
    assert exported.headers["content-disposition"].endswith('.csv"')
    rows = list(csv.DictReader(io.StringIO(exported.text)))
    assert len(rows) == 15 and {r["call_id"] for r in rows} == {f"c{i}" for i in range(5)}
    assert client.get("/api/calls/export").headers["content-type"].startswith("application/x-ndjson")
    assert client.get("/api/calls/export?format=xml").status_code == 422


def test_overview_buckets(client: TestClient) -> None:
    body = client.get("/api/overview?since=2025-03-01T12:00:00Z&until=2025-03-01T12:06:00Z&bucket_s=120").json()
    buckets = body["buckets"]
    assert [b["start"] for b in buckets] == ["2025-03-01T12:00:00.000Z", "2025-03-01T12:02:00.000Z",
                                             "2025-03-01T12:04:00.000Z"]
    assert [b["turns"] for b in buckets] == [6, 6, 3]
    first = buckets[0]  # c0 and c1: v2v 200, 210, 220, 300, 310, 320
    assert first["v2v_p50"] == 260.0 and first["v2v_p99"] == pytest.approx(319.5, abs=0.1)
    assert first["stages_p50"]["first_audio_sent"] == 300.0 and first["acceptance_rate"] == 0.5
    assert client.get("/api/overview?since=2025-03-01T12:00:00Z&until=2025-03-01T11:00:00Z").status_code == 400
    assert client.get("/api/overview?since=2020-01-01T00:00:00Z&bucket_s=1").json()["error"]["code"] == (
        "too_many_buckets")
    default = client.get("/api/overview").json()  # the last 24 hours: nothing there
    assert default["bucket_s"] == 1800.0 and sum(b["turns"] for b in default["buckets"]) == 0


def test_with_the_store_off_the_api_says_so(tmp_path: Path) -> None:
    settings = Settings(storage=storage(tmp_path, enabled=False))
    backends = Backends(FakeVad(), FakeRecognizer([]), FakeSynthesizer(), FakeLLM([]))
    with TestClient(create_app(settings, backends=backends), base_url="http://127.0.0.1") as off:
        response = off.get("/api/calls")
        assert response.status_code == 503
        assert "storage.enabled is false" in response.json()["error"]["message"]
    assert not (tmp_path / "calls.db").exists()
