"""The spoken budget (pipeline/reply_budget.py) and the sentence ends it counts (pipeline/sentences.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence

from core.clock import MonotonicClock
from models.llm.tool_calls import Tools
from models.protocols import ChatMessage, GenerationDone, GenerationStats, LLMOutput, SamplingParams, TextDelta
from pipeline.config import ReplyBudgetConfig
from pipeline.events import ReplyFinished, ReplyRequest, ReplyText
from pipeline.llm_stage import llm_stage
from pipeline.reply_budget import SpokenBudget
from pipeline.sentences import sentence_ends


def said(text: str, config: ReplyBudgetConfig, step: int = 3) -> tuple[str, bool]:
    budget = SpokenBudget(config)
    out = "".join(budget.take(text[i:i + step]) for i in range(0, len(text), step))
    return out.rstrip(), budget.spent  # a space after the last mark may have gone out before the cut


def test_sentence_ends_skip_abbreviations_initials_decimals_and_list_numbers() -> None:
    text = "Dr. Smith paid 3.5 dollars. Here are the steps:\n1. Open the app.\n2. Tap J. Reset. Done! Ok"
    ends = [text[:e].rsplit(None, 1)[-1] for e in sentence_ends(text)]
    assert ends == ["dollars.", "steps:", "app.", "Reset.", "Done!"]
    other = "I have 2. Then I left. "
    assert [other[:e].rsplit(None, 1)[-1] for e in sentence_ends(other)] == ["2.", "left."]


def test_a_reply_stops_after_its_sentences_when_more_would_follow() -> None:
    text = "One two. Three four? Five six! Seven eight. Nine."
    for step in (1, 2, 3, 7, 100):
        assert said(text, ReplyBudgetConfig(max_sentences=3), step) == ("One two. Three four? Five six!", True)


def test_a_reply_that_ends_at_its_budget_is_not_cut() -> None:
    assert said("One two. Three four? Five six!", ReplyBudgetConfig(max_sentences=3)) == (
        "One two. Three four? Five six!", False)
    assert said("One two. Three four? Five six! ", ReplyBudgetConfig(max_sentences=3)) == (
        "One two. Three four? Five six!", False)  # a space after the last mark and then the end


def test_the_spoken_length_ends_a_reply_where_one_more_sentence_would_pass_it() -> None:
    config = ReplyBudgetConfig(max_sentences=10, max_seconds=4.0, words_per_second=2.0)  # 8 words
    text = "One two three. Four five six seven. Eight nine."
    # 1.5 s said, one more like it: 3 s, within; 3.5 s said, one more of 1.75 s would pass 4 s
    assert said(text, config) == ("One two three. Four five six seven.", True)
    long_first = "One two three four five six seven eight nine. Ten eleven."
    assert said(long_first, config) == ("One two three four five six seven eight nine.", True)


def test_a_run_on_sentence_ends_at_its_first_clause_past_the_budget_with_a_full_stop() -> None:
    config = ReplyBudgetConfig(max_sentences=3, max_seconds=4.0, words_per_second=2.0)
    text = "Pack a towel, a hat, sunscreen, a towel, a hat, sunscreen, a towel, a hat"
    for step in (1, 4, 100):
        assert said(text, config, step) == ("Pack a towel, a hat, sunscreen, a towel.", True)
    assert said("Pack a towel a hat sunscreen a towel a hat and more", config) == (
        "Pack a towel a hat sunscreen a towel a hat and more", False)  # no mark: llm.max_tokens bounds it


def test_a_numbered_list_counts_its_items_as_sentences_not_its_numbers() -> None:
    text = "To reset it:\n1. Open settings.\n2. Tap account.\n3. Tap reset.\n4. Confirm."
    assert said(text, ReplyBudgetConfig(max_sentences=3)) == ("To reset it:\n1. Open settings.\n2. Tap account.", True)


class FakeConversation:
    """A fake LLM conversation (named as one): streams a fixed reply, word by word, and records
    whether its generation was stopped early."""

    def __init__(self, reply: str) -> None:
        self.reply = reply
        self.closed_early = False
        self.last_stats = GenerationStats(completion_tokens=0)

    async def stream(self, messages: Sequence[ChatMessage], params: SamplingParams,
                     tools: Tools | None = None) -> AsyncGenerator[LLMOutput, None]:
        words = self.reply.split(" ")
        done = False
        try:
            for i, word in enumerate(words):
                self.last_stats.completion_tokens += 1
                yield TextDelta(word if i == 0 else " " + word)
            done = True
        finally:
            self.closed_early = not done
        yield GenerationDone(self.last_stats)


async def run_stage(reply: str, budget: ReplyBudgetConfig | None) -> tuple[list[object], FakeConversation]:
    conversation = FakeConversation(reply)

    async def one() -> AsyncGenerator[ReplyRequest, None]:
        yield ReplyRequest(1, (ChatMessage("user", "How do I reset my password?"),), 0.0)

    stage = llm_stage(one(), conversation, SamplingParams(), MonotonicClock(), budget)  # type: ignore[arg-type]
    return [event async for event in stage], conversation


def test_the_llm_stage_stops_the_generation_and_offers_the_rest() -> None:
    reply = "Open settings. Tap account. Tap reset. Then confirm it by mail. And wait."
    events, conversation = asyncio.run(run_stage(reply, ReplyBudgetConfig(max_sentences=3)))
    text = "".join(e.text for e in events if isinstance(e, ReplyText))
    assert text == "Open settings. Tap account. Tap reset. Shall I go on?"
    assert conversation.closed_early  # no token is generated for nobody
    finished = [e for e in events if isinstance(e, ReplyFinished)]
    assert len(finished) == 1 and finished[0].stats is not None and finished[0].stats.finish_reason == "spoken_budget"
    assert finished[0].error is None


def test_without_a_budget_or_under_it_the_reply_is_whole() -> None:
    reply = "Open settings. Tap account. Tap reset. Then confirm it by mail. And wait."
    for budget in (None, ReplyBudgetConfig(enabled=False), ReplyBudgetConfig(max_sentences=9, max_seconds=60)):
        events, conversation = asyncio.run(run_stage(reply, budget))
        assert "".join(e.text for e in events if isinstance(e, ReplyText)) == reply
        assert not conversation.closed_early
        finished = [e for e in events if isinstance(e, ReplyFinished)]
        assert len(finished) == 1 and finished[0].stats is not None and finished[0].stats.finish_reason == "stop"


def test_an_empty_offer_says_nothing_more() -> None:
    reply = "One. Two. Three. Four."
    events, _ = asyncio.run(run_stage(reply, ReplyBudgetConfig(max_sentences=2, offer="")))
    assert "".join(e.text for e in events if isinstance(e, ReplyText)) == "One. Two."
