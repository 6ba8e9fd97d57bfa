"""The spoken budget: a reply said on a call ends at a sentence's end once it has said enough.

A caller cannot skim. "How do I reset my password?" got 54 s of numbered steps on the phone, although
the system prompt asks for one to three short sentences. The prompt is a request; this is the rule: at
the first sentence end where the reply has said `max_sentences` sentences or about `max_seconds` of
speech (its words at `words_per_second`), and more text is coming, the generation stops there and the
reply offers the rest ("Shall I go on?"): the caller can ask for it, and the history keeps what was said.

A sentence end is known only when the text after it begins (the mark must be followed by a space), so
a reply the model was about to end anyway is never cut and never gets the offer. A sentence longer than
the budget is said to its end: cutting it would leave the caller mid-phrase; `llm.max_tokens` bounds it.
"""

from __future__ import annotations

from pipeline.config import ReplyBudgetConfig
from pipeline.sentences import sentence_ends


class SpokenBudget:
    """Feed it the reply's text deltas in order: `take` says how much of each to pass on; once
    `spent`, the reply ends there (and says `config.offer`)."""

    def __init__(self, config: ReplyBudgetConfig) -> None:
        self.config = config
        self.text = ""
        self.spent = False

    def take(self, delta: str) -> str:
        """The part of `delta` the reply says: all of it, or, when the budget ends the reply inside
        it, the part up to the sentence end (possibly none); then `spent` is set."""
        if self.spent:
            return ""
        before = len(self.text)
        self.text += delta
        for count, end in enumerate(sentence_ends(self.text), 1):
            said = len(self.text[:end].split()) / self.config.words_per_second
            more = self.text[end:].strip() != ""
            if more and (count >= self.config.max_sentences or said >= self.config.max_seconds):
                self.spent = True
                self.text = self.text[:end]
                return self.text[before:] if end > before else ""
        return delta
