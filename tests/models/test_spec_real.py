"""Speculative decoding on the real Qwen2.5 pair (1.5B target, 0.5B draft from the model packs).

With int8 layers (the default: per-token activations, exact int32 products, row-wise attention)
and in float32, greedy speculation reproduces plain decoding token for token. In bfloat16 the target's
forward pass over several tokens rounds differently from one token at a time, so greedy outputs
may part where the target's top two logits are within bfloat16's rounding: the test checks that
every such parting is at a near-tie, i.e. a numeric effect, never an algorithmic one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from models.cache import resolve
from models.spec.decoder import SpeculativeStrategy
from models.torch_lm import TorchLM
from pipeline.clock import MonotonicClock
from pipeline.errors import IncompatibleModelsError
from tests.models.spec_helpers import generate, params

pytestmark = pytest.mark.slow

SYSTEM = "You are a friendly voice assistant. Answer in two or three short spoken sentences."
QUESTIONS = [
    "I'd like two large pepperoni pizzas and a garlic bread delivered to 42 Baker Street, please.",
    "Why is the sky blue?",
    "Can you book me a table for four at seven tonight under the name Miller?",
]


def pair(dtype: str, quantize: str = "none") -> Iterator[SpeculativeStrategy]:
    target = TorchLM.load(resolve("qwen2.5-1.5b-instruct"), dtype=dtype, quantize=quantize)
    draft = TorchLM.load(resolve("qwen2.5-0.5b-instruct"), dtype=dtype, quantize="int8")
    yield SpeculativeStrategy(target, MonotonicClock(), draft=draft, calibrate=False)


# Function-scoped pairs, one test each: three 1.5B/0.5B pairs alive at once would not fit in memory.
@pytest.fixture
def int8_pair() -> Iterator[SpeculativeStrategy]:
    yield from pair("float32", "int8")


@pytest.fixture
def fp32_pair() -> Iterator[SpeculativeStrategy]:
    yield from pair("float32")


@pytest.fixture
def bf16_pair() -> Iterator[SpeculativeStrategy]:
    yield from pair("bfloat16")


def chat(lm: TorchLM, question: str) -> list[int]:
    return lm.chat_tokens([{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])


def assert_equal_to_plain(strategy: SpeculativeStrategy, questions: list[str], max_tokens: int) -> None:
    for question in questions:
        prompt = chat(strategy.lm, question)
        plain, _, _ = generate(strategy, prompt, params("off", max_tokens=max_tokens))
        for method in ("ngram", "draft_model"):
            fast, stats, _ = generate(strategy, prompt, params(method, k=4, max_tokens=max_tokens))
            decode = strategy.lm.tokenizer.decode
            assert fast == plain, (method, decode(plain), decode(fast))
            assert stats.drafts > 0


def test_int8_greedy_speculation_equals_plain(int8_pair: SpeculativeStrategy) -> None:
    assert_equal_to_plain(int8_pair, QUESTIONS, 40)


def test_float32_greedy_speculation_equals_plain(fp32_pair: SpeculativeStrategy) -> None:
    assert_equal_to_plain(fp32_pair, QUESTIONS[:2], 32)


def test_bfloat16_partings_from_plain_are_only_at_near_ties(bf16_pair: SpeculativeStrategy) -> None:
    lm = bf16_pair.lm
    accepted = 0
    for question in QUESTIONS:
        prompt = chat(lm, question)
        plain, _, _ = generate(bf16_pair, prompt, params("off", max_tokens=40))
        for method in ("ngram", "draft_model"):
            fast, stats, _ = generate(bf16_pair, prompt, params(method, k=4, max_tokens=40))
            accepted += stats.accepted_tokens
            parting = next((i for i, (a, b) in enumerate(zip(plain, fast, strict=False)) if a != b), None)
            if parting is None:
                assert len(fast) == len(plain)
                continue
            state = lm.new_state()
            logits, _ = lm.prefill(state, prompt + plain[:parting])
            top = torch.topk(logits, 2).values
            assert float(top[0] - top[1]) <= 0.5, (method, question, parting, top.tolist())
    assert accepted > 0


def test_a_draft_of_another_family_is_refused() -> None:
    target = TorchLM.load(resolve("qwen2.5-0.5b-instruct"))
    other = TorchLM.load(resolve("smollm2-135m-instruct"))
    with pytest.raises(IncompatibleModelsError, match="vocabulary"):
        SpeculativeStrategy(target, MonotonicClock(), draft=other, calibrate=False)
