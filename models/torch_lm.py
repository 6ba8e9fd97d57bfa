"""A causal language model on PyTorch (transformers), with one KV cache per sequence.

LMState holds a sequence's cache and the token ids whose keys and values it holds, so the cache can
be extended, rolled back to any prefix exactly, and reused across the turns of a conversation.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from pipeline.errors import BackendUnavailableError, EngineError, ModelMissingError

log = logging.getLogger(__name__)


def choose_dtype(name: str) -> torch.dtype:
    """"auto": bfloat16 where the CPU computes it natively (AVX-512 BF16 or AMX), else float32.
    Measured on a 2-core AVX-512 BF16 CPU: Qwen2.5 1.5B decodes a token in ~220 ms in bfloat16 and
    verifies 8 tokens in ~230 ms, where float32 takes ~145 ms for one token but ~280 ms for 8."""
    if name == "auto":
        return torch.bfloat16 if _cpu_has_bf16() else torch.float32
    try:
        dtype = getattr(torch, name)
    except AttributeError as exc:
        raise BackendUnavailableError(f"unknown dtype {name!r}; use auto, bfloat16 or float32") from exc
    if not isinstance(dtype, torch.dtype):
        raise BackendUnavailableError(f"unknown dtype {name!r}; use auto, bfloat16 or float32")
    return dtype


def _cpu_has_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


@dataclass
class LMState:
    """One sequence: the KV cache and the ids of the tokens it holds (cache length == len(tokens))."""

    cache: Any
    tokens: list[int] = field(default_factory=list)


class TorchLM:
    """A Hugging Face causal LM loaded from a folder or hub id, run without gradients."""

    def __init__(self, model: Any, tokenizer: Any, name: str) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.vocab_size = int(model.config.vocab_size)
        self.dtype = next(model.parameters()).dtype
        eos = {tokenizer.eos_token_id}
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
        for special in ("<|im_end|>", "<|endoftext|>"):
            tid = tokenizer.convert_tokens_to_ids(special)
            if isinstance(tid, int) and tid != tokenizer.unk_token_id:
                eos.add(tid)
        self.stop_ids = frozenset(t for t in eos if isinstance(t, int))
        self.quantized = False
        # transformers renamed `past_key_values` to `cache`; use whichever this version takes.
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    @classmethod
    def load(cls, path: str, *, dtype: str = "auto", threads: int = 0, quantize: str = "none") -> TorchLM:
        """quantize "int8": int8 linear layers, per-channel weights and per-token activations with an
        exact int32 product (models/int8.py), so a token's result does not depend on how many tokens
        pass together and speculation stays exact; the rest of the model runs in float32."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads > 0:
            torch.set_num_threads(threads)
        torch_dtype = torch.float32 if quantize == "int8" else choose_dtype(dtype)
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
        except OSError as exc:
            raise ModelMissingError(
                f"cannot load the language model from {path!r} ({exc}); fetch the default with "
                "`voice-agent models fetch`, or give a local folder or a Hugging Face id"
            ) from exc
        model.eval()
        if quantize == "int8":
            from models.int8 import quantize_linears, use_rowwise_attention

            quantize_linears(model)
            use_rowwise_attention(model)
        elif quantize != "none":
            raise BackendUnavailableError(f"unknown quantization {quantize!r}; use none or int8")
        log.info("loaded %s in %s%s with %d threads", path, torch_dtype, " (int8 linear layers)" if
                 quantize == "int8" else "", torch.get_num_threads())
        lm = cls(model, tokenizer, name=path)
        lm.quantized = quantize == "int8"
        return lm

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, name: str = "in-memory") -> TorchLM:
        model.eval()
        return cls(model, tokenizer, name)

    # -- prompts ---------------------------------------------------------------------------------
    def chat_tokens(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    # -- the cache -------------------------------------------------------------------------------
    def new_state(self) -> LMState:
        from transformers import DynamicCache

        return LMState(cache=DynamicCache())

    @torch.inference_mode()
    def extend(self, state: LMState, tokens: list[int], keep_logits: int = 1) -> torch.Tensor:
        """Feed tokens after the cached ones; returns float32 logits [keep_logits, V] for the last
        `keep_logits` fed positions (the distribution of the token following each)."""
        if not tokens:
            raise EngineError("extend() needs at least one token")
        ids = torch.tensor([tokens], dtype=torch.long)  # [1, n]
        try:
            out = self.model(
                input_ids=ids, use_cache=True, logits_to_keep=keep_logits, **{self._cache_kwarg: state.cache}
            )
        except RuntimeError as exc:
            raise EngineError(f"{self.name}: forward pass failed: {exc}") from exc
        state.tokens.extend(tokens)
        return out.logits[0, -keep_logits:].float()  # [keep_logits, V]

    def truncate(self, state: LMState, length: int) -> None:
        """Roll the cache back so it holds exactly the first `length` tokens."""
        drop = len(state.tokens) - length
        if drop < 0:
            raise EngineError(f"cannot truncate a cache of {len(state.tokens)} tokens to {length}")
        if drop:
            state.cache.crop(-drop)
            del state.tokens[length:]

    def prefill(self, state: LMState, prompt: list[int]) -> tuple[torch.Tensor, int]:
        """Make the cache hold `prompt`, computing only what differs from what the cache already
        holds (at least the last prompt token). Returns (logits [V] for the token after the prompt,
        the number of tokens computed)."""
        common = 0
        for a, b in zip(state.tokens, prompt, strict=False):
            if a != b:
                break
            common += 1
        common = min(common, len(prompt) - 1)
        self.truncate(state, common)
        return self.extend(state, prompt[common:])[-1], len(prompt) - common

