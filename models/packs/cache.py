"""Where fetched models live (a user cache folder, never the repository) and how a model reference
(a pack name, a local path, or a Hugging Face id) becomes something an engine can load."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from core.errors import ModelMissingError
from models.packs.catalog import PACKS, Pack, pack_named

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
    """A pack is ready once its manifest is written, which happens last, after verification, and
    its files are there (a pack fetched by an older version kept only a converted copy)."""
    folder = pack_dir(pack, root)
    return (folder / MANIFEST).is_file() and all((folder / f.name).is_file() for f in pack.files)


def converted_dir(pack: Pack, root: Path | None = None) -> Path:
    """Where a GGUF pack's one-time conversion for the PyTorch runtime is kept."""
    return pack_dir(pack, root) / "hf"


def resolve_gguf(ref: str, root: Path | None = None) -> str:
    """A GGUF file for the llama.cpp runtime: a pack's model.gguf, a .gguf file, or the single .gguf
    in a folder. Hugging Face ids need the torch runtime."""
    path = Path(resolve(ref, root))
    if path.is_dir():
        found = sorted(path.glob("*.gguf"))
        if len(found) != 1:
            raise ModelMissingError(f"{ref!r}: expected one .gguf file in {path}, found {len(found)}; "
                                    "name the file, or use llm.runtime = \"torch\" for a Hugging Face folder")
        return str(found[0])
    if path.is_file():
        return str(path)
    raise ModelMissingError(f"{ref!r} is neither a model pack nor a local GGUF file; the llama.cpp runtime loads "
                            "GGUF files (use llm.runtime = \"torch\" for Hugging Face ids)")


def resolve_torch(ref: str, root: Path | None = None, say: Callable[[str], None] = print) -> str:
    """A folder or hub id for the PyTorch runtime; a GGUF pack is converted once to safetensors
    (kept beside the pack) the first time it is asked for."""
    pack = pack_named(ref)
    path = resolve(ref, root)
    if pack is None or pack.convert != "gguf":
        return path
    out = converted_dir(pack, root)
    if not (out / "config.json").is_file():
        from models.packs.convert import convert_pack

        convert_pack(pack_dir(pack, root) / "model.gguf", out, say=say)
    return str(out)


def resolve(ref: str, root: Path | None = None) -> str:
    """Turn a model reference into a loadable path or hub id.

    - a pack name (see `voice-agent models list`): its folder in the cache, which must be fetched;
    - an existing local path: used as is;
    - anything else is taken as a Hugging Face model id, for users who can reach the hub.
    """
    pack = pack_named(ref)
    if pack is not None:
        if not is_ready(pack, root):
            raise ModelMissingError(
                f"model pack {pack.name!r} is not in the cache ({pack_dir(pack, root)}); "
                f"fetch it with: voice-agent models fetch {pack.name}"
            )
        return str(pack_dir(pack, root))
    if ref.startswith("pack:"):
        raise ModelMissingError(f"unknown model pack {ref!r}; known packs: {', '.join(PACKS)}")
    path = Path(ref).expanduser()
    if path.exists():
        return str(path)
    if ref.startswith((".", "/", "~")):
        raise ModelMissingError(f"model path {ref!r} does not exist")
    return ref
