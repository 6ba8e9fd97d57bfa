"""A draft of another vocabulary is refused; a pair that would not fit in memory is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.clock import MonotonicClock
from core.errors import IncompatibleModelsError, MemoryBudgetError
from models.llm.memory import GIB, available_memory, cgroup_room, check_memory, footprint
from models.speculative.decoder import SpeculativeStrategy
from tests.models.tiny import tiny_lm


def test_a_draft_with_another_vocabulary_is_refused() -> None:
    target = tiny_lm(0, vocab_size=64, name="target")
    other = tiny_lm(1, vocab_size=48, name="other")
    with pytest.raises(IncompatibleModelsError, match="vocabulary sizes differ"):
        SpeculativeStrategy(target, MonotonicClock(), draft=other, calibrate=False)


def qwen_like(tmp: Path, layers: int, hidden: int, kv_heads: int, heads: int, weights_bytes: int) -> str:
    (tmp / "config.json").write_text(json.dumps({
        "num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "intermediate_size": 4 * hidden, "vocab_size": 151936,
        "dtype": "bfloat16"}))
    with (tmp / "model.safetensors").open("wb") as f:
        f.truncate(weights_bytes)
    return str(tmp)


def test_memory_estimate_counts_weights_and_kv(tmp_path: Path) -> None:
    path = qwen_like(tmp_path, layers=28, hidden=1536, kv_heads=2, heads=12, weights_bytes=3 * GIB)
    fp = footprint(path, "bfloat16")
    assert fp.weights == 3 * GIB
    assert fp.kv_per_token == 2 * 28 * 2 * 128 * 2  # keys+values x layers x kv heads x head dim x bytes
    assert footprint(path, "float32").weights == 6 * GIB


def test_a_pair_over_the_budget_is_refused_with_the_numbers(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    target = footprint(qwen_like(a, 28, 1536, 2, 12, 3 * GIB), "bfloat16")
    draft = footprint(qwen_like(b, 24, 896, 2, 14, 1 * GIB), "bfloat16")
    with pytest.raises(MemoryBudgetError, match=r"over the budget of 2\.0 GiB") as info:
        check_memory([target, draft], context_tokens=4096, sequences=8, budget_gb=2.0)
    assert "ngram" in str(info.value)  # says what to do
    with pytest.raises(MemoryBudgetError, match="KV caches"):
        check_memory([target, draft], context_tokens=32768, sequences=64, budget_gb=8.0)


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_a_containers_memory_limit_bounds_what_is_free(tmp_path: Path, version: str) -> None:
    """Inside a container /proc/meminfo shows the host's memory; the cgroup limit is what counts."""
    if version == "v2":
        (tmp_path / "memory.max").write_text(f"{2 * GIB}\n")
        (tmp_path / "memory.current").write_text(f"{GIB // 2}\n")
    else:
        (tmp_path / "memory").mkdir()
        (tmp_path / "memory" / "memory.limit_in_bytes").write_text(f"{2 * GIB}\n")
        (tmp_path / "memory" / "memory.usage_in_bytes").write_text(f"{GIB // 2}\n")
    assert cgroup_room(str(tmp_path)) == GIB + GIB // 2
    free = available_memory(str(tmp_path))
    assert free is not None and free <= GIB + GIB // 2
    (tmp_path / "unlimited").mkdir()
    (tmp_path / "unlimited" / "memory.max").write_text("max\n")
    (tmp_path / "unlimited" / "memory.current").write_text("123\n")
    assert cgroup_room(str(tmp_path / "unlimited")) is None


def test_a_folder_without_a_config_is_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(MemoryBudgetError, match=r"no config\.json"):
        footprint(str(tmp_path), "float32")
