"""One-time conversion of a GGUF file into a folder that transformers loads quickly
(config, tokenizer with chat template, safetensors weights in bfloat16).

transformers dequantizes GGUF to float on every load, which takes minutes for the Qwen pair; doing
it once at fetch time makes a start take seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pipeline.errors import ModelFetchError


def _dequantize_option() -> dict[str, object]:
    """Newer transformers keep GGUF weights packed unless told to unpack them; older ones always do."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def gguf_to_safetensors(gguf: Path, out_dir: Path, *, say: Callable[[str], None] = print) -> None:
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:  # pragma: no cover - both are core dependencies
        raise ModelFetchError(f"converting GGUF needs torch and transformers: {exc}") from exc
    try:
        say("  reading the tokenizer and chat template")
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        say("  dequantizing weights (progress below)")
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16, **_dequantize_option()
        )
        say(f"  writing safetensors to {out_dir}")
        model.save_pretrained(str(out_dir), safe_serialization=True)
        tokenizer.save_pretrained(str(out_dir))
    except Exception as exc:
        raise ModelFetchError(f"converting {gguf.name} failed: {type(exc).__name__}: {exc}") from exc
