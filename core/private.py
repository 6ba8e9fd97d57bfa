"""What a log line may show of what a caller said or keyed in: their words, their keys (PINs, card
numbers), a tool's arguments and answers, and the agent's replies, which repeat them ("your PIN is
4719"). Log files travel further than the call store (aggregators, tickets, a colleague's screen),
so by default a line says only that something happened and how much: "caller: [9 words]".

server.log_caller_content sets it once for the process (logging itself is process-wide):
- "redacted" (the default): the summary, at every level;
- "debug": the summary in lines above DEBUG, each followed by a DEBUG line with the content itself;
- "info": the content in every line (for local testing).

A call site wraps each such argument in `Private` (`words`, `keys`, `content`) and logs through
`log_private`. A `Private` that reaches a logger some other way formats as its summary."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Literal

CallerContent = Literal["redacted", "debug", "info"]
_mode: CallerContent = "redacted"  # one for the process, set by the app at start-up


def set_caller_content(mode: CallerContent) -> None:
    """What the log shows of callers' content from now on (server.log_caller_content)."""
    global _mode
    _mode = mode


def caller_content() -> CallerContent:
    return _mode


@dataclass(frozen=True)
class Private:
    """A log argument that holds a caller's content: `text` itself, or `summary` where it may not show."""

    text: str
    summary: str

    def __str__(self) -> str:
        return self.summary

    __repr__ = __str__  # "%r" too shows the summary, unquoted


def _count(n: int, noun: str) -> str:
    return f"[{n} {noun}{'' if n == 1 else 's'}]"


def words(text: str) -> Private:
    """Said (or to be said) words: "[9 words]"."""
    return Private(text, _count(len(text.split()), "word"))


def keys(digits: str) -> Private:
    """Keypad digits, one a character (spaces between them are not keys): "[4 keys]"."""
    return Private(digits, _count(sum(not ch.isspace() for ch in digits), "key"))


def content(value: Any) -> Private:
    """Anything else the caller's words went into (a tool's arguments, its answer): "[57 characters]"."""
    text = value if isinstance(value, str) else json.dumps(value)
    return Private(text, _count(len(text), "character"))


def shows(level: int) -> bool:
    """Whether a line at `level` may show callers' content."""
    return _mode == "info" or (_mode == "debug" and level <= logging.DEBUG)


def log_private(logger: logging.Logger, level: int, msg: str, *args: Any) -> None:
    """`logger.log(level, msg, *args)` with each `Private` argument shown or summarized as
    server.log_caller_content allows; in "debug" mode a line above DEBUG is followed by a DEBUG line
    that shows them."""
    show = shows(level)
    if logger.isEnabledFor(level):
        logger.log(level, msg, *(_as_shown(a, show) for a in args), stacklevel=2)
    if (not show and _mode == "debug" and logger.isEnabledFor(logging.DEBUG)
            and any(isinstance(a, Private) for a in args)):
        logger.debug(msg, *(_as_shown(a, True) for a in args), stacklevel=2)


def _as_shown(arg: Any, show: bool) -> Any:
    return arg.text if show and isinstance(arg, Private) else arg
