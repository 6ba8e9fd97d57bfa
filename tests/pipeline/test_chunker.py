import asyncio
from collections.abc import AsyncGenerator

from core.clock import MonotonicClock
from pipeline.chunker import PhraseChunker, chunk_stage, speakable
from pipeline.config import ChunkerConfig
from pipeline.events import Phrase, ReplyEvent, ReplyFinished, ReplyText


def feed(text: str, step: int = 3, config: ChunkerConfig | None = None) -> list[str]:
    chunker = PhraseChunker(config or ChunkerConfig())
    out: list[str] = []
    for i in range(0, len(text), step):
        out += chunker.push(text[i:i + step])
    return out + chunker.flush()


def test_first_phrase_ends_at_the_first_clause_with_enough_words() -> None:
    phrases = feed("Of course, I can book that table for you tonight at eight.")
    assert phrases[0] == "Of course,"
    assert phrases[1] == "I can book that table for you tonight at eight."


def test_single_word_clause_waits_for_more_words() -> None:
    assert feed("Sure, that works.")[0] == "Sure, that works."


def test_sentences_are_cut_and_abbreviations_and_decimals_are_not() -> None:
    phrases = feed("Dr. Smith paid 3.5 dollars. Then he left! Did he? Yes.", config=ChunkerConfig(first_max_words=8))
    assert phrases == ["Dr. Smith paid 3.5 dollars.", "Then he left!", "Did he?", "Yes."]


def test_later_phrases_need_min_words_before_a_clause_cut() -> None:
    text = "Okay, so your order is two pizzas, one large and one small, with extra cheese on both of them."
    phrases = feed(text, config=ChunkerConfig(first_max_words=10))
    assert phrases[0] == "Okay, so your order is two pizzas,"
    assert phrases[1] == "one large and one small, with extra cheese on both of them."
    assert " ".join(phrases) == text


def test_a_long_first_sentence_is_cut_after_a_few_words_at_a_clause_if_there_is_one() -> None:
    text = "I would be happy to help you find a nice restaurant in the city center tonight."
    phrases = feed(text)
    assert phrases[0] == "I would be happy"  # first_max_words=4: the first audio does not wait for the sentence
    assert phrases[1] == "to help you find a nice restaurant in the city center tonight."
    assert feed("Okay, so your order is two pizzas.")[0] == "Okay,"  # the clause mark within the limit


def test_run_on_text_is_cut_at_a_word_boundary() -> None:
    text = " ".join(f"word{i}" for i in range(30))
    phrases = feed(text, config=ChunkerConfig(max_words=10))
    assert all(len(p.split()) <= 10 for p in phrases)
    assert " ".join(phrases) == text


def test_whole_chunks_and_no_text_lost() -> None:
    text = "First: we check in. Second, we, um, wait; then — finally — we go home.\nNew line here"
    for step in (1, 2, 5, 100):
        assert " ".join(feed(text, step)).split() == text.split()


def test_speakable_strips_markdown_and_emoji() -> None:
    assert speakable("**Bold** and `code` 🎉 see https://x.y/z") == "Bold and code see a link"
    assert speakable("- one\n- two") == "one two"


def test_a_list_items_number_is_not_a_phrase_of_its_own_and_is_said_as_a_sequence_word() -> None:
    text = "To reset it:\n1. Open settings.\n2. Tap account.\n12. Confirm."
    phrases = feed(text, config=ChunkerConfig(first_max_words=8))
    assert phrases == ["To reset it:", "1. Open settings.", "2. Tap account.", "12. Confirm."]
    assert [speakable(p) for p in phrases[1:]] == ["First, Open settings.", "Second, Tap account.", "Next, Confirm."]
    assert speakable("It costs 3.5 dollars, 2 of them.") == "It costs 3.5 dollars, 2 of them."


def test_phrases_completed_by_one_delta_are_numbered_in_order() -> None:
    async def run() -> list[Phrase]:
        clock = MonotonicClock()

        async def events() -> AsyncGenerator[ReplyEvent, None]:
            yield ReplyText(1, "Hello there. How are you today? ", clock.now())
            yield ReplyText(1, "Fine.", clock.now())
            yield ReplyFinished(1, None, clock.now())

        return [e async for e in chunk_stage(events(), ChunkerConfig(first_max_words=8), clock)
                if isinstance(e, Phrase)]

    phrases = asyncio.run(run())
    assert [(p.index, p.text) for p in phrases] == [(0, "Hello there."), (1, "How are you today?"), (2, "Fine.")]
