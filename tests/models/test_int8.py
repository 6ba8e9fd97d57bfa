"""Int8 linear layers give each token the same result alone or in a batch, so speculation on an
int8 target still equals plain decoding token for token."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from core.clock import MonotonicClock
from core.errors import BackendUnavailableError
from models.llm.int8 import Int8Linear, int8_error, int8_is_accurate, quantize_linears, use_rowwise_attention
from models.llm.torch_lm import TorchLM, choose_quantization
from models.speculative.decoder import SpeculativeStrategy
from tests.models.spec_helpers import generate, params, prompt_of
from tests.models.tiny import tiny_lm


def test_rows_are_computed_the_same_alone_or_together() -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 160)
    q = Int8Linear(linear)
    x = torch.randn(9, 96) * 3
    together = q(x)
    alone = torch.cat([q(x[i:i + 1]) for i in range(9)])
    assert torch.equal(together, alone)


def test_int8_is_used_only_where_its_products_are_accurate(tmp_path: Path) -> None:
    """Where this CPU's int8 kernels are exact the error is quantization's (~1 %); where they
    saturate (AVX2-only), loading an int8 model is refused with what to set instead, and `auto`
    chooses float without measuring speed."""
    if int8_is_accurate():
        assert int8_error() < 0.03
        return
    tiny = tiny_lm(4)
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    with pytest.raises(BackendUnavailableError, match=r"llm\.quantize"):
        TorchLM.load(str(tmp_path), quantize="int8")
    assert choose_quantization(str(tmp_path)) == "none"


def test_greedy_speculation_on_an_int8_target_equals_plain_decoding() -> None:
    target = tiny_lm(0, scale=6.0, name="target")
    quantize_linears(target.model)
    use_rowwise_attention(target.model)
    draft = tiny_lm(1, scale=6.0, layers=1, name="draft")
    quantize_linears(draft.model)
    strategy = SpeculativeStrategy(target, MonotonicClock(), draft=draft, calibrate=False)
    for text in ("w1 w2 w3 w4", "w5 w9 w5 w9 w5 w9", "w20"):
        prompt = prompt_of(target, text)
        plain, _, _ = generate(strategy, prompt, params("off", max_tokens=40))
        for method in ("ngram", "draft_model"):
            fast, _, _ = generate(strategy, prompt, params(method, k=4, max_tokens=40))
            assert fast == plain, (method, text)


def test_rowwise_attention_matches_one_token_steps_exactly() -> None:
    lm = tiny_lm(2, scale=3.0)
    quantize_linears(lm.model)
    use_rowwise_attention(lm.model)
    tokens = [7, 8, 9, 10, 11, 12, 13]
    together = lm.new_state()
    batched = lm.extend(together, tokens, keep_logits=len(tokens))  # [7, V]
    alone = lm.new_state()
    stepped = np.concatenate([lm.extend(alone, [t]) for t in tokens])  # [7, V]
    assert np.array_equal(batched, stepped)
