"""Phone numbers as the logs show them, and the setting that keeps callers' words out of the log."""

from __future__ import annotations

import logging

import pytest
from pydantic import ValidationError

from app.main import create_app
from app.redact import RedactQuery, looks_like_number, mask_number, mask_parameters
from app.settings import ServerConfig, Settings
from core.private import caller_content, set_caller_content


@pytest.fixture
def mode(caplog: pytest.LogCaptureFixture) -> None:
    """The log at DEBUG (the process-wide mode create_app sets is put back by tests/conftest.py)."""
    caplog.set_level(logging.DEBUG)


def test_a_number_keeps_its_country_codes_first_digit_and_last_two_digits() -> None:
    assert mask_number("+15550001111") == "+1********11"
    assert mask_number("0201234567") == "********67"
    assert mask_number("1234") == "****" and mask_number(None) == mask_number("") == "?"


def test_a_sip_or_tel_uri_has_its_user_part_masked() -> None:
    assert mask_number("sip:+15550001111@pbx.example.com") == "sip:+1********11@pbx.example.com"
    assert mask_number("tel:+44 20 7946 0958") == "tel:+4************58"
    assert mask_number("sips:alice@example.com;transport=tls") == "sips:*****@example.com;transport=tls"


def test_a_calls_parameters_have_every_number_masked_whatever_its_name() -> None:
    shown = mask_parameters({"CallSid": "CA0123456789abcdef", "From": "+15550001111", "to": "sip:100@pbx.example",
                             "customer_line": "+1 (555) 000-2222", "language": "en", "queue": "12"})
    assert shown == {"CallSid": "CA0123456789abcdef", "From": "+1********11", "to": "sip:***@pbx.example",
                     "customer_line": "+1*************22", "language": "en", "queue": "12"}
    assert looks_like_number("555-000-1111") and not looks_like_number("CA0123456789") and not looks_like_number("12")


def test_by_default_the_log_keeps_no_callers_words(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ServerConfig().log_caller_content == "redacted"
    monkeypatch.setenv("VOICE_AGENT_SERVER__LOG_CALLER_CONTENT", "debug")
    assert Settings().server.log_caller_content == "debug"
    with pytest.raises(ValidationError):
        ServerConfig(log_caller_content="everything")  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["info", "debug", "redacted"])
def test_the_app_puts_the_setting_in_force(mode: None, value: str) -> None:
    set_caller_content("info" if value != "info" else "redacted")
    create_app(Settings(server=ServerConfig(log_caller_content=value)))  # type: ignore[arg-type]
    assert caller_content() == value
    # the call store's driver logs each statement with its values (the transcripts) at DEBUG;
    # httpx logs each request's URL at INFO, a GET tool's arguments in its query
    assert logging.getLogger("aiosqlite").isEnabledFor(logging.DEBUG) is (value == "info")
    assert logging.getLogger("httpx").isEnabledFor(logging.INFO) is (value == "info")


def test_an_access_log_line_with_a_token_is_written_redacted_by_uvicorns_own_formatter() -> None:
    """uvicorn's access formatter unpacks the record's five arguments: the filter takes the token out of
    the path argument and keeps them (a record left with none failed to format, and the line was lost)."""
    from uvicorn.logging import AccessFormatter

    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d', (
        "127.0.0.1:5000", "POST", "/webrtc/calls?token=s3cret&x=1", "1.1", 201), None)
    assert RedactQuery().filter(record)
    line = AccessFormatter("%(client_addr)s %(request_line)s %(status_code)s", use_colors=False).format(record)
    assert line == '127.0.0.1:5000 POST /webrtc/calls?token=[redacted]&x=1 HTTP/1.1 201 Created', line
    plain = logging.LogRecord("app", logging.INFO, __file__, 1, "GET /telnyx/media?token=%s", ("s3cret",), None)
    assert RedactQuery().filter(plain) and plain.getMessage() == "GET /telnyx/media?token=[redacted]"
    placed = logging.LogRecord("app", logging.INFO, __file__, 1, "GET /telnyx/media?placed=%s", ("out_1.s3cret",),
                               None)
    assert RedactQuery().filter(placed) and placed.getMessage() == "GET /telnyx/media?placed=[redacted]"
