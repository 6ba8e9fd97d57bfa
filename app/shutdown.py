"""Serving under uvicorn with a graceful shutdown (docs/reliability.md).

uvicorn, on SIGTERM or Ctrl-C, closes every WebSocket at once (1012) and only then runs the app's
lifespan shutdown: calls would be cut mid-word. Here the first signal drains instead: the server
keeps listening but refuses new calls (1013 "shutting down", /v1 503, /healthz 503 "draining"),
each call in progress finishes its reply (up to server.drain_timeout_s) and says goodbye
(Runtime.drain), and only then uvicorn shuts down; the lifespan's Runtime.aclose flushes the call
store. The process exits 0. A second signal shuts down at once, as plain uvicorn does.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from types import FrameType

import uvicorn
from fastapi import FastAPI

from app.runtime import Runtime
from app.settings import Settings

log = logging.getLogger(__name__)
GRACE_S = 5.0  # after server.drain_timeout_s: for goodbyes, sessions stopping and uvicorn's own shutdown


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, runtime: Runtime) -> None:
        super().__init__(config)
        self.runtime = runtime
        self.loop: asyncio.AbstractEventLoop | None = None
        self.drain_task: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Called from the signal handler: the first signal starts the drain on the loop; the next
        ones are uvicorn's (shut down now, then force)."""
        if self.loop is None or self.drain_task is not None or self.should_exit:
            super().handle_exit(sig, frame)
            return
        self.loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        if self.drain_task is None and not self.should_exit:
            log.info("shutting down: draining calls (a second signal stops at once)")
            self.drain_task = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        try:
            await self.runtime.drain(GRACE_S)
        finally:
            self.should_exit = True  # uvicorn's main loop sees it within 0.1 s


def serve(app: FastAPI, settings: Settings) -> None:
    """Run `app` (from app.main.create_app) under uvicorn until SIGTERM or Ctrl-C, then drain."""
    server = settings.server
    ws_max_size = max(server.max_frame_bytes, server.max_text_bytes, settings.phone.max_frame_bytes) * 4
    config = uvicorn.Config(app, host=server.host, port=server.port, log_level=server.log_level,
                            ws_max_size=ws_max_size, timeout_graceful_shutdown=int(GRACE_S),
                            # proxy headers are the app's to trust (server.trusted_proxies, app/main.py):
                            # uvicorn's default trusts loopback, whose X-Forwarded-For anyone on it may write
                            proxy_headers=False)
    DrainingServer(config, app.state.runtime).run()
