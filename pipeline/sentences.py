"""Where sentences end in a reply's text, for the phrase chunker and the spoken budget: a mark
followed by a space or a line break, not an abbreviation's dot, an initial's, or a list item's number."""

from __future__ import annotations

import re

SENTENCE_END = re.compile(r"[.!?…]+[\"')\]”’]*(?=\s)|\n+")
ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "st", "jr", "sr", "vs", "etc", "e.g", "i.e", "prof", "no", "approx", "inc", "ltd",
}
CLAUSE_END = re.compile(r"[,;:]+(?=\s)|\s[—–-]{1,2}(?=\s)|—")
_LIST_NUMBER = re.compile(r"(?:^|\n|[:.!?]\s)\s*\d{1,2}$")


def is_abbreviation(text: str, dot: int) -> bool:
    """Whether the '.' at `dot` ends an abbreviation or an initial rather than a sentence."""
    if text[dot] != ".":
        return False
    word = text[: dot].rsplit(None, 1)[-1] if text[:dot].strip() else ""
    word = word.lstrip("(\"'“‘").lower()
    return word in ABBREVIATIONS or (len(word) == 1 and word.isalpha())


def is_list_number(text: str, dot: int) -> bool:
    """Whether the '.' (or ')') at `dot` follows a list item's number ("1. Open the app"): at the
    text's or a line's start, or after a colon or another sentence's end. "I have 2. Then" is not one."""
    return text[dot] in ".)" and _LIST_NUMBER.search(text[:dot]) is not None


def sentence_ends(text: str) -> list[int]:
    """Where each complete sentence of `text` ends (after its mark), in order."""
    ends: list[int] = []
    for match in SENTENCE_END.finditer(text):
        if match.group().startswith("\n"):
            if text[ends[-1] if ends else 0: match.start()].strip():  # a line of its own without a mark
                ends.append(match.start())
        elif not is_abbreviation(text, match.start()) and not is_list_number(text, match.start()):
            ends.append(match.end())
    return ends
