"""The csv export escapes text that a spreadsheet would run as a formula (CSV injection): a single
quote in front; numbers, and text that is a plain number, are left alone; jsonl keeps every text as
it was."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path

from app.store.export import spreadsheet_safe
from tests.store.helpers import call, open_store, turn

LINK = '=HYPERLINK("http://x","y")'


def test_formula_text_is_quoted_and_numbers_are_not() -> None:
    for text in (LINK, "+cmd|' /C calc'!A0", "-2+3", "@SUM(A1:A9)", "\tx", "\r=1+1", "- a list item"):
        assert spreadsheet_safe(text) == "'" + text
    for value in ("hello", "", "3 apples", "{\"k\": -1}", "[-1]", "-3.5", "+15551234567", "-.5", "1e-3", "-2E+4",
                  -3.5, -7, 0.0, True, None):
        assert spreadsheet_safe(value) == value


async def test_csv_export_escapes_formulas_and_jsonl_keeps_the_text(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    try:
        store.call_started(dataclasses.replace(call("c1"), caller="@evil"))
        store.turn_ended("c1", dataclasses.replace(
            turn(0), user_text=LINK, generated_text="+1 (555) 010", sent_text="-3.5", heard_text="-3.5 degrees",
            latency_ms={**turn(0).latency_ms, "asr_final": -3.5}))
        await store.flush()
        csv_text = "".join([chunk async for chunk in store.export("csv")])
        jsonl_text = "".join([chunk async for chunk in store.export("jsonl")])
    finally:
        await store.close()

    (row,) = csv.DictReader(io.StringIO(csv_text))
    assert row["user_text"] == "'" + LINK
    assert row["generated_text"] == "'+1 (555) 010" and row["heard_text"] == "'-3.5 degrees"
    assert row["caller"] == "'@evil"
    assert row["sent_text"] == "-3.5"  # text that is a plain number is not a formula
    assert row["asr_final_ms"] == "-3.5"  # a negative number stays a number
    assert row["call_id"] == "c1" and row["user_text"].count("'") == 1

    (line,) = jsonl_text.splitlines()
    exported = json.loads(line)
    assert exported["turns"][0]["user_text"] == LINK and exported["call"]["caller"] == "@evil"
    assert exported["turns"][0]["generated_text"] == "+1 (555) 010"
    assert exported["turns"][0]["latency_ms"]["asr_final"] == -3.5
