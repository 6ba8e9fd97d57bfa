"""Dictated digits as numerals: "my order is four five one two" -> "my order is 4512".

Whisper writes a number it hears as a number ("4512") most of the time, but a caller who reads a
code digit by digit often gets words. The language model must then turn the words into the digits a
tool takes, and a small model's greedy choice there is close: in a test run the 1.5B asked for
order "451" after "four five one two". Copying numerals it reads is a step a model does not miss.
Only runs of three or more single digits are turned (a run is what a caller dictates; "one or two"
and "five minutes" stay words); "oh" counts as zero inside a run, not at its start ("oh, one two"
keeps its "oh"). Digits in a run are apart by spaces or hyphens; a comma ends a run, so a phone number
keeps its groups ("five five five, one two three four" -> "555, 1234")."""

from __future__ import annotations

import re

DIGITS = {"zero": "0", "oh": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
          "seven": "7", "eight": "8", "nine": "9"}
MIN_RUN = 3
_WORD = r"(?:zero|oh|one|two|three|four|five|six|seven|eight|nine)"
_START = r"(?:zero|one|two|three|four|five|six|seven|eight|nine)"  # "oh" does not start a run
_RUN = re.compile(rf"\b{_START}(?:[ -]+{_WORD}){{{MIN_RUN - 1},}}\b", re.IGNORECASE)
_SPLIT = re.compile(r"[ -]+")


def spoken_digits(text: str) -> str:
    """`text` with each run of three or more spoken digits written as numerals."""
    return _RUN.sub(lambda m: "".join(DIGITS[w.lower()] for w in _SPLIT.split(m.group(0)) if w), text)
