"""Builds the embedded LLM from its settings: the memory guard, the target model, the draft model
when one is configured, and the speculative decoding strategy, on the chosen runtime."""

from __future__ import annotations

import logging
from pathlib import Path

from core.clock import Clock
from core.worker import ModelWorker
from models.config import LlmConfig
from models.cpu import cores
from models.llm.llm_embedded import EmbeddedLLM
from models.llm.lm import CausalLM
from models.llm.memory import ModelFootprint, check_memory
from models.packs.cache import resolve_gguf, resolve_torch
from models.speculative.decoder import SpeculativeStrategy

log = logging.getLogger(__name__)


def load_embedded(config: LlmConfig, clock: Clock, *, sequences: int = 8, api_sequences: int = 0,
                  worker: ModelWorker | None = None) -> EmbeddedLLM:
    """`sequences`: calls held at once (server.max_sessions) of llm.max_context_tokens each;
    `api_sequences`: /v1 generations at once (server.max_api_requests) of llm.api_context_tokens;
    `worker`: another engine's thread to run on (two models in one process take turns on the cores
    in deadline order, instead of two llama.cpp thread pools fighting over them)."""
    spec = config.speculative
    threads = config.threads or cores()
    refs = [config.model] + ([spec.draft_model] if spec.method == "draft_model" else [])
    if config.runtime == "llama.cpp":
        lm, draft = _load_llama(config, refs, threads, sequences, api_sequences)
    else:
        lm, draft = _load_torch(config, refs, threads, sequences, api_sequences)
    fixed = None if spec.num_speculative_tokens == "auto" else int(spec.num_speculative_tokens)
    strategy = SpeculativeStrategy(lm, clock, method=spec.method, fixed_k=fixed, max_k=spec.max_speculative_tokens,
                                   draft=draft, ngram_min=spec.ngram_min, ngram_max=spec.ngram_max,
                                   draft_copy_min=spec.draft_copy_min)
    return EmbeddedLLM(lm, clock, strategy, worker=worker, max_context_tokens=config.max_context_tokens,
                       schedule=config.schedule, api_deadline_s=config.api_deadline_s)


def _load_llama(config: LlmConfig, refs: list[str], threads: int, sequences: int,
                api_sequences: int) -> tuple[CausalLM, CausalLM | None]:
    from models.llm.llama_cpp_lm import LlamaCppLM, system_info
    from models.packs.gguf_meta import kv_bytes_per_token

    paths = [resolve_gguf(r) for r in refs]
    # Each model's context holds max_context_tokens for every call, plus one for the remembered
    # prefixes and the calibration, and api_context_tokens for every /v1 generation (llama.cpp's
    # f16 cache: 2 bytes an element).
    footprints = [ModelFootprint(p, Path(p).stat().st_size, kv_bytes_per_token(p)) for p in paths]
    api_tokens = config.api_context_tokens * api_sequences
    total = check_memory(footprints, context_tokens=config.max_context_tokens, sequences=sequences + 1,
                         extra_tokens=api_tokens, budget_gb=config.speculative.memory_budget_gb)
    log.info("memory estimate %.2f GiB within the %.1f GiB budget", total / (1 << 30),
             config.speculative.memory_budget_gb)
    log.info("llama.cpp: %s", system_info().strip())
    models = [LlamaCppLM(p, threads=threads, context_tokens=config.max_context_tokens, sequences=sequences,
                         api_sequences=api_sequences, api_context_tokens=config.api_context_tokens, name=r)
              for p, r in zip(paths, refs, strict=True)]
    return models[0], (models[1] if len(models) > 1 else None)


def _load_torch(config: LlmConfig, refs: list[str], threads: int, sequences: int,
                api_sequences: int) -> tuple[CausalLM, CausalLM | None]:
    from models.llm.memory import footprint
    from models.llm.torch_lm import TorchLM, choose_dtype, measure_quantization

    paths = [resolve_torch(r) for r in refs]
    dtype = str(choose_dtype(config.dtype)).removeprefix("torch.")
    # int8 models keep float32 embeddings, norms and KV caches: estimating them as float32 errs safe
    estimate_dtype = "float32" if config.quantize != "none" else dtype
    # Folders and Hugging Face ids alike (an id's config comes from the hub).
    total = check_memory([footprint(p, estimate_dtype) for p in paths], context_tokens=config.max_context_tokens,
                         sequences=sequences, extra_tokens=config.api_context_tokens * api_sequences,
                         budget_gb=config.speculative.memory_budget_gb)
    log.info("memory estimate %.2f GiB within the %.1f GiB budget", total / (1 << 30),
             config.speculative.memory_budget_gb)
    quantize: str = config.quantize
    lm: TorchLM | None = None
    if quantize == "auto":
        quantize, lm = measure_quantization(paths[0], dtype=config.dtype, threads=threads)
    if lm is None:
        lm = TorchLM.load(paths[0], dtype=config.dtype, threads=threads, quantize=quantize)
    draft = None
    if len(paths) > 1:
        from models.llm.int8 import int8_error, int8_is_accurate

        draft_quantize = config.speculative.draft_quantize
        if draft_quantize == "int8" and not int8_is_accurate():
            log.warning("int8 products lose precision on this CPU (relative error %.2f): the draft runs unquantized",
                        int8_error())
            draft_quantize = "none"
        draft = TorchLM.load(paths[1], dtype=config.dtype, quantize=draft_quantize)
    return lm, draft
