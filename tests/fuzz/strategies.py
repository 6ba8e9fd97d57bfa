"""Hypothesis strategies for hostile input: any JSON, valid messages with fields mutated to wrong
types and huge numbers, text that is not JSON, and binary frames of any length."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),  # past int64 and float precision
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["", "session.start", "media", "start", "pcm16", "-1", "1e309", "\u0000", "\u202e"]),
)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=12), inner, max_size=4), max_leaves=12)


@st.composite
def mutated(draw: st.DrawFn, template: dict[str, Any]) -> dict[str, Any]:
    """`template` with some fields (at any depth) replaced, deleted or added."""
    def mutate(value: Any, depth: int) -> Any:
        if isinstance(value, dict) and depth < 3:
            out = {}
            for key, inner in value.items():
                choice = draw(st.integers(0, 5))
                if choice == 0:
                    continue  # dropped
                out[key] = draw(json_values) if choice == 1 else mutate(inner, depth + 1)
            if draw(st.booleans()):
                out[draw(st.text(max_size=10))] = draw(json_values)
            return out
        return draw(json_values) if draw(st.integers(0, 3)) == 0 else value
    return mutate(template, 0)  # type: ignore[no-any-return]


def dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=True)


def text_frames(templates: list[dict[str, Any]]) -> st.SearchStrategy[str]:
    """Mutated valid messages, any JSON value, JSON cut short, and plain text."""
    return st.one_of(
        st.sampled_from(templates).flatmap(mutated).map(dumps),
        json_values.map(dumps),
        st.sampled_from(templates).map(dumps).flatmap(lambda s: st.integers(0, len(s)).map(lambda n: s[:n])),
        st.text(max_size=200),
    )


binary_frames = st.one_of(
    st.binary(max_size=700),  # odd lengths, invalid UTF-8, anything
    st.integers(32001, 40000).map(lambda n: b"\x01" * n),  # over server.max_frame_bytes
)
