"""The honesty gate's examples and threshold are chosen on tune requests: none of its examples is a
held-out request, and the tune requests its threshold was chosen on are not among its examples."""

from __future__ import annotations

from bench.honesty_set import (
    ANSWERABLE_TUNE_MORE,
    CONTROLS_HELD,
    CONTROLS_TUNE,
    LOOKUPS_AFTER_HELD,
    REQUESTS,
    UNCHECKABLE_TUNE_MORE,
)
from pipeline import honesty


def words(text: str) -> str:
    return " ".join(text.lower().replace("?", "").replace(".", "").split())


def test_the_gates_examples_are_tune_requests_and_the_threshold_requests_are_not_among_them() -> None:
    in_conversation = {words(t) for t, _ in CONTROLS_HELD + LOOKUPS_AFTER_HELD}
    held = {words(r.text) for r in REQUESTS if r.split == "held"} | in_conversation
    tune = {words(r.text) for r in REQUESTS if r.split == "tune"} | {words(t) for t, _ in CONTROLS_TUNE}
    examples = {words(request) for request, _, _ in honesty.EXAMPLES}
    assert not examples & held
    assert not held & tune
    chosen_on = {words(t) for t in UNCHECKABLE_TUNE_MORE} | {words(t) for t, _ in ANSWERABLE_TUNE_MORE}
    assert not examples & chosen_on and chosen_on <= tune
    # both kinds of request are shown, the same number of each
    assert sum(a == "yes" for *_, a in honesty.EXAMPLES) == sum(a == "no" for *_, a in honesty.EXAMPLES)
