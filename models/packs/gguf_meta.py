"""Reading a GGUF file's header: the few metadata values the memory guard needs, without loading
the model (the file's key-value section; its arrays, the tokenizer's, are skipped over)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

from core.errors import ModelMissingError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise EOFError
    return struct.unpack(fmt, data)[0]


def _string(f: BinaryIO) -> str:
    return f.read(_read(f, "<Q")).decode("utf-8", "replace")


def _value(f: BinaryIO, kind: int, keep: bool) -> Any:
    if kind in _SCALARS:
        return _read(f, _SCALARS[kind])
    if kind == STRING:
        if keep:
            return _string(f)
        f.seek(_read(f, "<Q"), 1)
        return None
    if kind == ARRAY:
        item, count = _read(f, "<I"), _read(f, "<Q")
        if item in _SCALARS:
            f.seek(struct.calcsize(_SCALARS[item]) * count, 1)
        else:
            for _ in range(count):
                _value(f, item, False)
        return None
    raise ValueError(f"unknown GGUF value type {kind}")


def read_metadata(path: str | Path) -> dict[str, Any]:
    """Scalar and string metadata of a GGUF file (arrays are skipped)."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ModelMissingError(f"{path} is not a GGUF file")
            _read(f, "<I")  # version
            _read(f, "<Q")  # tensor count
            count = _read(f, "<Q")
            meta: dict[str, Any] = {}
            for _ in range(count):
                key = _string(f)
                kind = _read(f, "<I")
                value = _value(f, kind, keep=True)
                if value is not None:
                    meta[key] = value
            return meta
    except (OSError, EOFError, ValueError, struct.error) as exc:
        raise ModelMissingError(f"cannot read the GGUF header of {path}: {exc}") from exc


def kv_bytes_per_token(path: str | Path, cache_bytes: int = 2) -> int:
    """Keys and values of one token over all layers, at `cache_bytes` per element (f16: 2)."""
    meta = read_metadata(path)
    arch = meta.get("general.architecture", "")

    def get(name: str) -> int:
        value = meta.get(f"{arch}.{name}")
        if value is None:
            raise ModelMissingError(f"{path}: GGUF metadata has no {arch}.{name}")
        return int(value)

    layers, heads = get("block_count"), get("attention.head_count")
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv") or heads)
    key_len = int(meta.get(f"{arch}.attention.key_length") or get("embedding_length") // heads)
    value_len = int(meta.get(f"{arch}.attention.value_length") or key_len)
    return layers * kv_heads * (key_len + value_len) * cache_bytes
