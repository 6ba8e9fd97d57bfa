"""Recordings in S3-compatible object storage (storage.recordings_url = s3://bucket/prefix; AWS S3,
SeaweedFS, MinIO, Ceph...), so that every replica serves every call's recording (docs/qa.md).

boto3 does the S3 work in a thread (it is blocking); credentials come from boto3's own chain
(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, an instance role). A call's record keeps
the object's `s3://bucket/key`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from core.errors import ConfigError

log = logging.getLogger(__name__)
SCHEME = "s3://"
CHUNK_BYTES = 64 * 1024


def is_object(recording: str | None) -> bool:
    return bool(recording) and str(recording).startswith(SCHEME)


def split_url(url: str, setting: str = "storage.recordings_url") -> tuple[str, str]:
    """(bucket, key or prefix) of an s3:// URL."""
    if not url.startswith(SCHEME) or not url[len(SCHEME):].split("/", 1)[0]:
        raise ConfigError(f"{setting} must be s3://bucket or s3://bucket/prefix, not {url!r}")
    bucket, _, rest = url[len(SCHEME):].partition("/")
    return bucket, rest.strip("/")


@dataclass
class Fetched:
    """An object (or the byte range of it asked for), to stream to a client."""

    status: int  # 200, or 206 for a range
    headers: dict[str, str]
    body: Any  # botocore's streaming body

    def chunks(self) -> Iterator[bytes]:
        try:
            yield from self.body.iter_chunks(CHUNK_BYTES)
        finally:
            self.body.close()


class RecordingBucket:
    """The bucket and prefix recordings go to."""

    def __init__(self, url: str, endpoint_url: str = "", region: str = "us-east-1") -> None:
        self.bucket, self.prefix = split_url(url)
        self.endpoint_url = endpoint_url
        self.client = boto3.client(
            "s3", endpoint_url=endpoint_url or None, region_name=region,
            config=Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 3, "mode": "standard"}))

    def where(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}" + (f" at {self.endpoint_url}" if self.endpoint_url else "")

    async def check(self) -> None:
        """The bucket can be reached; a ConfigError says what to fix."""
        try:
            await asyncio.to_thread(self.client.head_bucket, Bucket=self.bucket)
        except (BotoCoreError, ClientError) as exc:
            raise ConfigError(f"storage.recordings_url: cannot reach {self.where()}: {exc}; check the bucket, "
                              "storage.s3_endpoint_url and the credentials (AWS_ACCESS_KEY_ID...)") from exc

    async def put(self, path: Path) -> str:
        """Upload a finished recording; its s3:// URL."""
        key = f"{self.prefix}/{path.name}" if self.prefix else path.name
        await asyncio.to_thread(self.client.upload_file, str(path), self.bucket, key,
                                ExtraArgs={"ContentType": "audio/wav"})
        return f"{SCHEME}{self.bucket}/{key}"

    async def get(self, url: str, byte_range: str | None) -> Fetched | None:
        """The object (or `byte_range`, an HTTP Range header's value), or None when it is not there."""
        bucket, key = split_url(url, "a recording")
        asked: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if byte_range:
            asked["Range"] = byte_range
        try:
            answer = await asyncio.to_thread(self.client.get_object, **asked)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return None
            raise
        headers = {"Content-Length": str(answer["ContentLength"]), "Accept-Ranges": "bytes"}
        if answer.get("ContentRange"):
            headers["Content-Range"] = answer["ContentRange"]
        status = 206 if answer.get("ContentRange") and byte_range else 200
        return Fetched(status, headers, answer["Body"])

    async def delete(self, urls: list[str]) -> int:
        """Delete these recordings (a thousand a request, S3's most); how many were asked to go."""
        keys = [split_url(u, "a recording")[1] for u in urls if split_url(u, "a recording")[0] == self.bucket]
        for start in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[start:start + 1000]]
            await asyncio.to_thread(self.client.delete_objects, Bucket=self.bucket,
                                    Delete={"Objects": batch, "Quiet": True})
        return len(keys)
