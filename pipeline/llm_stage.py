"""The LLM stage: a reply request in, the reply's text out as it streams, then ReplyFinished."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator

from core.clock import Clock
from core.errors import VoiceAgentError
from models.protocols import Conversation, GenerationDone, SamplingParams, TextDelta, ToolCallDelta, ToolCallOutput
from pipeline.events import ReplyEvent, ReplyFinished, ReplyRequest, ReplyText, ReplyToolCall, ReplyToolCallDelta

log = logging.getLogger(__name__)


async def llm_stage(
    requests: AsyncIterator[ReplyRequest],
    conversation: Conversation,
    params: SamplingParams,
    clock: Clock,
) -> AsyncGenerator[ReplyEvent, None]:
    async for request in requests:
        produced = False
        try:
            # Closed with this stage (a barge-in): the generation stops at once, not when collected.
            async with contextlib.aclosing(conversation.stream(request.messages, params, request.tools)) as outputs:
                async for output in outputs:
                    if isinstance(output, TextDelta):
                        produced = True
                        yield ReplyText(request.turn_id, output.text, clock.now())
                    elif isinstance(output, ToolCallDelta):
                        yield ReplyToolCallDelta(request.turn_id, output.call_id, output.name, output.delta)
                    elif isinstance(output, ToolCallOutput):
                        produced = True
                        yield ReplyToolCall(request.turn_id, output.call, clock.now())
                    elif isinstance(output, GenerationDone):
                        yield ReplyFinished(request.turn_id, output.stats, clock.now())
        except VoiceAgentError as exc:
            log.warning("turn %d: LLM failed after %s text: %s", request.turn_id,
                        "some" if produced else "no", exc)
            yield ReplyFinished(request.turn_id, None, clock.now(), error=f"{exc.code}: {exc}")
