"""The prompt's window over a long call: old messages leave in blocks, so the LLM's cache of the
prompt stays usable between blocks (checked on the engine itself, a tiny real model)."""

from __future__ import annotations

import asyncio
import itertools

from core.clock import MonotonicClock
from models.llm.llm_embedded import EmbeddedLLM
from models.protocols import ChatMessage, GenerationDone, SamplingParams
from pipeline.history import prompt_window
from tests.models.tiny import tiny_lm


def call(turns: int) -> list[ChatMessage]:
    history = [ChatMessage("system", "system")]
    for i in range(turns):
        history += [ChatMessage("user", f"w{10 + i % 40}"), ChatMessage("assistant", f"w{20 + i % 30}")]
    return history


def test_the_window_keeps_at_most_the_limit_and_moves_in_blocks() -> None:
    starts = []
    for turns in range(1, 40):
        history = call(turns)
        window = prompt_window(history, 8, 4)
        assert window[0] == history[0] and len(window) - 1 <= 8
        assert window[1].role == "user"
        starts.append(history.index(window[1]) if len(history) > 9 else 1)
    moves = sum(1 for a, b in itertools.pairwise(starts) if a != b)
    assert moves == (len(call(39)) - 1 - 8 + 3) // 4  # once every block of 4 messages, not every turn
    assert prompt_window(call(20), 8, 1)[1:] == tuple(call(20)[-8:])  # block 1: a sliding window


def test_block_trimming_keeps_the_prefix_cached_between_blocks() -> None:
    llm = EmbeddedLLM(tiny_lm(2), MonotonicClock())

    async def prefill_per_turn(block: int) -> list[int]:
        conversation = llm.conversation()
        history = [ChatMessage("system", "system")]
        prefilled = []
        for i in range(24):
            history.append(ChatMessage("user", f"w{10 + i % 40} w{11 + i % 40}"))
            async for out in conversation.stream(prompt_window(history, 12, block),
                                                 SamplingParams(temperature=0.0, max_tokens=3)):
                if isinstance(out, GenerationDone):
                    prefilled.append(out.stats.prefill_tokens)
            history.append(ChatMessage("assistant", f"w{20 + i % 30}"))
        await conversation.aclose()
        return prefilled

    sliding, blocks = asyncio.run(prefill_per_turn(1)), asyncio.run(prefill_per_turn(6))
    asyncio.run(llm.aclose())
    # once the window is full (turn 7 on), sliding recomputes the whole window every turn; blocks
    # only at the turns where a block of 6 messages (3 turns) leaves
    full = slice(7, None)
    print("prefill tokens per turn, sliding:", sliding, "blocks:", blocks)
    assert min(sliding[full]) > 30, sliding
    assert sum(1 for n in blocks[full] if n > 12) <= len(blocks[full]) // 3 + 1, blocks
    assert sum(sliding[full]) > 1.8 * sum(blocks[full]), (sliding, blocks)
