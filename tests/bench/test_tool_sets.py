"""The labelled tool-call sets are what they claim: every expected call is valid for its tool's schema,
and the wide set (issue 34) has the size and spread it is described with."""

from __future__ import annotations

from collections import Counter

import jsonschema

from bench.tool_set import SPOKEN, SPOKEN_TOOLS
from bench.tool_set_wide import WIDE, WIDE_TOOLS
from models.llm.tool_calls import parse_tools


def test_every_expected_call_is_valid_for_its_tools_schema() -> None:
    schemas = {t["name"]: t["parameters"] for t in WIDE_TOOLS}
    expected = [c for r in WIDE for c in r.calls] + [s.call for s in SPOKEN if s.call is not None]
    for name, arguments in expected:
        jsonschema.validate(arguments, schemas[name])
    assert {t["name"] for t in SPOKEN_TOOLS} < set(schemas)
    parsed = parse_tools(WIDE_TOOLS)  # the server accepts the declarations as the bench sends them
    assert parsed is not None and [t.read_only for t in parsed.tools][-2:] == [True, True]


def test_the_wide_set_has_sixty_tool_requests_over_six_tools_and_thirty_that_need_none() -> None:
    tool = [r for r in WIDE if r.calls]
    none = [r for r in WIDE if not r.calls]
    assert len([r for r in tool if len(r.calls) == 1]) >= 60 and len(none) >= 30
    assert all(r.kind == "tool" for r in tool) and {r.kind for r in none} == {"uncheckable", "chat"}
    per_tool = Counter(c[0] for r in tool for c in r.calls)
    assert len(per_tool) >= 6 and min(per_tool.values()) >= 10, per_tool
    assert any(len(r.calls) == 2 for r in tool if r.split == "tune") and any(
        len(r.calls) == 2 for r in tool if r.split == "held")
    for split in ("tune", "held"):  # both halves have every kind
        assert Counter(r.kind for r in WIDE if r.split == split).keys() == {"tool", "uncheckable", "chat"}
    texts = [r.text for r in WIDE]
    assert len(set(texts)) == len(texts)
