"""What a log line shows of a caller's words and keys under each server.log_caller_content mode."""

from __future__ import annotations

import logging

import pytest

from core.private import CallerContent, caller_content, content, keys, log_private, set_caller_content, words

log = logging.getLogger("tests.private")


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records]


def test_summaries_say_how_much_and_nothing_else() -> None:
    assert words("my PIN is 4 7 1 9").summary == "[7 words]"
    assert words("yes").summary == "[1 word]" and words("").summary == "[0 words]"
    assert keys("4 7 1 #").summary == "[4 keys]" and keys("9").summary == "[1 key]"
    assert content({"pin": "4719"}).summary == "[15 characters]" and content({"pin": "4719"}).text == '{"pin": "4719"}'
    said = words("book a table for 4719")
    assert f"{said} / {said!r}" == "[5 words] / [5 words]"  # formatted straight into a line: the summary


@pytest.mark.parametrize("level", [logging.INFO, logging.DEBUG])
def test_redacted_shows_no_content_at_any_level(caplog: pytest.LogCaptureFixture, level: int) -> None:
    set_caller_content("redacted")
    caplog.set_level(logging.DEBUG, logger=log.name)
    log_private(log, level, "turn %d: caller: %r", 3, words("my PIN is 4719"))
    assert lines(caplog) == [(logging.getLevelName(level), "turn 3: caller: [4 words]")]


def test_debug_adds_a_debug_line_with_the_content(caplog: pytest.LogCaptureFixture) -> None:
    set_caller_content("debug")
    caplog.set_level(logging.DEBUG, logger=log.name)
    log_private(log, logging.INFO, "turn %d: keys %s", 4, keys("4 7 1 9"))
    log_private(log, logging.DEBUG, "turn %d: P(end | %r)", 4, words("book a table"))
    assert lines(caplog) == [("INFO", "turn 4: keys [4 keys]"), ("DEBUG", "turn 4: keys 4 7 1 9"),
                             ("DEBUG", "turn 4: P(end | 'book a table')")]


def test_debug_at_info_level_logs_only_the_summary(caplog: pytest.LogCaptureFixture) -> None:
    set_caller_content("debug")
    caplog.set_level(logging.INFO, logger=log.name)
    log_private(log, logging.INFO, "turn %d: caller: %r", 1, words("my PIN is 4719"))
    log_private(log, logging.DEBUG, "turn %d: caller: %r", 1, words("my PIN is 4719"))
    assert lines(caplog) == [("INFO", "turn 1: caller: [4 words]")]


def test_info_shows_the_content_in_the_line_itself(caplog: pytest.LogCaptureFixture) -> None:
    set_caller_content("info")
    caplog.set_level(logging.DEBUG, logger=log.name)
    log_private(log, logging.WARNING, "tool %s(%s), %r", "book", content({"pin": "4719"}), words("a table"))
    assert lines(caplog) == [("WARNING", "tool book({\"pin\": \"4719\"}), 'a table'")]


def test_a_line_reports_where_it_was_logged_not_the_helper(caplog: pytest.LogCaptureFixture) -> None:
    set_caller_content("debug")
    caplog.set_level(logging.DEBUG, logger=log.name)
    log_private(log, logging.INFO, "caller: %r", words("hello"))
    assert {r.funcName for r in caplog.records} == {"test_a_line_reports_where_it_was_logged_not_the_helper"}


@pytest.mark.parametrize("value", ["redacted", "debug", "info"])
def test_the_mode_is_kept_for_the_process(value: CallerContent) -> None:
    set_caller_content(value)
    assert caller_content() == value
