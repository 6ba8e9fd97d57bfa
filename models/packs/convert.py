"""One-time conversion of a GGUF file into a folder that transformers loads quickly
(config, tokenizer with chat template, safetensors weights in bfloat16), for the PyTorch runtime.

transformers dequantizes GGUF to float on every load, which takes minutes for the Qwen pair; doing
it once, the first time the torch runtime asks for a pack, makes later starts take seconds. The
default llama.cpp runtime loads the GGUF as it is and never needs this.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from core.errors import ModelFetchError


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


def convert_pack(gguf: Path, out_dir: Path, *, say: Callable[[str], None] = print) -> None:
    """Convert into a temporary folder beside `out_dir` and rename it into place when complete."""
    say(f"converting {gguf} to safetensors for the torch runtime (once; a minute or two)")
    work = Path(tempfile.mkdtemp(prefix=".hf.", dir=out_dir.parent))
    try:
        gguf_to_safetensors(gguf, work, say=say)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(work, out_dir)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
