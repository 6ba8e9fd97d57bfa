"""Settings of the call store (`storage`) and of the optional trace export (`otel`). They live here,
beside the code they configure, and app/settings.py puts them in the service's settings.

    VOICE_AGENT_STORAGE__URL=postgresql://voice:secret@db/voice VOICE_AGENT_STORAGE__RECORDINGS=true
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field, field_validator

from app.store.recording_writer import MAX_QUEUED
from core.errors import ConfigError

ASYNC_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+asyncpg", "postgres": "postgresql+asyncpg"}


class StorageConfig(BaseModel):
    """Where finished turns and calls are kept (docs/qa.md)."""

    enabled: bool = Field(True, description="false keeps nothing: no database, no recordings, /api/calls answers 503")
    url: str = Field(
        "", description="sqlite:///path or postgresql://user:password@host/db; the async driver is chosen here. "
        "Empty: sqlite:///<data_dir>/calls.db")
    data_dir: str = Field(
        "", description="the SQLite file and the recordings; empty: $XDG_DATA_HOME/voice-agent or "
        "~/.local/share/voice-agent")
    retention_days: float = Field(30.0, ge=0, description="calls (and their recordings) older than this are deleted; "
                                  "0 keeps them forever")
    recordings: bool = Field(False, description="keep a stereo WAV of each call: the caller left, the bot right")
    max_recording_s: float = Field(3600.0, gt=0, description="a recording stops after this much of the call")
    recordings_url: str = Field(
        "", description="s3://bucket/prefix: recordings go to S3-compatible object storage once their call ends, "
        "and every replica serves them (credentials from AWS_ACCESS_KEY_ID... or boto3's other sources); empty: "
        "data_dir/recordings on this replica's disk")
    s3_endpoint_url: str = Field("", description="the S3 endpoint (http://seaweedfs:8333, MinIO...); empty: AWS's")
    s3_region: str = Field("us-east-1", description="the S3 region")
    max_pending: int = Field(
        10000, ge=1, description="records waiting to be written; beyond it new ones are dropped (logged, counted in "
        "voice_agent_store_dropped_total) rather than ever making a call wait")
    max_recording_pending: int = Field(
        MAX_QUEUED, ge=1, le=4096,
        description="pieces of recordings waiting for the disk, all calls together (a piece is a "
        "few seconds of one call's audio, about 1 MiB, or a call's end); beyond it the oldest is dropped (a gap in "
        "its recording, or no recording for an end; logged, counted in voice_agent_store_dropped_total) rather than "
        "ever making a call wait or memory grow. A call has at most 4 waiting: raise it with "
        "server.max_sessions beyond 16")
    purge_interval_s: float = Field(3600.0, gt=0, description="how often calls past retention_days are deleted")
    write_retry_s: float = Field(
        60.0, ge=0, le=600,
        description="a write that fails for a passing reason (the database restarting or out of reach, "
        "a locked SQLite file) is tried again, ever less often, for this long before its record is dropped (logged, "
        "counted as write_failed); the records behind it wait in the queue meanwhile")

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if value:
            scheme = value.split("://", 1)[0].split("+", 1)[0]
            if "://" not in value or scheme not in ASYNC_DRIVERS:
                raise ValueError(f"storage.url must be sqlite:///path or postgresql://..., got {redact_url(value)!r}")
        return value

    def data_path(self) -> Path:
        if self.data_dir:
            return Path(self.data_dir).expanduser()
        xdg = os.environ.get("XDG_DATA_HOME")
        base = Path(xdg) if xdg else Path.home() / ".local" / "share"
        return base / "voice-agent"

    def recordings_path(self) -> Path:
        return self.data_path() / "recordings"

    def database_url(self) -> str:
        """The URL with its async driver: sqlite+aiosqlite or postgresql+asyncpg. A driver the URL already
        names is replaced, since the store only speaks asyncio."""
        url = self.url or f"sqlite:///{self.data_path() / 'calls.db'}"
        scheme, rest = url.split("://", 1)
        base = scheme.split("+", 1)[0]
        if base not in ASYNC_DRIVERS:
            raise ConfigError(f"storage.url: unknown database {base!r} (sqlite or postgresql)")
        return f"{ASYNC_DRIVERS[base]}://{rest}"


class OtelConfig(BaseModel):
    """OpenTelemetry trace export (OTLP over HTTP): one span per turn, a child span per stage."""

    endpoint: str = Field("", description="the OTLP/HTTP traces URL, e.g. http://tempo:4318/v1/traces; empty: off")
    service_name: str = Field("voice-agent", description="service.name of the exported spans")


def redact_url(url: str) -> str:
    """The URL without its password, for messages."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not at:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{host}"
