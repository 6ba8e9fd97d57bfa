"""The phrase chunker: cuts streamed reply text into phrases a synthesizer can speak at once.

The first phrase ends at the first natural clause, or after `first_max_words` words at the latest
(so the first audio comes early), later ones at sentence ends or at clauses once they are long
enough; a run-on is cut at a word boundary.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import AsyncGenerator, AsyncIterator

from core.clock import Clock
from pipeline.config import ChunkerConfig
from pipeline.events import Phrase, ReplyEvent, ReplyFinished, ReplyText
from pipeline.sentences import CLAUSE_END, SENTENCE_END, is_abbreviation, is_list_number


def _words(text: str) -> int:
    return len(text.split())


class PhraseChunker:
    def __init__(self, config: ChunkerConfig) -> None:
        self.config = config
        self.buffer = ""
        self.count = 0  # phrases cut so far

    def push(self, text: str) -> list[str]:
        self.buffer += text
        phrases = []
        while (cut := self._next_cut()) is not None:
            phrase, self.buffer = self.buffer[:cut].strip(), self.buffer[cut:].lstrip()
            if phrase:
                phrases.append(phrase)
                self.count += 1
        return phrases

    def flush(self) -> list[str]:
        phrase, self.buffer = self.buffer.strip(), ""
        if phrase:
            self.count += 1
            return [phrase]
        return []

    def _next_cut(self) -> int | None:
        text = self.buffer
        min_words = self.config.first_min_words if self.count == 0 else self.config.min_words
        for match in SENTENCE_END.finditer(text):
            if (not is_abbreviation(text, match.start()) and not is_list_number(text, match.start())
                    and _words(text[: match.end()]) >= 1):
                return match.end()
        for match in CLAUSE_END.finditer(text):
            if _words(text[: match.start()]) >= min_words:
                return match.end()
        limit = min(self.config.first_max_words, self.config.max_words) if self.count == 0 else self.config.max_words
        if _words(text) > limit:
            # cut after the last complete word that keeps the phrase within the limit, or for the first
            # phrase at a clause mark before it ("Okay, | so your order is...")
            spans = [m.end() for m in re.finditer(r"\S+(?=\s)", text)]
            if len(spans) < limit:
                return None
            if self.count == 0:
                marks = [m.end() for m in CLAUSE_END.finditer(text) if m.end() <= spans[limit - 1]]
                if marks:
                    return marks[-1]
            return spans[limit - 1]
        return None


_MARKDOWN = re.compile(r"[*_#`>|~]+|^\s*[-•]\s+", re.MULTILINE)
_LIST_ITEM = re.compile(r"^(\s*)(\d{1,2})[.)]\s+", re.MULTILINE)
_URL = re.compile(r"https?://\S+")
ORDINALS = ("First", "Second", "Third", "Fourth", "Fifth", "Sixth", "Seventh", "Eighth", "Ninth", "Tenth")


def _sequence_word(match: re.Match[str]) -> str:
    """A list item's number said as a speaker would: "2. Tap reset" -> "Second, tap reset"."""
    number = int(match.group(2))
    return f"{match.group(1)}{ORDINALS[number - 1] if 1 <= number <= len(ORDINALS) else 'Next'}, "


def speakable(text: str) -> str:
    """Text a synthesizer should say: no markdown marks, list bullets, URLs or emoji; a numbered
    list item starts with its sequence word."""
    text = _URL.sub("a link", text)
    text = _LIST_ITEM.sub(_sequence_word, text)
    text = _MARKDOWN.sub(" ", text)
    text = "".join(ch for ch in text if unicodedata.category(ch) not in ("So", "Cs", "Co", "Cn"))
    return " ".join(text.split())


async def chunk_stage(
    events: AsyncIterator[ReplyEvent], config: ChunkerConfig, clock: Clock
) -> AsyncGenerator[ReplyEvent, None]:
    """ReplyText in (passed on), Phrase out as each phrase completes; flushes at ReplyFinished."""
    chunker = PhraseChunker(config)
    turn_id = 0

    def phrases(texts: list[str]) -> list[Phrase]:
        """Numbered in order: several can complete at once (a delta with two sentence ends)."""
        first = chunker.count - len(texts)
        return [Phrase(turn_id, first + i, text, speakable(text), clock.now()) for i, text in enumerate(texts)]

    async for event in events:
        if isinstance(event, ReplyText):
            turn_id = event.turn_id
            yield event
            for phrase in phrases(chunker.push(event.text)):
                yield phrase
        elif isinstance(event, ReplyFinished):
            turn_id = event.turn_id
            for phrase in phrases(chunker.flush()):
                yield phrase
            yield event
        else:
            yield event
