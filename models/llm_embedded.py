"""The embedded LLM backend: a PyTorch model in this process, one worker thread, a KV cache per
conversation kept across turns, and a pluggable decoding strategy (plain, or speculative)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from models.generation import Decoder, Detokenizer, GenerationLoop, PlainDecoder
from models.protocols import ChatMessage, GenerationDone, GenerationStats, LLMOutput, SamplingParams, TextDelta
from models.torch_lm import LMState, TorchLM
from models.worker import ModelWorker
from pipeline.clock import Clock

log = logging.getLogger(__name__)


class SessionDecoding(Protocol):
    """Per-conversation decoding state (a draft model's cache, a K controller...)."""

    cap: int | None  # most tokens to draft per step (None: no limit)

    def decoder(self, state: LMState, params: SamplingParams, stats: GenerationStats) -> Decoder: ...


class DecodingStrategy(Protocol):
    method: str

    def new_session(self) -> SessionDecoding: ...


class PlainStrategy:
    method = "off"

    def __init__(self, lm: TorchLM) -> None:
        self.lm = lm

    def new_session(self) -> SessionDecoding:
        return PlainSession(self.lm)


class PlainSession:
    def __init__(self, lm: TorchLM) -> None:
        self.lm = lm
        self.cap: int | None = None

    def decoder(self, state: LMState, params: SamplingParams, stats: GenerationStats) -> Decoder:
        return PlainDecoder(self.lm, state, params, stats)


class EmbeddedLLM:
    """LanguageModel on the embedded engine."""

    def __init__(self, lm: TorchLM, clock: Clock, strategy: DecodingStrategy | None = None,
                 worker: ModelWorker | None = None) -> None:
        self.lm = lm
        self.clock = clock
        self.strategy: DecodingStrategy = strategy or PlainStrategy(lm)
        self.worker = worker or ModelWorker("llm")
        self.name = lm.name

    def conversation(self) -> EmbeddedConversation:
        return EmbeddedConversation(self, self.strategy.new_session())

    def warm_up(self) -> None:
        """Blocking: one short generation so the first caller does not pay for lazy initialisation."""
        state = self.lm.new_state()
        prompt = self.lm.chat_tokens([{"role": "user", "content": "Hi"}])
        self.lm.prefill(state, prompt)

    async def aclose(self) -> None:
        self.worker.shutdown()


class EmbeddedConversation:
    def __init__(self, llm: EmbeddedLLM, decoding: SessionDecoding) -> None:
        self.llm = llm
        self.decoding = decoding
        self.state = llm.lm.new_state()

    def _prompt(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> list[int]:
        return self.llm.lm.chat_tokens(
            [{"role": m.role, "content": m.content} for m in messages], add_generation_prompt
        )

    async def prepare(self, messages: Sequence[ChatMessage]) -> None:
        """Prefill the conversation so far (e.g. the system prompt at session start)."""
        prompt = self._prompt(messages, add_generation_prompt=False)
        if prompt:
            await self.llm.worker.run(self.llm.lm.prefill, self.state, prompt)

    async def stream(self, messages: Sequence[ChatMessage], params: SamplingParams) -> AsyncIterator[LLMOutput]:
        clock = self.llm.clock
        stats = GenerationStats()
        prompt = await self.llm.worker.run(self._prompt, messages)
        decoder = self.decoding.decoder(self.state, params, stats)
        loop = GenerationLoop(self.llm.lm, decoder, prompt, params, stats)
        detok = Detokenizer(self.llm.lm.tokenizer)
        started = clock.now()
        first = True
        while not loop.done:
            result = await self.llm.worker.run(loop.step)
            if first:
                stats.time_to_first_token_ms = (clock.now() - started) * 1000
                first = False
            text = detok.push(result.tokens)
            if text:
                yield TextDelta(text)
        stats.duration_ms = (clock.now() - started) * 1000
        yield GenerationDone(stats)

    def set_speculation_cap(self, cap: int | None) -> None:
        self.decoding.cap = cap

    async def aclose(self) -> None:
        self.state = self.llm.lm.new_state()
