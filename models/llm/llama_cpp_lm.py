"""A causal language model on llama.cpp (llama-cpp-python's low-level API), over a GGUF file as
shipped (the packs' Q4_K_M): the embedded engine's default runtime on CPU.

One llama.cpp context per model holds every conversation as its own sequence in a unified KV cache:
- `extend` decodes a batch of positions of one sequence, with logits for the last `keep_logits`
  (the speculative verifier's K + 1);
- `truncate` removes the rejected positions from the sequence (exact rollback);
- `remember_prefix` keeps a system prompt's cache in a sequence of its own, and a new sequence that
  starts with it gets the cells by `seq_cp` (shared, not recomputed).

Not thread-safe: every call for one model runs on that model's worker thread.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import BackendUnavailableError, EngineError, ModelMissingError
from models.llm.lm import LMState, Logits, common_prefix

log = logging.getLogger(__name__)
# A call's sequences: its conversation and the end-of-turn weigher's (pipeline/session/session.py).
SEQUENCES_PER_CALL = 2
llama_log = logging.getLogger("llama.cpp")

_init_lock = threading.Lock()
_initialised = False
_log_callback: Any = None  # kept referenced: llama.cpp calls it from C


def _llama() -> Any:
    """Import llama_cpp and initialise its backend once, routing its log into Python's logging."""
    global _initialised, _log_callback
    try:
        import llama_cpp
    except ImportError as exc:
        raise BackendUnavailableError(
            f"the llama.cpp runtime cannot be imported ({exc}); run scripts/setup.sh, which builds "
            "llama-cpp-python for this CPU (scripts/build-llama-cpp.sh), or pip install 'voice-agent[llama]', "
            "or set llm.runtime = \"torch\""
        ) from exc
    with _init_lock:
        if not _initialised:
            # ggml's levels: 1 debug, 2 info, 3 warning, 4 error, 5 continuation. llama.cpp's info
            # (the model's metadata, buffer sizes) goes to debug: the service logs its own summary.
            levels = {3: logging.WARNING, 4: logging.ERROR}

            def forward(level: int, text: bytes, _user: Any) -> None:
                message = text.decode("utf-8", "replace").rstrip()
                if message:
                    llama_log.log(levels.get(level, logging.DEBUG), "%s", message)

            _log_callback = llama_cpp.llama_log_callback(forward)
            llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _initialised = True
    return llama_cpp


def system_info() -> str:
    """llama.cpp's report of the instruction sets it was built with and found (AVX2, AVX512...)."""
    return str(_llama().llama_print_system_info().decode())


class LlamaCppLM:
    """A GGUF model with one context; each LMState is a sequence id in its KV cache."""

    runtime = "llama.cpp"

    def __init__(self, path: str, *, threads: int, context_tokens: int = 4096, sequences: int = 8,
                 api_sequences: int = 0, api_context_tokens: int = 0, batch: int = 512, max_prefixes: int = 4,
                 name: str | None = None) -> None:
        """`sequences` calls of `context_tokens` each and `api_sequences` /v1 generations of
        `api_context_tokens` each share one unified cache, sized so that none can crowd out another."""
        self.lib = lib = _llama()
        self.path = path
        self.name = name or path
        if not Path(path).is_file():
            raise ModelMissingError(f"no GGUF file at {path!r}; fetch the pack with `voice-agent models fetch`")
        model_params = lib.llama_model_default_params()
        model_params.n_gpu_layers = 0
        self.model = lib.llama_model_load_from_file(path.encode(), model_params)
        if not self.model:
            raise ModelMissingError(f"llama.cpp could not load {path!r} (see the llama.cpp log lines above)")
        # Sequence ids: calls (each holds SEQUENCES_PER_CALL, and twice over: a call's slot is free
        # at hang-up, and taken again by a caller who redials, before its clean-up lets its
        # sequences go), /v1 generations, calibration and draft states, and the remembered prefixes.
        self.max_prefixes = max_prefixes
        n_seq = min(256, 2 * SEQUENCES_PER_CALL * sequences + api_sequences + max_prefixes + 4)
        ctx_params = lib.llama_context_default_params()
        # Cells, shared by all sequences (unified cache): every call at its bound, every /v1
        # generation at its own, and one context more for the prefixes and the calibration.
        ctx_params.n_ctx = context_tokens * (sequences + 1) + api_context_tokens * api_sequences
        ctx_params.n_batch = batch
        ctx_params.n_ubatch = batch
        ctx_params.n_seq_max = n_seq
        ctx_params.n_threads = threads
        ctx_params.n_threads_batch = threads
        ctx_params.kv_unified = True
        ctx_params.n_outputs_max = batch
        ctx_params.n_outputs_max_per_seq = batch  # a verification pass keeps K + 1 logits of one sequence
        ctx_params.no_perf = True
        self.ctx = lib.llama_init_from_model(self.model, ctx_params)
        if not self.ctx:
            lib.llama_model_free(self.model)
            raise EngineError(f"llama.cpp could not make a context for {path!r} "
                              f"({ctx_params.n_ctx} cache cells, {n_seq} sequences)")
        self.memory = lib.llama_get_memory(self.ctx)
        self.vocab = lib.llama_model_get_vocab(self.model)
        self.vocab_size = int(lib.llama_vocab_n_tokens(self.vocab))
        self.batch_size = batch
        self.context_tokens = context_tokens
        self.threads = threads
        self._batch = lib.llama_batch_init(batch, 0, 1)
        self._free_seqs = list(range(n_seq - 1, -1, -1))
        self._prefixes: OrderedDict[tuple[int, ...], int] = OrderedDict()  # prefix -> its sequence id
        self._pinned: set[tuple[int, ...]] = set()  # prefixes never forgotten (the default system prompt)
        self._pieces: dict[int, bytes] = {}
        self.stop_ids = frozenset(t for t in range(self.vocab_size) if lib.llama_vocab_is_eog(self.vocab, t))
        self.precision = self._precision()
        self._template = self._chat_template()
        log.info("loaded %s on llama.cpp (%s, %d threads, %d cache cells)", self.name, self.precision,
                 threads, ctx_params.n_ctx)

    # -- facts -----------------------------------------------------------------------------------
    def _precision(self) -> str:
        """The GGUF file type's name (e.g. Q4_K_M), from the model's own description."""
        buf = ctypes.create_string_buffer(256)
        self.lib.llama_model_desc(self.model, buf, len(buf))
        desc = buf.value.decode("utf-8", "replace")  # e.g. "qwen2 0.5B Q4_K - Medium"
        known = {"Q4_K - Medium": "Q4_K_M", "Q4_K - Small": "Q4_K_S", "Q5_K - Medium": "Q5_K_M",
                 "Q6_K": "Q6_K", "Q8_0": "Q8_0", "Q4_0": "Q4_0", "Q4_1": "Q4_1", "F16": "F16", "BF16": "BF16"}
        for text, short in known.items():
            if desc.endswith(text):
                return short
        return desc.split(" ", 2)[-1] if " " in desc else desc

    # -- text ------------------------------------------------------------------------------------
    def _chat_template(self) -> Any:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        raw = self.lib.llama_model_chat_template(self.model, None)
        if not raw:
            raise EngineError(f"{self.name} has no chat template in its GGUF metadata; use an instruct model")

        def raise_exception(message: str) -> None:
            raise EngineError(f"{self.name}: chat template refused the messages: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        # tools' schemas and calls' arguments in their own order (the tool-call grammar keeps it)
        env.policies["json.dumps_kwargs"] = {"sort_keys": False, "ensure_ascii": False}
        env.globals["raise_exception"] = raise_exception
        return env.from_string(raw.decode("utf-8"))

    def chat_tokens(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None) -> list[int]:
        text = self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     tools=tools or None, bos_token="", eos_token="")
        return self._tokenize(text, special=True)

    def encode(self, text: str) -> list[int]:
        return self._tokenize(text, special=False)

    def _tokenize(self, text: str, special: bool) -> list[int]:
        data = text.encode("utf-8")
        size = len(data) + 16
        buf = (self.lib.llama_token * size)()
        n = self.lib.llama_tokenize(self.vocab, data, len(data), buf, size, False, special)
        if n < 0:
            size = -n
            buf = (self.lib.llama_token * size)()
            n = self.lib.llama_tokenize(self.vocab, data, len(data), buf, size, False, special)
        return list(buf[:n])

    def _piece(self, token: int, special: bool = False) -> bytes:
        key = token if not special else -1 - token
        piece = self._pieces.get(key)
        if piece is None:
            buf = ctypes.create_string_buffer(64)
            n = self.lib.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = self.lib.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
            piece = buf.raw[:n]
            self._pieces[key] = piece
        return piece

    def decode(self, ids: list[int]) -> str:
        return b"".join(self._piece(t) for t in ids).decode("utf-8", "replace")

    def token_texts(self) -> list[bytes]:
        return [self._piece(t, special=True) for t in range(self.vocab_size)]

    def token_bytes(self) -> list[bytes]:
        return [self._piece(t) for t in range(self.vocab_size)]

    def special_id(self, text: str) -> int | None:
        ids = self._tokenize(text, special=True)
        return ids[0] if len(ids) == 1 else None

    # -- sequences -------------------------------------------------------------------------------
    def new_state(self) -> LMState:
        if not self._free_seqs:
            raise EngineError(f"{self.name}: all {self.lib.llama_n_seq_max(self.ctx)} sequences are in use; "
                              "raise server.max_sessions (it sizes the cache) or end some calls")
        return LMState(cache=self._free_seqs.pop())

    def release(self, state: LMState) -> None:
        if state.cache is None:
            return
        self.lib.llama_memory_seq_rm(self.memory, state.cache, -1, -1)
        self._free_seqs.append(state.cache)
        state.cache = None
        state.tokens.clear()

    def extend(self, state: LMState, tokens: list[int], keep_logits: int = 1) -> Logits:
        if not tokens:
            raise EngineError("extend() needs at least one token")
        if keep_logits > min(len(tokens), self.batch_size):
            raise EngineError(f"cannot keep {keep_logits} logits from {len(tokens)} tokens")
        if len(state.tokens) + len(tokens) > self.context_tokens:
            raise EngineError(f"{self.name}: the conversation would hold {len(state.tokens) + len(tokens)} tokens, "
                              f"over llm.max_context_tokens = {self.context_tokens}")
        # Chunks of at most batch_size; the last one holds every position whose logits are kept.
        end = len(tokens)
        last_start = max(0, end - self.batch_size)
        start = 0
        while start < last_start:
            stop = min(start + self.batch_size, last_start)
            self._decode(state, tokens[start:stop], 0)
            start = stop
        return self._decode(state, tokens[last_start:], keep_logits)

    def _decode(self, state: LMState, tokens: list[int], keep_logits: int) -> Logits:
        batch, seq, base = self._batch, state.cache, len(state.tokens)
        n = len(tokens)
        batch.n_tokens = n
        for i, token in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = base + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = i >= n - keep_logits
        rc = self.lib.llama_decode(self.ctx, batch)
        if rc != 0:
            # Leave the sequence as it was: drop whatever part of the batch made it into the cache.
            self.lib.llama_memory_seq_rm(self.memory, seq, base, -1)
            reason = "the KV cache is full" if rc == 1 else f"llama_decode returned {rc}"
            raise EngineError(f"{self.name}: decoding {n} tokens failed: {reason}")
        state.tokens.extend(tokens)
        if not keep_logits:
            return np.empty((0, self.vocab_size), dtype=np.float32)
        ptr = self.lib.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(keep_logits, self.vocab_size)).copy()  # [keep, V]

    def truncate(self, state: LMState, length: int) -> None:
        drop = len(state.tokens) - length
        if drop < 0:
            raise EngineError(f"cannot truncate a cache of {len(state.tokens)} tokens to {length}")
        if drop:
            if not self.lib.llama_memory_seq_rm(self.memory, state.cache, length, -1):
                raise EngineError(f"{self.name}: llama.cpp could not remove positions {length}.. of a sequence")
            del state.tokens[length:]

    def prefill(self, state: LMState, prompt: list[int]) -> tuple[Logits, int]:
        common = common_prefix(state.tokens, prompt)
        prefix = self._best_prefix(prompt)
        if prefix is not None and len(prefix[0]) > common:
            tokens, seq = prefix
            self.lib.llama_memory_seq_rm(self.memory, state.cache, -1, -1)
            self.lib.llama_memory_seq_cp(self.memory, seq, state.cache, 0, len(tokens))
            state.tokens[:] = tokens
            common = len(tokens)
        common = min(common, len(prompt) - 1)
        self.truncate(state, common)
        return self.extend(state, prompt[common:])[-1], len(prompt) - common

    # -- shared prefixes -------------------------------------------------------------------------
    def _best_prefix(self, prompt: list[int]) -> tuple[list[int], int] | None:
        best: tuple[list[int], int] | None = None
        for tokens, seq in self._prefixes.items():
            if len(tokens) <= len(prompt) and tuple(prompt[: len(tokens)]) == tokens and (
                    best is None or len(tokens) > len(best[0])):
                best = (list(tokens), seq)
        if best is not None:
            self._prefixes.move_to_end(tuple(best[0]))
        return best

    def remember_prefix(self, tokens: list[int], pinned: bool = False) -> None:
        """Compute `tokens` once into a sequence of its own; prefill() copies it into sequences that
        start with it. Besides the pinned ones, `max_prefixes` are kept: the least recently used is
        forgotten for a new one."""
        key = tuple(tokens)
        if pinned and key in self._prefixes:
            self._pinned.add(key)
        if not tokens or key in self._prefixes or (self.max_prefixes <= 0 and not pinned):
            return
        unpinned = [k for k in self._prefixes if k not in self._pinned]  # least recently used first
        if not pinned and len(unpinned) >= self.max_prefixes:
            self.release(LMState(cache=self._prefixes.pop(unpinned[0])))
        state = self.new_state()
        try:
            self.extend(state, tokens)
        except EngineError:
            self.release(state)
            raise
        self._prefixes[key] = state.cache
        if pinned:
            self._pinned.add(key)

    def close(self) -> None:
        if self.ctx:
            self.lib.llama_batch_free(self._batch)
            self.lib.llama_free(self.ctx)
            self.lib.llama_model_free(self.model)
            self.ctx = None
            self.model = None
