"""The spoken budget: a reply said on a call ends at a sentence's end once it has said enough.

A caller cannot skim. "How do I reset my password?" got 54 s of numbered steps on the phone, although
the system prompt asks for one to three short sentences. The prompt is a request; this is the rule: at
a sentence end, with more text coming, the reply stops when it has said `max_sentences` sentences,
or about `max_seconds` of speech (its words at `words_per_second`), or when one more sentence of its
own average length would pass that; then it offers the rest ("Shall I go on?"): the caller can ask
for it, and the history keeps what was said. A run-on sentence (a small model repeating a list) is
ended at its first clause mark past `max_seconds`, with a full stop.

A sentence end is known only when the text after it begins (the mark must be followed by a space), so
a reply the model was about to end anyway is never cut and never gets the offer; `llm.max_tokens`
still bounds a run-on without a clause mark.
"""

from __future__ import annotations

import re

from pipeline.config import ReplyBudgetConfig
from pipeline.sentences import CLAUSE_END, sentence_ends

_TRAILING_CLAUSE = re.compile(r"\s*(?:[,;:]+|\s[—–-]{1,2}|—)\s*$")


class SpokenBudget:
    """Feed it the reply's text deltas in order: `take` says how much of each to pass on; once
    `spent`, the reply ends there (and says `config.offer`)."""

    def __init__(self, config: ReplyBudgetConfig) -> None:
        self.config = config
        self.text = ""  # what the model wrote so far
        self.sent = 0  # how much of it was passed on
        self.spent = False

    def take(self, delta: str) -> str:
        """The text to pass on now: `delta`, less a clause mark held back past the budget (it may yet
        become the run-on's full stop), or, when the budget ends the reply, the rest up to its end
        (possibly nothing); then `spent`."""
        if self.spent:
            return ""
        self.text += delta
        config = self.config
        ends = sentence_ends(self.text)
        for count, end in enumerate(ends, 1):
            if not self.text[end:].strip():
                break  # nothing follows yet: the reply may be ending here
            said = len(self.text[:end].split()) / config.words_per_second
            if count >= config.max_sentences or said + said / count > config.max_seconds:
                return self._end(self.text[:end])
        start = ends[-1] if ends else 0
        for match in CLAUSE_END.finditer(self.text, start):
            said = len(self.text[:match.start()].split()) / config.words_per_second
            if said >= config.max_seconds and self.text[match.end():].strip():
                return self._end(self.text[:match.start()].rstrip() + ".")
        ready = len(self.text)
        if len(self.text.split()) / config.words_per_second >= config.max_seconds:
            held = _TRAILING_CLAUSE.search(self.text, start)
            ready = held.start() if held is not None else ready
        out, self.sent = self.text[self.sent:ready], max(self.sent, ready)
        return out

    def _end(self, said: str) -> str:
        self.spent = True
        out = said[self.sent:] if len(said) > self.sent else ""
        self.text, self.sent = said, len(said)
        return out
