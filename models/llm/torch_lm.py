"""A causal language model on PyTorch (transformers), with one KV cache per sequence: the exactness
reference of the tests, and the runtime for Hugging Face ids (`llm.runtime = "torch"`).

LMState holds a sequence's cache and the token ids whose keys and values it holds, so the cache can
be extended, rolled back to any prefix exactly, and reused across the turns of a conversation.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import numpy as np
import torch

from core.errors import BackendUnavailableError, EngineError, ModelMissingError
from models.llm.lm import LMState, Logits, common_prefix

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


class TorchLM:
    """A Hugging Face causal LM loaded from a folder or hub id, run without gradients."""

    runtime = "torch"

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
        self.precision = str(self.dtype).removeprefix("torch.")
        # transformers renamed `past_key_values` to `cache`; use whichever this version takes.
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    @classmethod
    def load(cls, path: str, *, dtype: str = "auto", threads: int = 0, quantize: str = "none") -> TorchLM:
        """quantize "int8": int8 linear layers, per-channel weights and per-token activations with an
        exact int32 product (models/llm/int8.py), so a token's result does not depend on how many tokens
        pass together and speculation stays exact; the rest of the model runs in float32."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads > 0:
            torch.set_num_threads(threads)
        if quantize == "int8":
            from models.llm.int8 import ACCURACY_LIMIT, int8_error

            if int8_error() >= ACCURACY_LIMIT:
                raise BackendUnavailableError(
                    f"int8 matrix products lose precision on this CPU (relative error {int8_error():.2f} on a test "
                    "product; CPUs without AVX-512 VNNI, AVX-VNNI or AMX saturate them): set llm.quantize = auto "
                    "or none (and llm.speculative.draft_quantize = none)")
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
            from models.llm.int8 import quantize_linears, use_rowwise_attention

            quantize_linears(model)
            use_rowwise_attention(model)
        elif quantize != "none":
            raise BackendUnavailableError(f"unknown quantization {quantize!r}; use none or int8")
        log.info("loaded %s in %s%s with %d threads", path, torch_dtype, " (int8 linear layers)" if
                 quantize == "int8" else "", torch.get_num_threads())
        lm = cls(model, tokenizer, name=path)
        lm.quantized = quantize == "int8"
        if lm.quantized:
            lm.precision = "int8 linear layers"
        return lm

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, name: str = "in-memory") -> TorchLM:
        model.eval()
        return cls(model, tokenizer, name)

    # -- prompts ---------------------------------------------------------------------------------
    def chat_tokens(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True, tools=tools or None
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def token_texts(self) -> list[bytes]:
        texts = [b""] * self.vocab_size
        for text, tid in self.tokenizer.get_vocab().items():
            if 0 <= tid < self.vocab_size:
                texts[tid] = text.encode()
        return texts

    def token_bytes(self) -> list[bytes]:
        """Byte-level BPE vocabularies (Qwen's, GPT-2's) write each byte as one printable character."""
        decoder = {ch: byte for byte, ch in _byte_chars().items()}
        special = set(self.tokenizer.all_special_ids) | {
            tid for tid, added in getattr(self.tokenizer, "added_tokens_decoder", {}).items() if added.special}
        texts = [b""] * self.vocab_size
        for text, tid in self.tokenizer.get_vocab().items():
            if 0 <= tid < self.vocab_size and tid not in special:
                texts[tid] = bytes(decoder[ch] for ch in text) if all(ch in decoder for ch in text) else text.encode()
        return texts

    def special_id(self, text: str) -> int | None:
        tid = self.tokenizer.convert_tokens_to_ids(text)
        return tid if isinstance(tid, int) and tid != self.tokenizer.unk_token_id and tid is not None else None

    # -- the cache -------------------------------------------------------------------------------
    def new_state(self) -> LMState:
        from transformers import DynamicCache

        return LMState(cache=DynamicCache())

    def release(self, state: LMState) -> None:
        state.cache = None
        state.tokens.clear()

    def remember_prefix(self, tokens: list[int], pinned: bool = False) -> None:
        """Nothing: this runtime is the reference, not the fast path."""

    @torch.inference_mode()
    def extend(self, state: LMState, tokens: list[int], keep_logits: int = 1) -> Logits:
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
        logits: Logits = out.logits[0, -keep_logits:].float().numpy()  # [keep_logits, V]
        return logits.astype(np.float32, copy=False)

    def truncate(self, state: LMState, length: int) -> None:
        """Roll the cache back so it holds exactly the first `length` tokens."""
        drop = len(state.tokens) - length
        if drop < 0:
            raise EngineError(f"cannot truncate a cache of {len(state.tokens)} tokens to {length}")
        if drop:
            state.cache.crop(-drop)
            del state.tokens[length:]

    def prefill(self, state: LMState, prompt: list[int]) -> tuple[Logits, int]:
        """Make the cache hold `prompt`, computing only what differs from what the cache already
        holds (at least the last prompt token). Returns (logits [V] for the token after the prompt,
        the number of tokens computed)."""
        common = min(common_prefix(state.tokens, prompt), len(prompt) - 1)
        self.truncate(state, common)
        return self.extend(state, prompt[common:])[-1], len(prompt) - common



def choose_quantization(path: str, *, dtype: str = "auto", threads: int = 0) -> str:
    """"int8" only where int8 linear layers are accurate and faster on this CPU than the float dtype,
    else "none" (see measure_quantization)."""
    return measure_quantization(path, dtype=dtype, threads=threads)[0]


def measure_quantization(path: str, *, dtype: str = "auto", threads: int = 0) -> tuple[str, TorchLM | None]:
    """Measure int8 linear layers against the float dtype on a 64-token prompt and single-token
    steps (a short reply's work). On AVX-512 VNNI CPUs int8 wins; on AVX2-only ones `torch._int_mm`
    was 2x slower per token and 23x slower in prefill than float32, and inaccurate. Returns the
    choice, and the int8 model when it won (it is already loaded: the caller need not load it again)."""
    import statistics

    from core.clock import MonotonicClock
    from models.llm.int8 import int8_error, int8_is_accurate

    if not int8_is_accurate():
        log.info("quantize auto: int8 products lose precision on this CPU (relative error %.2f): using none",
                 int8_error())
        return "none", None

    clock = MonotonicClock()

    def cost(lm: TorchLM) -> float:
        prompt = [(100 + i) % lm.vocab_size for i in range(64)]
        state = lm.new_state()
        started = clock.now()
        lm.extend(state, prompt)
        prefill = clock.now() - started
        steps = []
        for i in range(5):
            started = clock.now()
            lm.extend(state, [(200 + i) % lm.vocab_size])
            steps.append(clock.now() - started)
        return prefill + 32 * statistics.median(steps[1:])

    float_cost = cost(TorchLM.load(path, dtype=dtype, threads=threads, quantize="none"))
    int8_lm = TorchLM.load(path, dtype=dtype, threads=threads, quantize="int8")
    int8_cost = cost(int8_lm)
    choice = "int8" if int8_cost < float_cost else "none"
    log.info("quantize auto: a 64-token prompt and 32 tokens cost %.0f ms in %s, %.0f ms with int8 layers: "
             "using %s", float_cost * 1000, dtype, int8_cost * 1000, choice)
    return choice, int8_lm if choice == "int8" else None


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable bytes stand for themselves, the others are moved up
    past 255 in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    return chars
