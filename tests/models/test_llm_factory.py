"""The embedded engine built from settings on the PyTorch runtime (llm.runtime = "torch"), with
its precision chosen by measuring (llm.quantize = "auto"), on a tiny model saved to a folder as a
Hugging Face model would be."""

from __future__ import annotations

import asyncio
from pathlib import Path

from core.clock import MonotonicClock
from models.config import LlmConfig, SpeculativeConfig
from models.llm.llm_factory import load_embedded
from models.protocols import ChatMessage, GenerationDone, SamplingParams
from tests.models.tiny import tiny_lm


def test_torch_runtime_loads_a_folder_and_chooses_its_precision_by_measuring(tmp_path: Path) -> None:
    tiny = tiny_lm(3, scale=3.0)
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    config = LlmConfig(runtime="torch", model=str(tmp_path), quantize="auto", threads=1,
                       speculative=SpeculativeConfig(method="ngram", max_speculative_tokens=2))
    llm = load_embedded(config, MonotonicClock(), sequences=2)
    assert llm.lm.runtime == "torch"
    assert llm.lm.precision in ("int8 linear layers", "float32", "bfloat16")

    async def ask() -> GenerationDone:
        conversation = llm.conversation()
        done = None
        async for out in conversation.stream([ChatMessage("user", "w3 w4 w5")],
                                             SamplingParams(temperature=0.0, max_tokens=6)):
            if isinstance(out, GenerationDone):
                done = out
        await conversation.aclose()
        await llm.aclose()
        assert done is not None
        return done

    done = asyncio.run(ask())
    assert done.stats.completion_tokens > 0 and done.stats.method == "ngram"
