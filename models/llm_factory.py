"""Builds the embedded LLM from its settings: the target model and its decoding strategy."""

from __future__ import annotations

from models.cache import resolve
from models.config import LlmConfig
from models.llm_embedded import EmbeddedLLM
from models.torch_lm import TorchLM
from pipeline.clock import Clock


def load_embedded(config: LlmConfig, clock: Clock) -> EmbeddedLLM:
    lm = TorchLM.load(resolve(config.model), dtype=config.dtype, threads=config.threads)
    return EmbeddedLLM(lm, clock)
