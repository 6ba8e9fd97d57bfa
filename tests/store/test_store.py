"""The store keeps what it is handed and gives it back: calls with their turns, the call summary kept
up to date turn by turn, filters and pages, exports, and retention."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from app.store import CallFilter, CallStore, CallTimeline, StorageConfig
from app.store.shapes import CSV_COLUMNS
from tests.store.helpers import T0, call, open_store, storage, turn


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[CallStore]:
    opened = await open_store(tmp_path)
    yield opened
    await opened.close()


async def test_a_call_and_its_turns_come_back_as_they_were_handed_over(store: CallStore) -> None:
    store.call_started(call("c1"))
    handed = [turn(0), turn(1, status="interrupted", v2v=None, first_audio=350.0), turn(2, spec=False)]
    for t in handed:
        store.turn_ended("c1", t)
    store.call_ended("c1", T0 + dt.timedelta(seconds=30), "hangup")
    await store.flush()
    found = await store.get_call("c1")
    assert found is not None
    record, turns = found
    assert turns == handed  # every field, in turn order, times timezone-aware UTC
    assert record.started_at == T0 and record.started_at.tzinfo is not None
    assert record.ended_at == T0 + dt.timedelta(seconds=30) and record.duration_s == 30.0
    assert (record.transport, record.fingerprint, record.caller, record.end_reason) == (
        "ws", "abc123", "127.0.0.1", "hangup")
    assert record.settings == {"llm": {"model": "qwen"}}
    # summary: turn 1 has no true voice-to-voice figure, so its speech_end -> first audio sent counts
    assert (record.turns_count, record.interruptions, record.errors) == (3, 1, 0)
    assert record.v2v_median_ms == 400.0 and record.v2v_max_ms == 400.0
    assert record.status == "interrupted"
    assert await store.get_call("nobody") is None


async def test_the_summary_follows_each_turn_and_the_end_of_the_call(store: CallStore) -> None:
    store.call_started(call("c1"))
    store.turn_ended("c1", turn(0, v2v=300.0))
    await store.flush()
    first = await store.get_call("c1")
    assert first is not None and first[0].status == "completed" and first[0].turns_count == 1
    assert first[0].ended_at is None  # still going
    store.turn_ended("c1", turn(1, v2v=700.0, status="failed", error="llm_unavailable: no answer"))
    store.turn_ended("c1", turn(2, v2v=500.0))
    await store.flush()
    second = await store.get_call("c1")
    assert second is not None
    assert (second[0].status, second[0].errors, second[0].v2v_median_ms, second[0].v2v_max_ms) == (
        "failed", 1, 500.0, 700.0)

    store.call_started(call("c2"))
    store.turn_ended("c2", turn(0))
    store.call_ended("c2", T0 + dt.timedelta(seconds=9), "error", error="asr_failed: decoder crashed")
    await store.flush()
    ended = await store.get_call("c2")
    assert ended is not None and (ended[0].status, ended[0].errors, ended[0].end_error) == (
        "failed", 1, "asr_failed: decoder crashed")


async def test_a_turn_without_its_call_start_is_kept_and_a_repeated_turn_written_once(store: CallStore) -> None:
    store.turn_ended("orphan", turn(3, offset_s=12.0))
    store.turn_ended("orphan", turn(3, offset_s=12.0))
    store.call_started(call("orphan", transport="twilio"))  # arriving late, it fills the placeholder in
    await store.flush()
    found = await store.get_call("orphan")
    assert found is not None
    assert found[0].transport == "twilio" and found[0].turns_count == 1 and len(found[1]) == 1


async def _calls(store: CallStore) -> None:
    """Six calls a minute apart: ws and twilio, completed or failed, with worst v2v 100..600 ms."""
    for i in range(6):
        call_id = f"c{i}"
        store.call_started(call(call_id, started=T0 + dt.timedelta(minutes=i), transport="ws" if i % 2 else "twilio"))
        store.turn_ended(call_id, turn(0, start=T0 + dt.timedelta(minutes=i), v2v=100.0 * (i + 1),
                                       status="failed" if i == 4 else "completed"))
    await store.flush()


async def test_filters_and_pages(store: CallStore) -> None:
    await _calls(store)

    async def ids(filters: CallFilter | None = None) -> list[str]:
        return [c.id for c in (await store.list_calls(filters)).calls]

    assert await ids() == ["c5", "c4", "c3", "c2", "c1", "c0"]  # newest first
    assert await ids(CallFilter(since=T0 + dt.timedelta(minutes=2), until=T0 + dt.timedelta(minutes=4))) == [
        "c3", "c2"]
    assert await ids(CallFilter(transport="ws")) == ["c5", "c3", "c1"]
    assert await ids(CallFilter(status="failed")) == ["c4"]
    assert await ids(CallFilter(min_v2v_ms=450.0)) == ["c5", "c4"]
    assert await ids(CallFilter(transport="twilio", min_v2v_ms=250.0)) == ["c4", "c2"]
    # times in another zone mean the same instants
    paris = dt.timezone(dt.timedelta(hours=1))
    assert await ids(CallFilter(since=(T0 + dt.timedelta(minutes=5)).astimezone(paris))) == ["c5"]

    first = await store.list_calls(limit=4)
    assert [c.id for c in first.calls] == ["c5", "c4", "c3", "c2"] and first.total == 6 and first.next_offset == 4
    last = await store.list_calls(limit=4, offset=4)
    assert [c.id for c in last.calls] == ["c1", "c0"] and last.total == 6 and last.next_offset is None
    filtered = await store.list_calls(CallFilter(transport="ws"), limit=2)
    assert filtered.total == 3 and filtered.next_offset == 2


async def _text(chunks: AsyncIterator[str]) -> str:
    return "".join([chunk async for chunk in chunks])


async def test_export_jsonl_has_a_call_per_line_with_its_turns(store: CallStore) -> None:
    await _calls(store)
    store.turn_ended("c5", turn(1))
    await store.flush()
    lines = (await _text(store.export("jsonl"))).splitlines()
    assert len(lines) == 6
    first = json.loads(lines[0])
    assert first["call"]["id"] == "c5" and first["call"]["turns"] == 2
    assert [t["turn_id"] for t in first["turns"]] == [0, 1]
    assert first["turns"][0]["latency_ms"]["first_audio_sent"] == 300.0
    assert first["turns"][0]["spec"]["accepted_per_position"] == [4, 2, 1, 1]
    only_ws = (await _text(store.export("jsonl", CallFilter(transport="ws")))).splitlines()
    assert [json.loads(line)["call"]["id"] for line in only_ws] == ["c5", "c3", "c1"]


async def test_export_csv_has_a_row_per_turn_with_the_calls_columns(store: CallStore) -> None:
    await _calls(store)
    store.turn_ended("c5", turn(1, status="interrupted"))
    store.call_started(call("silent", started=T0 - dt.timedelta(hours=1)))
    await store.flush()
    rows = list(csv.DictReader(io.StringIO(await _text(store.export("csv")))))
    assert list(rows[0]) == list(CSV_COLUMNS)
    assert len(rows) == 8  # 7 turns, and the call without turns on a row of its own
    c5 = [r for r in rows if r["call_id"] == "c5"]
    assert [r["turn_id"] for r in c5] == ["0", "1"] and c5[1]["turn_status"] == "interrupted"
    assert c5[0]["call_status"] == "interrupted" and c5[0]["transport"] == "ws"
    assert float(c5[0]["first_audio_sent_ms"]) == 300.0 and float(c5[0]["voice_to_voice_ms"]) == 600.0
    assert json.loads(c5[0]["spec_k_chosen"]) == [4, 4, 4, 4] and c5[0]["spec_method"] == "ngram"
    assert c5[0]["user_text"] == "question 0" and c5[0]["heard_text"] == "answer 0"
    assert json.loads(c5[0]["settings"]) == {"llm": {"model": "qwen"}}
    silent = [r for r in rows if r["call_id"] == "silent"]
    assert len(silent) == 1 and silent[0]["turn_id"] == ""


async def test_export_reads_in_pages_without_repeating_or_skipping(store: CallStore) -> None:
    for i in range(45):  # several calls share each start time, so the pages split ties
        store.call_started(call(f"p{i:02d}", started=T0 + dt.timedelta(seconds=i // 3)))
    await store.flush()
    from app.store import queries

    seen = [c.id async for c, _ in queries.calls_with_turns(store._open_sessions(), CallFilter(), page_size=7)]
    assert len(seen) == 45 and len(set(seen)) == 45


async def test_purge_deletes_old_calls_their_turns_and_recordings(tmp_path: Path) -> None:
    now = T0 + dt.timedelta(days=10)
    # the store's own retention task sees a wall clock at T0, where nothing is old yet
    store = CallStore(storage(tmp_path, retention_days=7, recordings=True), wall=lambda: T0)
    await store.open()
    try:
        for call_id, age_days in (("old", 8.0), ("recent", 6.0)):
            store.call_started(call(call_id, started=now - dt.timedelta(days=age_days)))
            store.turn_ended(call_id, turn(0, start=now - dt.timedelta(days=age_days)))
            recorder = store.recorder(call_id, started_at=100.0)
            assert recorder is not None
            recorder.caller(_tone(), 16000, at=101.0)
            store.call_ended(call_id, now - dt.timedelta(days=age_days) + dt.timedelta(minutes=1), "hangup",
                             recorder=recorder)
        stray = tmp_path / "recordings" / "stray.wav.part"  # a crashed writer's leftover
        stray.write_bytes(b"x")
        os.utime(stray, (0, 0))
        await store.flush()
        old, recent = await store.get_call("old"), await store.get_call("recent")
        assert old is not None and recent is not None
        old_file, recent_file = store.recording_file(old[0]), store.recording_file(recent[0])
        assert old_file is not None and old_file.is_file() and recent_file is not None
        os.utime(recent_file, ((now - dt.timedelta(days=6)).timestamp(),) * 2)

        assert await store.purge(now) == 1
        assert await store.get_call("old") is None and not old_file.exists() and not stray.exists()
        assert await store.get_call("recent") is not None and recent_file.is_file()
        assert (await store.list_calls()).total == 1
        assert await store.purge(now) == 0
    finally:
        await store.close()


async def test_retention_zero_keeps_everything(store: CallStore) -> None:
    store.call_started(call("ancient", started=T0 - dt.timedelta(days=3650)))
    await store.flush()
    assert await store.purge(T0) == 0 and await store.get_call("ancient") is not None


def test_storage_urls_get_their_async_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert StorageConfig(url="sqlite:////var/lib/calls.db").database_url() == "sqlite+aiosqlite:////var/lib/calls.db"
    assert StorageConfig(url="postgresql://u:p@db:5432/voice").database_url() == (
        "postgresql+asyncpg://u:p@db:5432/voice")
    assert StorageConfig(url="postgresql+psycopg://u@db/v").database_url() == "postgresql+asyncpg://u@db/v"
    assert StorageConfig(url="postgres://u@db/v").database_url() == "postgresql+asyncpg://u@db/v"
    assert StorageConfig(data_dir=str(tmp_path)).database_url() == f"sqlite+aiosqlite:///{tmp_path}/calls.db"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert StorageConfig().data_path() == tmp_path / "xdg" / "voice-agent"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert StorageConfig().data_path() == Path.home() / ".local" / "share" / "voice-agent"
    with pytest.raises(ValueError, match=r"storage\.url must be"):
        StorageConfig(url="mysql://u:secret@db/v")


def test_storage_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.settings import Settings

    monkeypatch.setenv("VOICE_AGENT_STORAGE__URL", "postgresql://voice@db/voice")
    monkeypatch.setenv("VOICE_AGENT_STORAGE__RECORDINGS", "true")
    monkeypatch.setenv("VOICE_AGENT_STORAGE__RETENTION_DAYS", "0")
    monkeypatch.setenv("VOICE_AGENT_OTEL__ENDPOINT", "http://tempo:4318/v1/traces")
    settings = Settings()
    assert settings.storage.database_url() == "postgresql+asyncpg://voice@db/voice"
    assert settings.storage.recordings and settings.storage.retention_days == 0
    assert settings.otel.endpoint == "http://tempo:4318/v1/traces"


def test_a_call_timeline_turns_clock_times_into_wall_times_and_offsets() -> None:
    timeline = CallTimeline(started_at=T0, started_mono=1000.0)
    assert timeline.wall(1012.5) == T0 + dt.timedelta(seconds=12.5) and timeline.offset_s(1012.5) == 12.5


def _tone() -> np.ndarray:
    return (0.3 * np.sin(np.arange(1600) / 16000 * 2 * np.pi * 440)).astype(np.float32)
