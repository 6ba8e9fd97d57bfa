"""The embedded engine's KV cache on llama.cpp (the packs' SmolLM2-135M-Instruct, Q4_1, small and
fast): /v1 generations have room of their own and cannot crowd out a call, and the default system
prompt's remembered cache is never forgotten for callers' own instructions."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from core.clock import MonotonicClock
from core.errors import ContextLengthError
from models.config import LlmConfig, SpeculativeConfig
from models.llm.llama_cpp_lm import LlamaCppLM
from models.llm.llm_embedded import EmbeddedConversation, EmbeddedLLM
from models.llm.llm_factory import load_embedded
from models.packs.cache import resolve_gguf
from models.protocols import ChatMessage, SamplingParams

pytestmark = pytest.mark.slow

PACK = "smollm2-135m-instruct-q4_1"
GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


def messages_of(lm: LlamaCppLM, tokens: int) -> list[ChatMessage]:
    """A user message whose chat prompt is about `tokens` long (at most that)."""
    words = ["apple"]
    while len(lm.chat_tokens([{"role": "user", "content": " ".join([*words, "apple"])}])) <= tokens:
        words.append("apple")
    return [ChatMessage("user", " ".join(words))]


async def generate(conversation: EmbeddedConversation, messages: list[ChatMessage]) -> None:
    async for _ in conversation.stream(messages, GREEDY):
        pass


@pytest.fixture
def engine() -> Iterator[EmbeddedLLM]:
    config = LlmConfig(model=PACK, max_context_tokens=256, api_context_tokens=128, threads=2,
                       speculative=SpeculativeConfig(method="off"))
    llm = load_embedded(config, MonotonicClock(), sequences=1, api_sequences=4)
    yield llm
    llm.worker.shutdown()
    llm.lm.close()  # type: ignore[attr-defined]


async def test_v1_generations_at_their_bound_leave_a_call_its_room(engine: EmbeddedLLM) -> None:
    """Four /v1 generations at their bound hold 4 x 128 cells; a call at its own bound still fits (a
    cache sized for the calls alone, 2 x 256 cells, was full here)."""
    lm = engine.lm
    assert isinstance(lm, LlamaCppLM)
    api = [engine.conversation(128) for _ in range(4)]
    for conversation in api:  # each kept open: its cells stay taken
        await generate(conversation, messages_of(lm, 120))
    call = engine.conversation()
    await generate(call, messages_of(lm, 248))
    with pytest.raises(ContextLengthError, match=r"llm\.api_context_tokens"):
        await generate(engine.conversation(128), messages_of(lm, 200))  # a /v1 prompt over its bound: refused
    for conversation in [*api, call]:
        await conversation.aclose()


def test_the_default_system_prompt_is_not_forgotten_for_callers_instructions() -> None:
    lm = LlamaCppLM(resolve_gguf(PACK), threads=2, context_tokens=512, sequences=2, max_prefixes=2, name=PACK)
    llm = EmbeddedLLM(lm, MonotonicClock())
    try:
        default = "You are a helpful voice assistant."
        llm.warm_up(default)

        async def instructions(text: str) -> None:  # a call that brings its own (session.start's instructions)
            conversation = llm.conversation()
            await conversation.prepare([ChatMessage("system", text)])
            await conversation.aclose()

        for n in range(4):
            asyncio.run(instructions(f"You are assistant number {n}; answer in one word."))
        system = lm.chat_tokens([{"role": "system", "content": default}], add_generation_prompt=False)
        prompt = lm.chat_tokens([{"role": "system", "content": default}, {"role": "user", "content": "Hi"}])
        state = lm.new_state()
        _, computed = lm.prefill(state, prompt)
        lm.release(state)
        assert computed == len(prompt) - len(system)  # copied from the remembered prefix, not computed
    finally:
        llm.worker.shutdown()
        lm.close()


async def test_every_call_slot_taken_twice_over_gets_its_conversation_and_weigher() -> None:
    """A caller who hangs up frees the call's slot at once, and one who redials takes it, while the
    hung-up call's clean-up (up to seconds) still holds its sequences: its conversation and its
    end-of-turn weigher's. With server.max_sessions 8, sixteen calls' two conversations each must
    all get a sequence (28 ids, sized for one per call, ran out here: 'all 28 sequences are in use')."""
    config = LlmConfig(model=PACK, max_context_tokens=256, api_context_tokens=128, threads=2,
                       speculative=SpeculativeConfig(method="off"))
    engine = load_embedded(config, MonotonicClock(), sequences=8, api_sequences=4)
    try:
        lm = engine.lm
        assert isinstance(lm, LlamaCppLM)
        conversations = [engine.conversation() for _ in range(2 * 8 * 2)]  # (live + hung up) x (reply + weigher)
        for conversation in conversations:  # each kept open: its sequence stays taken
            await generate(conversation, [ChatMessage("user", "Hi")])
        api = [engine.conversation(128) for _ in range(4)]  # and every /v1 generation slot besides
        for conversation in api:
            await generate(conversation, [ChatMessage("user", "Hi")])
        for conversation in [*conversations, *api]:
            await conversation.aclose()
    finally:
        engine.worker.shutdown()
        engine.lm.close()  # type: ignore[attr-defined]


async def test_a_closing_conversation_goes_first_and_frees_its_sequence_even_if_its_caller_is_cancelled(
        engine: EmbeddedLLM) -> None:
    """A hung-up call's clean-up gives its sequence back ahead of the live calls' steps, and the
    job runs even when the clean-up is cut short (a call's stop waits 5 s, then cancels it): it once
    waited behind every live call's step and, cancelled, was dropped, and the sequence was lost."""
    lm = engine.lm
    assert isinstance(lm, LlamaCppLM)
    conversation = engine.conversation()
    await generate(conversation, [ChatMessage("user", "Hi")])
    held = len(lm._free_seqs)
    gate, busy = threading.Event(), threading.Event()

    def hold() -> None:
        busy.set()
        gate.wait()

    engine.worker.submit(None, hold)  # the worker busy: what comes next queues behind it
    # ... once it has taken that job: a job still queued with no deadline comes after the live call's step, which
    # then ran before the close was queued (15 free sequences seen, not 16, in one fresh-clone run)
    assert busy.wait(30)
    seen: list[int] = []
    step = engine.worker.submit(engine.clock.now() + 60, lambda: seen.append(len(lm._free_seqs)))  # a live call's
    closing = asyncio.create_task(conversation.aclose())
    await asyncio.sleep(0)  # it has queued its job
    closing.cancel()
    gate.set()
    await asyncio.wrap_future(step)
    assert seen == [held + 1]  # freed before the live call's step, though its caller was cancelled
