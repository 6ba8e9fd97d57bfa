"""The memory guard: before loading a target and a draft, estimate weights + KV caches and refuse
with a clear error rather than run out of memory mid-call."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from core.errors import MemoryBudgetError

GIB = 1 << 30
BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class ModelFootprint:
    name: str
    weights: int  # bytes
    kv_per_token: int  # bytes for one token's keys and values over all layers


def footprint(path: str, dtype: str) -> ModelFootprint:
    """From a model folder's config.json (and its safetensors size, when present), or for a Hugging
    Face id from its config on the hub (counting the parameters a decoder of that shape has)."""
    folder = Path(path)
    config_file = folder / "config.json"
    if config_file.is_file():
        cfg = json.loads(config_file.read_text())
    elif not folder.exists() and not path.startswith((".", "/", "~")):
        try:
            from transformers import AutoConfig

            cfg = AutoConfig.from_pretrained(path).to_dict()
        except Exception as exc:
            raise MemoryBudgetError(f"cannot estimate the memory of {path!r}: its config could not be read "
                                    f"({type(exc).__name__}: {exc})") from exc
    else:
        raise MemoryBudgetError(f"cannot estimate the memory of {path!r}: no config.json there")
    width = BYTES.get(dtype, 4)
    layers = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    kv_per_token = 2 * layers * kv_heads * head_dim * width
    stored = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    stored_width = BYTES.get(str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32"), 4)
    if stored:
        weights = stored * width // stored_width
    else:  # no weights on disk to measure: count the parameters a decoder of this shape has
        hidden, inter, vocab = int(cfg["hidden_size"]), int(cfg["intermediate_size"]), int(cfg["vocab_size"])
        per_layer = 2 * hidden * hidden + 2 * hidden * kv_heads * head_dim + 3 * hidden * inter
        embeddings = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
        weights = (layers * per_layer + embeddings) * width
    return ModelFootprint(path, weights, kv_per_token)


def available_memory(cgroup_root: str = "/sys/fs/cgroup") -> int | None:
    """The memory this process can still take: the machine's available memory, or less where a
    container's cgroup limit (v2 memory.max, or v1 memory.limit_in_bytes) leaves less."""
    free: int | None = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
    except OSError:
        pass
    room = cgroup_room(cgroup_root)
    if room is not None:
        free = room if free is None else min(free, room)
    return free


def cgroup_room(root: str = "/sys/fs/cgroup") -> int | None:
    """Limit minus usage of this process's memory cgroup, or None where there is no limit."""
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            limit = Path(root, limit_file).read_text().strip()
            usage = int(Path(root, usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 1 << 60:  # v1 says "no limit" with a huge number
            return None
        return max(0, int(limit) - usage)
    return None


def check_memory(
    models: list[ModelFootprint], *, context_tokens: int, sequences: int, budget_gb: float, extra_tokens: int = 0
) -> int:
    """Raise MemoryBudgetError when weights + KV caches (context_tokens per sequence, `sequences` at
    once, and `extra_tokens` more: the /v1 generations') exceed the budget or the memory this
    machine has free. Returns the estimate in bytes."""
    weights = sum(m.weights for m in models)
    kv = sum(m.kv_per_token for m in models) * (context_tokens * sequences + extra_tokens)
    total = int((weights + kv) * 1.10)  # activations, logits and allocator slack
    extra = f" + {extra_tokens} for /v1" if extra_tokens else ""
    detail = (f"weights {weights / GIB:.2f} GiB ({', '.join(Path(m.name).parent.name or m.name for m in models)}) "
              f"+ KV caches {kv / GIB:.2f} GiB for {sequences} x {context_tokens} tokens{extra}, with 10% slack "
              f"= {total / GIB:.2f} GiB")
    if total > budget_gb * GIB:
        raise MemoryBudgetError(
            f"loading would need about {detail}, over the budget of {budget_gb:.1f} GiB "
            "(llm.speculative.memory_budget_gb); use a smaller draft or the ngram method, lower "
            "llm.max_context_tokens or server.max_sessions, or raise the budget"
        )
    free = available_memory()
    if free is not None and total > free and not os.environ.get("VOICE_AGENT_IGNORE_FREE_MEMORY"):
        raise MemoryBudgetError(f"loading would need about {detail}, but only {free / GIB:.2f} GiB is free")
    return total
