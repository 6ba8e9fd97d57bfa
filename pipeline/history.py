"""Which part of a long conversation goes into the prompt.

A window that slides by one message every turn changes the prompt's start every turn, so the LLM's
cache of the conversation is useless past the system prompt and each turn prefills the whole
window again. Dropping old messages in blocks keeps the prompt's start still for a block's worth of
turns, and only the turn that drops a block pays for a full prefill.
"""

from __future__ import annotations

from collections.abc import Sequence

from models.protocols import ChatMessage


def prompt_window(history: Sequence[ChatMessage], limit: int, block: int) -> tuple[ChatMessage, ...]:
    """The system message (history[0]) and at most `limit` later messages: when more than `limit`
    have accumulated, the oldest are dropped in whole blocks of `block` messages (and then up to the
    next user message, so the kept part starts with the caller), so the kept part's start moves once
    every `block` messages. block 1 is a window sliding a message at a time."""
    system, turns = history[0], list(history[1:])
    if len(turns) > limit:
        excess = len(turns) - limit
        drop = -(-excess // block) * block  # whole blocks
        while drop < len(turns) and turns[drop].role != "user":
            drop += 1
        turns = turns[drop:]
    return (system, *turns)
