"""/metrics without a key on server.metrics_port (docs/security.md): a tiny HTTP/1.0 server for a
private network (Prometheus in the same compose project), apart from the public port."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)
READ_TIMEOUT_S = 5.0
MAX_REQUEST_BYTES = 8192


async def start_metrics_server(host: str, port: int, render: Callable[[str], tuple[bytes, str]]) -> asyncio.Server:
    """`render(accept)` gives the exposition and its content type (app/metrics.py)."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            method, path = [*head.split(b"\r\n", 1)[0].split(b" "), b"", b""][:2]
            if method in (b"GET", b"HEAD") and path.split(b"?")[0] == b"/metrics":
                body, media_type = render(_accept(head))
                status, content_type = b"200 OK", media_type.encode()
            else:
                body, status, content_type = b"only GET /metrics here\n", b"404 Not Found", b"text/plain"
            writer.write(b"HTTP/1.0 " + status + b"\r\nContent-Type: " + content_type + b"\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n"
                         + (body if method != b"HEAD" else b""))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    server = await asyncio.start_server(answer, host, port, limit=MAX_REQUEST_BYTES)
    log.info("serving /metrics without a key on %s:%d (server.metrics_port)", host, port)
    return server


def _accept(head: bytes) -> str:
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "accept":
            return value.strip()
    return ""
