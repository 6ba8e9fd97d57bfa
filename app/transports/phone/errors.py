"""The error of a provider's REST API (app/transports/phone/dial.py), on its own so that the media
stream (wire.py), which dial.py imports, can catch it too."""

from __future__ import annotations


class DialError(Exception):
    """A call could not be placed or handed on: `status` is the HTTP status to answer, `code` the
    error's name, the text says why."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code
