"""The LLM stage: a reply request in, the reply's text out as it streams, then ReplyFinished."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable

from core.clock import Clock
from core.errors import VoiceAgentError
from models.protocols import Conversation, GenerationDone, SamplingParams, TextDelta, ToolCallDelta, ToolCallOutput
from pipeline.config import ReplyBudgetConfig
from pipeline.events import ReplyEvent, ReplyFinished, ReplyRequest, ReplyText, ReplyToolCall, ReplyToolCallDelta
from pipeline.reply_budget import SpokenBudget

log = logging.getLogger(__name__)


async def llm_stage(
    requests: AsyncIterator[ReplyRequest],
    conversation: Conversation,
    params: SamplingParams,
    clock: Clock,
    budget: ReplyBudgetConfig | None = None,
    acknowledgement: Callable[[str], str] | None = None,
) -> AsyncGenerator[ReplyEvent, None]:
    """`budget`: a spoken reply's limit (pipeline/reply_budget.py); once spent, the generation stops
    at the sentence's end, the offer is said, and the stats' finish_reason is "spoken_budget".
    `acknowledgement`: what is said (given the tool's name; "" for nothing) the moment the reply
    begins a tool call before any word of its own. A request whose last message is unfinished (the words
    the reply must begin with) has those words said first, then the model's."""
    async for request in requests:
        produced = said = acked = called = False
        spoken = SpokenBudget(budget) if budget is not None and budget.enabled else None
        try:
            begun = request.messages[-1] if request.messages and request.messages[-1].unfinished else None
            if begun is not None:  # the words the reply begins with (pipeline/honesty.py); the model goes on
                text = begun.content if spoken is None else spoken.take(begun.content)
                if text:
                    produced = said = True
                    yield ReplyText(request.turn_id, text, clock.now())
            # Closed with this stage (a barge-in): the generation stops at once, not when collected.
            async with contextlib.aclosing(conversation.stream(request.messages, params, request.tools)) as outputs:
                async for output in outputs:
                    if isinstance(output, TextDelta):
                        text = output.text if spoken is None else spoken.take(output.text)
                        if text:
                            produced = said = True
                            yield ReplyText(request.turn_id, text, clock.now())
                        if spoken is not None and spoken.spent:
                            break  # closing the stream stops the generation
                        continue
                    if isinstance(output, ToolCallDelta | ToolCallOutput) and acknowledgement and not said:
                        said = True  # a call begins before any word: the caller hears this meanwhile
                        name = output.name if isinstance(output, ToolCallDelta) else output.call.name
                        ack = acknowledgement(name)
                        if ack:  # with a space after it: a whole sentence, cut as a phrase and said now
                            acked = True
                            yield ReplyText(request.turn_id, ack.strip() + " ", clock.now())
                    if isinstance(output, ToolCallDelta):
                        yield ReplyToolCallDelta(request.turn_id, output.call_id, output.name, output.delta)
                    elif isinstance(output, ToolCallOutput):
                        produced = called = True
                        yield ReplyToolCall(request.turn_id, output.call, clock.now())
                    elif isinstance(output, GenerationDone):
                        # "One moment." and then no call (cut off at the token limit): the caller must not wait
                        unkept = ("engine_error: the reply began a tool call and did not finish it"
                                  if acked and not called else None)
                        yield ReplyFinished(request.turn_id, output.stats, clock.now(), error=unkept)
            if spoken is not None and spoken.spent:
                log.info("turn %d: the reply stopped at its spoken budget (session.reply_budget: %d sentences, "
                         "%.0f s)", request.turn_id, spoken.config.max_sentences, spoken.config.max_seconds)
                if spoken.config.offer:
                    yield ReplyText(request.turn_id, " " + spoken.config.offer, clock.now())
                stats = getattr(conversation, "last_stats", None)  # the embedded engine's; None for a server's
                if stats is not None:
                    stats.finish_reason = "spoken_budget"
                yield ReplyFinished(request.turn_id, stats, clock.now())
        except VoiceAgentError as exc:
            log.warning("turn %d: LLM failed after %s text: %s", request.turn_id,
                        "some" if produced else "no", exc)
            yield ReplyFinished(request.turn_id, None, clock.now(), error=f"{exc.code}: {exc}")
