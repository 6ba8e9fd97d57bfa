"""Recordings in S3-compatible object storage (storage.recordings_url), against a real SeaweedFS
(tests/s3_server.py): a call recorded on one replica is uploaded, its local file gone, and its
recording served (whole, and a player's byte range) through the API of another replica that shares
the database; the purge deletes the object; a bucket that cannot be reached says what to fix."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import wave
from collections.abc import Iterator
from pathlib import Path

import boto3
import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from app.store import CallStore
from core.errors import ConfigError
from pipeline.session import Backends
from tests.pipeline.fakes import FakeLLM, FakeRecognizer, FakeSynthesizer, FakeVad
from tests.s3_server import s3_server
from tests.store.helpers import call, storage, turn

BUCKET = "voice-recordings"


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with s3_server(tmp_path_factory.mktemp("seaweedfs")) as url:
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="test",
                              aws_secret_access_key="test")
        client.create_bucket(Bucket=BUCKET)
        yield url


@pytest.fixture
def s3(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> object:
    """The bucket's client; the store finds the credentials where boto3 looks (the environment)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def replica(tmp: Path, name: str, endpoint: str, database: Path) -> dict[str, object]:
    """One replica's storage settings: its own data folder, the shared database and bucket."""
    return {"data_dir": str(tmp / name), "url": f"sqlite:///{database}", "recordings": True,
            "recordings_url": f"s3://{BUCKET}/calls", "s3_endpoint_url": endpoint}


async def record_a_call(settings: dict[str, object], started: dt.datetime) -> CallStore:
    store = CallStore(storage(Path(str(settings["data_dir"])), **settings))
    await store.open()
    store.call_started(call("recorded", started=started))
    recorder = store.recorder("recorded", started_at=10.0)
    assert recorder is not None
    store.turn_ended("recorded", turn(0, start=started))
    recorder.caller(np.full(1600, 0.5, dtype=np.float32), 16000, at=11.1)
    recorder.bot(np.full(1600, -0.5, dtype=np.float32), 16000, at=12.0)
    store.call_ended("recorded", started + dt.timedelta(seconds=20), "hangup", recorder=recorder)
    await store.flush()
    return store


def test_a_recording_made_on_one_replica_is_served_by_another(s3: object, endpoint: str, tmp_path: Path) -> None:
    database = tmp_path / "calls.db"
    first, second = replica(tmp_path, "first", endpoint, database), replica(tmp_path, "second", endpoint, database)
    started = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)

    async def on_the_first() -> str | None:
        store = await record_a_call(first, started)
        found = await store.get_call("recorded")
        await store.close()
        return found[0].recording if found else None

    kept = asyncio.run(on_the_first())
    assert kept == f"s3://{BUCKET}/calls/recorded.wav"
    assert not list((tmp_path / "first" / "recordings").iterdir())  # uploaded, not kept on the disk
    backends = Backends(FakeVad(), FakeRecognizer([]), FakeSynthesizer(), FakeLLM([]))
    app = create_app(Settings(storage=storage(tmp_path / "second", **second)), backends=backends)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        whole = client.get("/api/calls/recorded/recording")
        assert whole.status_code == 200 and whole.headers["content-type"] == "audio/wav"
        with wave.open(io.BytesIO(whole.content)) as wav:
            assert wav.getnchannels() == 2 and wav.getframerate() == 16000 and wav.getnframes() > 0
        part = client.get("/api/calls/recorded/recording", headers={"Range": "bytes=44-143"})  # a player seeking
        assert part.status_code == 206 and part.content == whole.content[44:144]
        assert part.headers["content-range"] == f"bytes 44-143/{len(whole.content)}"


def test_the_purge_deletes_the_recordings_object(s3: object, endpoint: str, tmp_path: Path) -> None:
    settings = {**replica(tmp_path, "only", endpoint, tmp_path / "calls.db"), "retention_days": 1}
    started = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)

    async def record_then_purge() -> tuple[int, int, int]:
        store = await record_a_call(settings, started)
        listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="calls/recorded")  # type: ignore[attr-defined]
        purged = await store.purge(now=started + dt.timedelta(days=2))
        left = s3.list_objects_v2(Bucket=BUCKET, Prefix="calls/recorded")  # type: ignore[attr-defined]
        await store.close()
        return listed.get("KeyCount", 0), purged, left.get("KeyCount", 0)

    assert asyncio.run(record_then_purge()) == (1, 1, 0)


def test_a_bucket_that_cannot_be_reached_says_what_to_fix(s3: object, endpoint: str, tmp_path: Path) -> None:
    settings = {**replica(tmp_path, "lost", endpoint, tmp_path / "calls.db"), "recordings_url": "s3://no-such-bucket"}

    async def open_it() -> None:
        await CallStore(storage(tmp_path / "lost", **settings)).open()

    with pytest.raises(ConfigError, match=r"storage\.recordings_url: cannot reach s3://no-such-bucket"):
        asyncio.run(open_it())
