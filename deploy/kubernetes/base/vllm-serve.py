#!/usr/bin/env python3
"""Start vLLM's OpenAI-compatible server from environment variables (docker-compose.yml and the
Kubernetes vLLM Deployment in deploy/kubernetes/base run this inside the official vllm/vllm-openai
image).

    VLLM_MODEL                    target model (Hugging Face id or path)   Qwen/Qwen2.5-7B-Instruct
    VLLM_SERVED_MODEL_NAME        the name clients ask for                 qwen2.5-7b-instruct
    VLLM_SPECULATIVE_CONFIG       --speculative-config JSON; "off" for plain decoding; empty for a
                                  draft model made of the two variables below
    VLLM_DRAFT_MODEL              draft model of the default config        Qwen/Qwen2.5-0.5B-Instruct
    VLLM_NUM_SPECULATIVE_TOKENS   K of the default config                  4
    VLLM_GPU_MEMORY_UTILIZATION   share of the GPU vLLM may take           0.90
    VLLM_MAX_MODEL_LEN            longest context, prompt + reply          8192
    VLLM_MAX_NUM_SEQS             requests decoded together                32
    VLLM_TOOL_CALL_PARSER         the model's tool-call format, for tool calls hermes
                                  (--enable-auto-tool-choice --tool-call-parser; "off": none)
    VLLM_EXTRA_ARGS               more `vllm serve` arguments, shell-quoted
    VLLM_DRY_RUN=1                print the command instead of running it

vLLM's draft_model method wants the draft and the target to have the same vocabulary size. Qwen2.5
models share one tokenizer, but the 7B pads its embedding to 152064 rows and the 0.5B to 151936, so
for the default pair this script asks vLLM for its heterogeneous-vocabulary mode
(`use_heterogeneous_vocab`, token-level intersection: still lossless) when the installed vLLM has
it, and falls back to n-gram speculation with a warning when it does not. A VLLM_SPECULATIVE_CONFIG
that is set is passed to vLLM exactly as given.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

DEFAULTS = {
    "VLLM_MODEL": "Qwen/Qwen2.5-7B-Instruct",
    "VLLM_SERVED_MODEL_NAME": "qwen2.5-7b-instruct",
    "VLLM_DRAFT_MODEL": "Qwen/Qwen2.5-0.5B-Instruct",
    "VLLM_NUM_SPECULATIVE_TOKENS": "4",
    "VLLM_GPU_MEMORY_UTILIZATION": "0.90",
    "VLLM_MAX_MODEL_LEN": "8192",
    "VLLM_MAX_NUM_SEQS": "32",
    "VLLM_PORT": "8000",
    "VLLM_TOOL_CALL_PARSER": "hermes",  # Qwen2.5's <tool_call> format
}
OFF = {"off", "none", "false", "0"}

VocabProbe = Callable[[str], int | None]


def setting(env: Mapping[str, str], name: str) -> str:
    """The variable's value, or its default when unset or empty (compose passes unset ones as "")."""
    return env.get(name, "").strip() or DEFAULTS[name]


def vocab_size(model: str) -> int | None:
    """`vocab_size` from the model's config.json (local folder or Hugging Face), None if unknown."""
    try:
        path = Path(model)
        if path.is_dir():
            config_file = path / "config.json"
        else:
            from huggingface_hub import hf_hub_download

            config_file = Path(hf_hub_download(model, "config.json"))
        config = json.loads(config_file.read_text())
    except Exception as exc:  # no network, no such model, no huggingface_hub: let vLLM decide
        print(f"vllm-serve: cannot read the vocabulary size of {model}: {exc}", file=sys.stderr)
        return None
    size = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
    return int(size) if size else None


def supports_heterogeneous_vocab() -> bool:
    try:
        from vllm.config import SpeculativeConfig
    except Exception:
        return False
    fields = getattr(SpeculativeConfig, "__dataclass_fields__", {})
    return "use_heterogeneous_vocab" in fields or hasattr(SpeculativeConfig, "use_heterogeneous_vocab")


def speculative_config(
    env: Mapping[str, str],
    vocab: VocabProbe = vocab_size,
    heterogeneous_ok: Callable[[], bool] = supports_heterogeneous_vocab,
) -> dict[str, Any] | None:
    """The --speculative-config object, or None for plain decoding."""
    given = env.get("VLLM_SPECULATIVE_CONFIG", "").strip()
    if given.lower() in OFF:
        return None
    if given:
        try:
            config = json.loads(given)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"vllm-serve: VLLM_SPECULATIVE_CONFIG is not JSON ({exc}): {given}") from exc
        if not isinstance(config, dict):
            raise SystemExit(f"vllm-serve: VLLM_SPECULATIVE_CONFIG must be a JSON object: {given}")
        return config
    target, draft = setting(env, "VLLM_MODEL"), setting(env, "VLLM_DRAFT_MODEL")
    config = {"method": "draft_model", "model": draft,
              "num_speculative_tokens": int(setting(env, "VLLM_NUM_SPECULATIVE_TOKENS"))}
    target_vocab, draft_vocab = vocab(target), vocab(draft)
    if target_vocab is None or draft_vocab is None or target_vocab == draft_vocab:
        return config
    if heterogeneous_ok():
        print(f"vllm-serve: {target} has vocab_size {target_vocab} and {draft} {draft_vocab}: "
              "using use_heterogeneous_vocab", file=sys.stderr)
        return {**config, "use_heterogeneous_vocab": True}
    print(f"vllm-serve: WARNING: {target} has vocab_size {target_vocab} and {draft} {draft_vocab}, and this "
          "vLLM has no use_heterogeneous_vocab; falling back to n-gram speculation. Set "
          "VLLM_SPECULATIVE_CONFIG or VLLM_DRAFT_MODEL to choose another method.", file=sys.stderr)
    return {"method": "ngram", "num_speculative_tokens": config["num_speculative_tokens"],
            "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def command(
    env: Mapping[str, str],
    vocab: VocabProbe = vocab_size,
    heterogeneous_ok: Callable[[], bool] = supports_heterogeneous_vocab,
) -> list[str]:
    args = [
        "vllm", "serve", setting(env, "VLLM_MODEL"),
        "--host", "0.0.0.0",
        "--port", setting(env, "VLLM_PORT"),
        "--served-model-name", setting(env, "VLLM_SERVED_MODEL_NAME"),
        "--gpu-memory-utilization", setting(env, "VLLM_GPU_MEMORY_UTILIZATION"),
        "--max-model-len", setting(env, "VLLM_MAX_MODEL_LEN"),
        "--max-num-seqs", setting(env, "VLLM_MAX_NUM_SEQS"),
    ]
    spec = speculative_config(env, vocab, heterogeneous_ok)
    if spec is not None:
        args += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    parser = setting(env, "VLLM_TOOL_CALL_PARSER")
    if parser.lower() not in OFF:  # the calls' tools and tool_choice="auto" (the voice service's tool calls)
        args += ["--enable-auto-tool-choice", "--tool-call-parser", parser]
    return args + shlex.split(env.get("VLLM_EXTRA_ARGS", ""))


def main() -> None:
    args = command(os.environ)
    print("vllm-serve: " + shlex.join(args), file=sys.stderr, flush=True)
    if os.environ.get("VLLM_DRY_RUN", "") == "1":
        print(shlex.join(args))
        return
    os.execvp(args[0], args)


if __name__ == "__main__":
    main()
