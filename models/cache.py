"""Where fetched models live (a user cache folder, never the repository) and how a model reference
(a pack name, a local path, or a Hugging Face id) becomes something an engine can load."""

from __future__ import annotations

import os
from pathlib import Path

from models.packs import PACKS, Pack
from pipeline.errors import ModelMissingError

MANIFEST = "pack.json"


def cache_root() -> Path:
    """VOICE_AGENT_CACHE, else $XDG_CACHE_HOME/voice-agent, else ~/.cache/voice-agent."""
    explicit = os.environ.get("VOICE_AGENT_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "voice-agent"


def pack_dir(pack: Pack, root: Path | None = None) -> Path:
    return (root or cache_root()) / "packs" / pack.name


def is_ready(pack: Pack, root: Path | None = None) -> bool:
    """A pack is ready once its manifest is written, which happens last, after verification."""
    return (pack_dir(pack, root) / MANIFEST).is_file()


def loadable_dir(pack: Pack, root: Path | None = None) -> Path:
    """The folder an engine loads: the converted model for GGUF packs, else the pack folder."""
    base = pack_dir(pack, root)
    return base / "hf" if pack.convert == "gguf" else base


def resolve(ref: str, root: Path | None = None) -> str:
    """Turn a model reference into a loadable path or hub id.

    - a pack name (see `voice-agent models list`): its folder in the cache, which must be fetched;
    - an existing local path: used as is;
    - anything else is taken as a Hugging Face model id, for users who can reach the hub.
    """
    pack = PACKS.get(ref.removeprefix("pack:"))
    if pack is not None:
        if not is_ready(pack, root):
            raise ModelMissingError(
                f"model pack {pack.name!r} is not in the cache ({pack_dir(pack, root)}); "
                f"fetch it with: voice-agent models fetch {pack.name}"
            )
        return str(loadable_dir(pack, root))
    if ref.startswith("pack:"):
        raise ModelMissingError(f"unknown model pack {ref!r}; known packs: {', '.join(PACKS)}")
    path = Path(ref).expanduser()
    if path.exists():
        return str(path)
    if ref.startswith((".", "/", "~")):
        raise ModelMissingError(f"model path {ref!r} does not exist")
    return ref
