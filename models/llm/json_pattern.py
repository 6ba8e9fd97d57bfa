"""A JSON Schema `pattern` (an ECMA-262 regular expression) as part of the arguments automaton.

The pattern is parsed into a small tree, and the tree is built into fragments of the string's body:
the bytes between its quotes as the canonical layout writes them (a `"` or `\\` in the value as its
escape, a control character as its short escape, every other character as its UTF-8 bytes). A tree
can be built more than once, which is how a bounded repetition (`{2,4}`) becomes copies of its part.

As in JSON Schema, a pattern matches anywhere in the string unless it is anchored: without a leading
`^` any characters may come first, without a trailing `$` any may follow.

Supported: literals, `.`, classes (`[a-z0-9_]`, `[^ ]`), `\\d \\w \\s` and their negations, escaped
punctuation, `\\n \\t \\r`, groups (`(...)`, `(?:...)`), `|`, and the quantifiers `* + ? {n} {n,}
{n,m}` (a lazy `?` after them changes nothing here: only what matches counts). Refused with an error
that names it: lookarounds, backreferences, word boundaries, `^` or `$` inside the pattern, named
groups, and repetitions over MAX_REPEAT. Classes name ASCII characters only; any character outside
ASCII can still come through `.`, a negated class, `\\D`, `\\W` or `\\S`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.errors import ConfigError

if TYPE_CHECKING:  # json_nfa calls in here: no import back at run time
    from models.llm.json_nfa import Builder, Fragment

MAX_REPEAT = 64
_ASCII = frozenset(range(0x80))
_DIGITS = frozenset(b"0123456789")
_WORD = _DIGITS | frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_SPACE = frozenset(b" \t\n\r\f\v")
_CLASS_ESCAPES = {"d": _DIGITS, "w": _WORD, "s": _SPACE}
_CONTROL_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}
_NEWLINES = frozenset(b"\n\r")


@dataclass(frozen=True)
class Chars:
    """A set of characters: the ASCII ones listed, plus every non-ASCII one where `wide`."""

    ascii: frozenset[int]
    wide: bool = False


@dataclass(frozen=True)
class Seq:
    parts: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat:
    part: Node
    least: int
    most: int | None  # None: no bound


Node = Chars | Seq | Alt | Repeat
ANY = Chars(_ASCII, wide=True)


class _Parser:
    def __init__(self, pattern: str, where: str) -> None:
        self.text, self.where, self.at = pattern, where, 0

    def fail(self, what: str) -> ConfigError:
        return ConfigError(f"{self.where}: pattern {self.text!r}: {what} (at character {self.at}); supported: "
                           f"literals, ., classes, \\d \\w \\s, groups, |, * + ? {{n,m}}, and ^ $ at the ends")

    def peek(self) -> str:
        return self.text[self.at] if self.at < len(self.text) else ""

    def take(self) -> str:
        char = self.peek()
        self.at += 1
        return char

    def alternation(self) -> Node:
        options = [self.sequence()]
        while self.peek() == "|":
            self.at += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self) -> Node:
        parts: list[Node] = []
        while self.peek() not in ("", "|", ")"):
            parts.append(self.quantified(self.atom()))
        return parts[0] if len(parts) == 1 else Seq(tuple(parts))

    def quantified(self, part: Node) -> Node:
        char = self.peek()
        if char in ("*", "+", "?"):
            self.at += 1
            least, most = {"*": (0, None), "+": (1, None), "?": (0, 1)}[char]
        elif char == "{" and self._bound_follows():
            least, most = self._bound()
        else:
            return part
        if self.peek() == "?":  # lazy: the same strings match
            self.at += 1
        if self.peek() in ("*", "+", "?") or (self.peek() == "{" and self._bound_follows()):
            raise self.fail("a quantifier after a quantifier")
        if max(least, most or 0) > MAX_REPEAT:
            raise self.fail(f"a repetition over {MAX_REPEAT}")
        return Repeat(part, least, most)

    def _bound_follows(self) -> bool:
        end = self.text.find("}", self.at)
        body = self.text[self.at + 1:end] if end > 0 else ""
        low, _, high = body.partition(",")
        return low.isdigit() and (high == "" or high.isdigit())

    def _bound(self) -> tuple[int, int | None]:
        end = self.text.index("}", self.at)
        low, comma, high = self.text[self.at + 1:end].partition(",")
        self.at = end + 1
        least = int(low)
        most = least if not comma else int(high) if high else None
        if most is not None and most < least:
            raise self.fail(f"the repetition {{{low},{high}}} has its bounds the wrong way round")
        return least, most

    def atom(self) -> Node:
        char = self.take()
        if char == "(":
            if self.text.startswith("?:", self.at):
                self.at += 2
            elif self.peek() == "?":
                raise self.fail("lookarounds and named groups are not supported")
            inner = self.alternation()
            if self.take() != ")":
                raise self.fail("a group is not closed")
            return inner
        if char == "[":
            return self.bracket()
        if char == ".":
            return Chars(_ASCII - _NEWLINES, wide=True)
        if char == "\\":
            return self.escape()
        if char in ("^", "$"):
            raise self.fail(f"{char!r} is supported only at the pattern's {'start' if char == '^' else 'end'}")
        if char in ("*", "+", "?"):
            raise self.fail("a quantifier with nothing before it")
        if char == ")":
            raise self.fail("a ')' with no group open")
        return literal(char)

    def escape(self) -> Node:
        char = self.take()
        if not char:
            raise self.fail("a pattern that ends in a backslash")
        if char.lower() in _CLASS_ESCAPES:
            chars = _CLASS_ESCAPES[char.lower()]
            return Chars(chars) if char.islower() else Chars(_ASCII - chars, wide=True)
        if char in _CONTROL_ESCAPES:
            return Chars(frozenset({ord(_CONTROL_ESCAPES[char])}))
        if char.isalnum():
            what = "backreferences" if char.isdigit() else f"the escape \\{char}"
            raise self.fail(f"{what} {'are' if char.isdigit() else 'is'} not supported")
        return literal(char)

    def bracket(self) -> Node:
        negated = self.peek() == "^"
        if negated:
            self.at += 1
        members: set[int] = set()
        first = True
        while first or self.peek() != "]":
            if not self.peek():
                raise self.fail("a class is not closed")
            low = self._class_char()
            first = False
            if isinstance(low, frozenset):
                members |= low
                continue
            if self.peek() == "-" and self.text[self.at + 1:self.at + 2] not in ("]", ""):
                self.at += 1
                high = self._class_char()
                if isinstance(high, frozenset) or high < low:
                    raise self.fail("a class range that is not from a character to a later one")
                members |= set(range(low, high + 1))
            else:
                members.add(low)
        self.at += 1
        if any(m >= 0x80 for m in members):
            raise self.fail("a class names a character outside ASCII")
        if negated:
            return Chars(_ASCII - frozenset(members), wide=True)
        return Chars(frozenset(members))

    def _class_char(self) -> int | frozenset[int]:
        char = self.take()
        if char != "\\":
            return ord(char)
        node = self.escape()
        if isinstance(node, Chars):
            if node.wide:
                raise self.fail("a negated escape (\\D, \\W, \\S) inside a class")
            return node.ascii if len(node.ascii) != 1 else next(iter(node.ascii))
        assert isinstance(node, Seq)  # a literal of more than one byte: outside ASCII
        raise self.fail("a class names a character outside ASCII")


def literal(char: str) -> Node:
    if ord(char) < 0x80:
        return Chars(frozenset({ord(char)}))
    return Seq(tuple(Chars(frozenset({byte})) for byte in char.encode()))


def ends_anchored(pattern: str) -> bool:
    """Whether the pattern ends in a `$` that is an anchor (not one escaped by an odd run of backslashes)."""
    before = pattern[:-1]
    return pattern.endswith("$") and (len(before) - len(before.rstrip("\\"))) % 2 == 0


def parse(pattern: str, where: str) -> Node:
    """The tree of `pattern`, unanchored ends padded with any characters."""
    body, head, tail = pattern, pattern.startswith("^"), False
    if head:
        body = body[1:]
    if ends_anchored(body):
        body, tail = body[:-1], True
    parser = _Parser(body, where)
    tree = parser.alternation()
    if parser.peek():
        raise parser.fail("a ')' with no group open")
    pad = Repeat(ANY, 0, None)
    return Seq(((pad,) if not head else ()) + (tree,) + ((pad,) if not tail else ()))


def build(b: Builder, node: Node) -> Fragment:
    """The fragment for `node`, as the string body's bytes in the canonical layout."""
    if isinstance(node, Chars):
        return _chars(b, node)
    if isinstance(node, Seq):
        return b.seq(b.literal(b""), *(build(b, part) for part in node.parts))
    if isinstance(node, Alt):
        return b.alt(*(build(b, option) for option in node.options))
    parts = [build(b, node.part) for _ in range(node.least)]
    if node.most is None:
        parts.append(b.star(build(b, node.part)))
    else:
        parts += [b.optional(build(b, node.part)) for _ in range(node.most - node.least)]
    return b.seq(b.literal(b""), *parts)


def _chars(b: Builder, chars: Chars) -> Fragment:
    plain = frozenset(c for c in chars.ascii if c >= 0x20 and c not in (ord('"'), ord("\\")))
    options = [b.byteset(plain)] if plain else []
    for c in sorted(chars.ascii - plain):  # written as escapes in JSON
        options.append(b.literal(json.dumps(chr(c)).encode()[1:-1]))
    if chars.wide:  # any character outside ASCII: its UTF-8 bytes
        tail = frozenset(range(0x80, 0xC0))
        for lead, more in ((range(0xC2, 0xE0), 1), (range(0xE0, 0xF0), 2), (range(0xF0, 0xF5), 3)):
            options.append(b.seq(b.byteset(frozenset(lead)), *(b.byteset(tail) for _ in range(more))))
    if not options:
        raise ConfigError("a pattern's class allows no character at all")
    return options[0] if len(options) == 1 else b.alt(*options)


def pattern_string(b: Builder, pattern: object, where: str) -> Fragment:
    """A JSON string (with its quotes) whose value matches `pattern`."""
    if not isinstance(pattern, str):
        raise ConfigError(f"{where}: pattern must be a string, not {pattern!r}")
    body = build(b, parse(pattern, where))
    return b.seq(b.literal(b'"'), body, b.literal(b'"'))
