"""Builds the embedded LLM from its settings: the memory guard, the target model, the draft model
when one is configured, and the speculative decoding strategy."""

from __future__ import annotations

import logging

from models.cache import resolve
from models.config import LlmConfig
from models.llm_embedded import EmbeddedLLM
from models.spec.decoder import SpeculativeStrategy
from models.spec.memory import check_memory, footprint
from models.torch_lm import TorchLM, choose_dtype
from pipeline.clock import Clock

log = logging.getLogger(__name__)


def load_embedded(config: LlmConfig, clock: Clock, *, sequences: int = 8) -> EmbeddedLLM:
    """`sequences`: conversations held at once (the server's max_sessions), for the KV estimate."""
    spec = config.speculative
    target_path = resolve(config.model)
    draft_path = resolve(spec.draft_model) if spec.method == "draft_model" else None
    # int8 models keep float32 embeddings, norms and KV caches: estimating them as float32 errs safe
    dtype = "float32" if config.quantize == "int8" else str(choose_dtype(config.dtype)).removeprefix("torch.")
    paths = [p for p in (target_path, draft_path) if p is not None]
    local = [p for p in paths if _is_local(p)]
    if local:
        total = check_memory([footprint(p, dtype) for p in local], context_tokens=config.max_context_tokens,
                             sequences=sequences, budget_gb=spec.memory_budget_gb)
        log.info("memory estimate %.2f GiB within the %.1f GiB budget", total / (1 << 30), spec.memory_budget_gb)
    lm = TorchLM.load(target_path, dtype=config.dtype, threads=config.threads, quantize=config.quantize)
    draft = TorchLM.load(draft_path, dtype=config.dtype, quantize=spec.draft_quantize) if draft_path else None
    fixed = None if spec.num_speculative_tokens == "auto" else int(spec.num_speculative_tokens)
    strategy = SpeculativeStrategy(lm, clock, method=spec.method, fixed_k=fixed, max_k=spec.max_speculative_tokens,
                                   draft=draft, ngram_min=spec.ngram_min, ngram_max=spec.ngram_max,
                                   draft_copy_min=spec.draft_copy_min)
    return EmbeddedLLM(lm, clock, strategy)


def _is_local(path: str) -> bool:
    from pathlib import Path

    return Path(path).is_dir()
