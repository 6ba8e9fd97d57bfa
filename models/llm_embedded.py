"""The embedded LLM backend: a model in this process (llama.cpp by default, or PyTorch), one worker
thread, a KV cache per conversation kept across turns, and a pluggable decoding strategy (plain, or
speculative)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Sequence
from dataclasses import replace
from typing import Protocol

from core.clock import Clock
from core.errors import ContextLengthError
from core.worker import ModelWorker
from models.generation import Decoder, Detokenizer, GenerationLoop, PlainDecoder
from models.lm import CausalLM, LMState
from models.protocols import ChatMessage, GenerationDone, GenerationStats, LLMOutput, SamplingParams, TextDelta

log = logging.getLogger(__name__)


class SessionDecoding(Protocol):
    """Per-conversation decoding state (a draft model's cache, a K controller...)."""

    cap: int | None  # most tokens to draft per step (None: no limit)

    def decoder(self, state: LMState, params: SamplingParams, stats: GenerationStats) -> Decoder: ...

    def close(self) -> None: ...


class DecodingStrategy(Protocol):
    method: str

    def new_session(self) -> SessionDecoding: ...


class PlainStrategy:
    method = "off"

    def __init__(self, lm: CausalLM) -> None:
        self.lm = lm

    def new_session(self) -> SessionDecoding:
        return PlainSession(self.lm)


class PlainSession:
    def __init__(self, lm: CausalLM) -> None:
        self.lm = lm
        self.cap: int | None = None

    def decoder(self, state: LMState, params: SamplingParams, stats: GenerationStats) -> Decoder:
        return PlainDecoder(self.lm, state, params, stats)

    def close(self) -> None:
        pass


class EmbeddedLLM:
    """LanguageModel on the embedded engine."""

    def __init__(self, lm: CausalLM, clock: Clock, strategy: DecodingStrategy | None = None,
                 worker: ModelWorker | None = None, max_context_tokens: int = 4096) -> None:
        self.lm = lm
        self.max_context_tokens = max_context_tokens
        self.clock = clock
        self.strategy: DecodingStrategy = strategy or PlainStrategy(lm)
        self.worker = worker or ModelWorker("llm", priority="background")
        self.name = lm.name

    def conversation(self) -> EmbeddedConversation:
        return EmbeddedConversation(self, self.strategy.new_session())

    def warm_up(self, system_prompt: str | None = None) -> None:
        """Blocking: compute the default system prompt once for the whole process (each new call
        copies its cache instead of computing it), then one short prefill so the first caller does
        not pay for lazy initialisation."""
        if system_prompt:
            self.lm.remember_prefix(self.lm.chat_tokens([{"role": "system", "content": system_prompt}],
                                                        add_generation_prompt=False))
        state = self.lm.new_state()
        try:
            self.lm.prefill(state, self.lm.chat_tokens([{"role": "user", "content": "Hi"}]))
        finally:
            self.lm.release(state)

    async def aclose(self) -> None:
        self.worker.shutdown()


class EmbeddedConversation:
    def __init__(self, llm: EmbeddedLLM, decoding: SessionDecoding) -> None:
        self.llm = llm
        self.decoding = decoding
        self.state: LMState | None = None
        self.last_stats: GenerationStats | None = None  # the latest generation's, even one stopped early

    def _state(self) -> LMState:
        """The conversation's sequence, made on first use (on the worker thread)."""
        if self.state is None:
            self.state = self.llm.lm.new_state()
        return self.state

    def _prompt(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> list[int]:
        return self.llm.lm.chat_tokens(
            [{"role": m.role, "content": m.content} for m in messages], add_generation_prompt
        )

    def _prepare(self, messages: Sequence[ChatMessage]) -> None:
        prompt = self._prompt(messages, add_generation_prompt=False)
        if prompt:
            if [m.role for m in messages] == ["system"]:
                self.llm.lm.remember_prefix(prompt)
            self.llm.lm.prefill(self._state(), prompt)

    async def prepare(self, messages: Sequence[ChatMessage]) -> None:
        """Prefill the conversation so far (e.g. the system prompt at session start: a copy of the
        process's cache of it when it is the one computed before)."""
        await self.llm.worker.run(self._prepare, messages)

    async def stream(self, messages: Sequence[ChatMessage], params: SamplingParams) -> AsyncGenerator[LLMOutput, None]:
        clock = self.llm.clock
        stats = GenerationStats()
        prompt = await self.llm.worker.run(self._prompt, messages)
        limit = self.llm.max_context_tokens
        if len(prompt) + 1 > limit:
            raise ContextLengthError(f"the prompt has {len(prompt)} tokens; this model's context holds {limit} "
                                     "(llm.max_context_tokens): shorten the messages")
        params = replace(params, max_tokens=min(params.max_tokens, limit - len(prompt)))
        state = await self.llm.worker.run(self._state)
        decoder = self.decoding.decoder(state, params, stats)
        loop = GenerationLoop(self.llm.lm, decoder, prompt, params, stats)
        detok = Detokenizer(self.llm.lm)
        started = clock.now()
        first = True
        self.last_stats = stats
        try:
            while not loop.done:
                result = await self.llm.worker.run(loop.step)
                if first:
                    stats.time_to_first_token_ms = (clock.now() - started) * 1000
                    first = False
                text = detok.push(result.tokens)
                if text:
                    yield TextDelta(text)
        finally:  # also when the caller stops early (a stop string, a barge-in): the stats are real
            stats.duration_ms = (clock.now() - started) * 1000
            if not loop.done:
                stats.finish_reason = "cancelled"
        yield GenerationDone(stats)

    def set_speculation_cap(self, cap: int | None) -> None:
        self.decoding.cap = cap

    def _close(self) -> None:
        self.decoding.close()
        if self.state is not None:
            self.llm.lm.release(self.state)
            self.state = None

    async def aclose(self) -> None:
        # RuntimeError: the worker has shut down with the whole engine, and nothing is left to free.
        with contextlib.suppress(RuntimeError):
            await self.llm.worker.run(self._close)
