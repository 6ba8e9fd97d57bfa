"""What must not reach the logs: secrets in URLs (a Telnyx stream token, a browser's session token,
both in the query string, where an access log writes them) and callers' phone numbers."""

from __future__ import annotations

import logging
import re

SECRET_QUERY = re.compile(r"([?&](?:token|key|api_key|access_token)=)[^&\s\"']*", re.IGNORECASE)
SERVER_LOGGERS = ("uvicorn.access", "uvicorn.error")  # uvicorn writes each request's path with its query here


def redact_url(text: str) -> str:
    """`text` with the values of secret-bearing query parameters replaced."""
    return SECRET_QUERY.sub(r"\1[redacted]", text)


class RedactQuery(logging.Filter):
    """Rewrites a record whose message carries a secret query parameter (and keeps every record)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_url(message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        return True


def install_log_redaction() -> None:
    """Once per process: every server logger redacts secret query parameters."""
    for name in SERVER_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactQuery) for f in logger.filters):
            logger.addFilter(RedactQuery())


def mask_number(number: str | None) -> str:
    """A phone number as the logs may show it: its country code's first digit and last two digits
    ("+1*********11"); anything else, as many stars as it has characters."""
    if not number:
        return "?"
    digits = sum(ch.isdigit() for ch in number)
    if digits < 6:
        return "*" * len(number)
    head = number[:2] if number.startswith("+") else ""
    return head + "*" * (len(number) - len(head) - 2) + number[-2:]
