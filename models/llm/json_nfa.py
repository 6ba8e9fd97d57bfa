"""JSON that follows a JSON Schema, as a byte automaton: what a tool call's arguments may be.

A schema compiles to a nondeterministic automaton over bytes (Thompson's construction); a state is
the frozen set of nodes it may be in. The language is JSON in one canonical layout, the one the
chat templates show (`{"key": value, "other": [1, 2]}`: ": " after a key, ", " between members,
no other whitespace), so every byte the layout fixes is forced and can be emitted without asking
the model (jump-forward).

Supported: `type` (object, array, string, integer, number, boolean, null, or a list of them),
`properties` (kept in their declared order), `required`, `items`, `enum`, `const`, `anyOf`,
`oneOf`, and a string's `pattern` (models/llm/json_pattern.py). An object takes no properties beyond
those declared. Words that describe but do not shape (`description`, `title`, `default`,
`examples`, `format`, `minimum`...) are ignored here; the finished arguments are checked against
the whole schema afterwards. Anything else (`$ref`, `patternProperties`, `allOf`, a nesting deeper
than MAX_DEPTH) is refused with an error that names it.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from core.errors import ConfigError
from models.llm.json_pattern import pattern_string

State = frozenset[int]
MAX_DEPTH = 6
_REFUSED = ("$ref", "patternProperties", "allOf", "not", "if", "dependentSchemas",
            "dependentRequired", "prefixItems", "unevaluatedProperties")
_STRING_BYTE = frozenset(range(0x20, 0x100)) - {ord('"'), ord("\\")}
_ESCAPED = frozenset(b'"\\/bfnrt')
_HEX = frozenset(b"0123456789abcdefABCDEF")
_DIGIT = frozenset(b"0123456789")


@dataclass
class Nfa:
    """Nodes with byte-set edges and empty edges; `final` is the one accepting node."""

    edges: list[list[tuple[frozenset[int], int]]] = field(default_factory=list)
    empty: list[list[int]] = field(default_factory=list)
    final: int = -1
    _closures: dict[State, State] = field(default_factory=dict)
    _steps: dict[tuple[State, int], State] = field(default_factory=dict)

    @staticmethod
    def nothing() -> Nfa:
        """Accepts no byte at all (the empty string only)."""
        nfa = Nfa()
        nfa.final = nfa.node()
        return nfa

    def node(self) -> int:
        self.edges.append([])
        self.empty.append([])
        return len(self.edges) - 1

    # -- running ---------------------------------------------------------------------------------
    def start(self) -> State:
        return self.closure(frozenset({0}))

    def closure(self, nodes: State) -> State:
        known = self._closures.get(nodes)
        if known is not None:
            return known
        seen, todo = set(nodes), list(nodes)
        while todo:
            for nxt in self.empty[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        result = frozenset(seen)
        self._closures[nodes] = result
        return result

    def step(self, state: State, byte: int) -> State:
        """The state after one more byte; empty when the byte cannot come here."""
        key = (state, byte)
        known = self._steps.get(key)
        if known is None:
            known = self.closure(frozenset(t for n in state for allowed, t in self.edges[n] if byte in allowed))
            self._steps[key] = known
        return known

    def walk(self, state: State, data: bytes) -> State:
        for byte in data:
            state = self.step(state, byte)
            if not state:
                break
        return state

    def accepts(self, state: State) -> bool:
        return self.final in state

    def finished(self, state: State) -> bool:
        """Accepting with nothing that could follow."""
        return self.accepts(state) and not any(self.edges[n] for n in state)

    def forced(self, state: State) -> bytes:
        """The bytes that must come next whatever the model says (up to the next choice, or the end)."""
        out = bytearray()
        while state and not self.accepts(state):
            sets = {allowed for n in state for allowed, _ in self.edges[n]}
            if len(sets) != 1:
                break
            (only,) = sets
            if len(only) != 1:
                break
            (byte,) = only
            out.append(byte)
            state = self.step(state, byte)
        return bytes(out)


@dataclass(frozen=True)
class Fragment:
    start: int
    end: int


class Builder:
    """Builds fragments into one Nfa; `finish` joins the last one to the accepting node."""

    def __init__(self) -> None:
        self.nfa = Nfa()
        self.root = self.nfa.node()

    def literal(self, data: bytes) -> Fragment:
        start = node = self.nfa.node()
        for byte in data:
            nxt = self.nfa.node()
            self.nfa.edges[node].append((frozenset({byte}), nxt))
            node = nxt
        return Fragment(start, node)

    def byteset(self, allowed: frozenset[int]) -> Fragment:
        start, end = self.nfa.node(), self.nfa.node()
        self.nfa.edges[start].append((allowed, end))
        return Fragment(start, end)

    def seq(self, *parts: Fragment) -> Fragment:
        for a, b in itertools.pairwise(parts):
            self.nfa.empty[a.end].append(b.start)
        return Fragment(parts[0].start, parts[-1].end)

    def alt(self, *parts: Fragment) -> Fragment:
        start, end = self.nfa.node(), self.nfa.node()
        for part in parts:
            self.nfa.empty[start].append(part.start)
            self.nfa.empty[part.end].append(end)
        return Fragment(start, end)

    def star(self, part: Fragment) -> Fragment:
        start, end = self.nfa.node(), self.nfa.node()
        self.nfa.empty[start] += [part.start, end]
        self.nfa.empty[part.end] += [part.start, end]
        return Fragment(start, end)

    def optional(self, part: Fragment) -> Fragment:
        return self.alt(part, self.literal(b""))

    def finish(self, part: Fragment) -> Nfa:
        self.nfa.empty[self.root].append(part.start)
        self.nfa.final = part.end
        return self.nfa


def compile_value(b: Builder, schema: Any, where: str, depth: int = 0) -> Fragment:
    """The fragment for one JSON value that `schema` allows; `where` names it in errors."""
    if schema is True or schema == {}:
        schema = {"type": ["string", "number", "boolean", "null"]}
    if not isinstance(schema, dict):
        raise ConfigError(f"{where}: a JSON Schema must be an object, not {schema!r}")
    if depth > MAX_DEPTH:
        raise ConfigError(f"{where}: nested deeper than {MAX_DEPTH} levels; flatten the arguments")
    for word in _REFUSED:
        if word in schema:
            raise ConfigError(f"{where}: the JSON Schema keyword {word!r} is not supported in tool arguments "
                              f"(supported: type, properties, required, items, enum, const, anyOf, oneOf, pattern)")
    if "const" in schema:
        return b.literal(_canonical(schema["const"]))
    if "enum" in schema:
        values = schema["enum"]
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}: enum must be a non-empty list")
        return b.alt(*(b.literal(_canonical(v)) for v in values))
    for word in ("anyOf", "oneOf"):
        if word in schema:
            options = schema[word]
            if not isinstance(options, list) or not options:
                raise ConfigError(f"{where}: {word} must be a non-empty list of schemas")
            return b.alt(*(compile_value(b, s, f"{where}.{word}[{i}]", depth + 1) for i, s in enumerate(options)))
    kind = schema.get("type")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else \
            ["string", "number", "boolean", "null"]
    if isinstance(kind, list):
        return b.alt(*(compile_value(b, {**schema, "type": k}, where, depth) for k in kind))
    if kind == "string":
        return pattern_string(b, schema["pattern"], where) if "pattern" in schema else _string(b)
    if kind == "integer":
        return _integer(b)
    if kind == "number":
        frac = b.optional(b.seq(b.literal(b"."), b.byteset(_DIGIT), b.star(b.byteset(_DIGIT))))
        exp = b.optional(b.seq(b.byteset(frozenset(b"eE")), b.optional(b.byteset(frozenset(b"+-"))),
                               b.byteset(_DIGIT), b.star(b.byteset(_DIGIT))))
        return b.seq(_integer(b), frac, exp)
    if kind == "boolean":
        return b.alt(b.literal(b"true"), b.literal(b"false"))
    if kind == "null":
        return b.literal(b"null")
    if kind == "array":
        items = schema.get("items", True)
        first = compile_value(b, items, f"{where}[]", depth + 1)
        more = b.star(b.seq(b.literal(b", "), compile_value(b, items, f"{where}[]", depth + 1)))
        return b.seq(b.literal(b"["), b.optional(b.seq(first, more)), b.literal(b"]"))
    if kind == "object":
        return _object(b, schema, where, depth)
    raise ConfigError(f"{where}: unknown JSON Schema type {kind!r}")


def _canonical(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


def _string(b: Builder) -> Fragment:
    escape = b.seq(b.literal(b"\\"), b.alt(
        b.byteset(_ESCAPED),
        b.seq(b.literal(b"u"), b.byteset(_HEX), b.byteset(_HEX), b.byteset(_HEX), b.byteset(_HEX)),
    ))
    char = b.alt(b.byteset(_STRING_BYTE), escape)
    return b.seq(b.literal(b'"'), b.star(char), b.literal(b'"'))


def _integer(b: Builder) -> Fragment:
    digits = b.alt(b.literal(b"0"), b.seq(b.byteset(_DIGIT - {ord("0")}), b.star(b.byteset(_DIGIT))))
    return b.seq(b.optional(b.literal(b"-")), digits)


def _object(b: Builder, schema: dict[str, Any], where: str, depth: int) -> Fragment:
    """Members in the declared order, each required one present, optional ones the model's choice.
    Two tracks of nodes: `none[i]` before member i when no member came yet (no ", " before the next),
    `some[i]` when one did."""
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        raise ConfigError(f"{where}: properties must be an object of schemas")
    required = set(schema.get("required", []))
    unknown = required - set(props)
    if unknown:
        raise ConfigError(f"{where}: required names {sorted(unknown)} that are not among its properties")
    names = list(props)
    none = [b.nfa.node() for _ in range(len(names) + 1)]
    some = [b.nfa.node() for _ in range(len(names) + 1)]
    empty = b.nfa.empty
    for i, name in enumerate(names):
        key = _canonical(name) + b": "
        for track, prefix in ((none, b""), (some, b", ")):
            member = b.seq(b.literal(prefix + key), compile_value(b, props[name], f"{where}.{name}", depth + 1))
            empty[track[i]].append(member.start)
            empty[member.end].append(some[i + 1])
            if name not in required:
                empty[track[i]].append(track[i + 1])
    open_, close = b.literal(b"{"), b.literal(b"}")
    empty[open_.end].append(none[0])
    empty[none[-1]].append(close.start)
    empty[some[-1]].append(close.start)
    return Fragment(open_.start, close.end)


def arguments_nfa(schema: Any, where: str) -> Nfa:
    b = Builder()
    return b.finish(compile_value(b, schema, where))
