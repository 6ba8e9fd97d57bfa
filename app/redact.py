"""What must not reach the logs: secrets in URLs (a Telnyx stream token, a browser's session token,
a call placed out's stream credential: all in the query string, where an access log writes them) and
callers' phone numbers."""

from __future__ import annotations

import logging
import re

SECRET_QUERY = re.compile(r"([?&](?:token|key|api_key|access_token|placed)=)[^&\s\"']*", re.IGNORECASE)
URI = re.compile(r"(?P<scheme>(?:sips?|tel):)(?P<user>[^@;]+)(?P<host>[@;].*)?$", re.IGNORECASE)
PHONE = re.compile(r"\+?[\d\s().-]+")  # digits, perhaps spaced or punctuated
NUMBER_NAMES = frozenset({"from", "to", "caller", "called", "callerid", "caller_id", "ani", "dnis"})
# Libraries whose lines show values callers gave, and the level below which they are held back:
# aiosqlite's DEBUG lines are each SQL statement with its parameters; httpx's and httpcore's INFO
# and DEBUG lines are each request's URL, which for a server tool called with GET or DELETE holds
# the tool's arguments in its query (a PIN, a name: pipeline/tools.py).
VALUE_LOGGERS = {"aiosqlite": logging.INFO, "httpx": logging.WARNING, "httpcore": logging.WARNING}
SERVER_LOGGERS = ("uvicorn.access", "uvicorn.error")  # uvicorn writes each request's path with its query here


def redact_url(text: str) -> str:
    """`text` with the values of secret-bearing query parameters replaced."""
    return SECRET_QUERY.sub(r"\1[redacted]", text)


class RedactQuery(logging.Filter):
    """Rewrites a record whose message carries a secret query parameter (and keeps every record). The
    secret is taken out of the argument that carries it, so the record keeps its arguments: uvicorn's
    access formatter unpacks them (client, method, path, version, status), and a record with none
    failed to format, its traceback in the log in place of the line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact_url(a) if isinstance(a, str) else a for a in record.args)
        message = record.getMessage()
        redacted = redact_url(message)
        if redacted != message:  # a secret in the message itself, split across arguments, in an object's str
            record.msg, record.args = redacted, ()
        return True


def hold_value_loggers(caller_content: str) -> None:
    """Libraries whose lines show values callers gave (VALUE_LOGGERS: what the call store writes,
    a tool's arguments in a URL): held back unless the log may show callers' content
    (server.log_caller_content "info")."""
    for name, level in VALUE_LOGGERS.items():
        logging.getLogger(name).setLevel(logging.NOTSET if caller_content == "info" else level)


def install_log_redaction() -> None:
    """Once per process: every server logger redacts secret query parameters."""
    for name in SERVER_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactQuery) for f in logger.filters):
            logger.addFilter(RedactQuery())


def mask_number(number: str | None) -> str:
    """A phone number as the logs may show it: its country code's first digit and last two digits
    ("+1*********11"); in a SIP or tel URI, its user part so ("sip:+1*********11@pbx.example.com");
    anything else, as many stars as it has characters."""
    if not number:
        return "?"
    uri = URI.match(number)
    if uri is not None:
        return uri["scheme"] + mask_number(uri["user"]) + (uri["host"] or "")
    digits = sum(ch.isdigit() for ch in number)
    if digits < 6:
        return "*" * len(number)
    head = number[:2] if number.startswith("+") else ""
    return head + "*" * (len(number) - len(head) - 2) + number[-2:]


def looks_like_number(value: str) -> bool:
    """A phone number or a SIP/tel URI: what a provider's custom parameter may carry under any name."""
    value = value.strip()
    return bool(URI.match(value) or (PHONE.fullmatch(value) and sum(ch.isdigit() for ch in value) >= 6))


def mask_parameters(parameters: dict[str, str]) -> dict[str, str]:
    """A call's parameters (Twilio's From and To, a Telnyx stream's custom parameters) as the logs may
    show them: every phone number masked, whatever its name."""
    return {name: mask_number(value) if name.lower() in NUMBER_NAMES or looks_like_number(value) else value
            for name, value in parameters.items()}
