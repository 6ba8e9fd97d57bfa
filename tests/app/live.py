"""A real uvicorn server on a free loopback port, for tests that need a real socket (WebSocket
handshakes, close codes and reasons as a real client sees them): in a thread of its own (`live`), or
in the test's own event loop (`serving`), where the test also reaches the app's runtime."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp

from app.main import create_app
from app.settings import ServerConfig, Settings
from app.store.config import StorageConfig
from pipeline.session import Backends
from tests.pipeline.fakes import FakeLLM, FakeRecognizer, FakeSynthesizer, FakeVad


def fake_app(**server: Any) -> FastAPI:
    """The app with fake engines (named as fakes) and no call store."""
    settings = Settings(server=ServerConfig(**server), storage=StorageConfig(enabled=False))
    backends = Backends(FakeVad(), FakeRecognizer([]), FakeSynthesizer(), FakeLLM([]))  # type: ignore[arg-type]
    return create_app(settings, backends=backends)


@contextmanager
def live(app: ASGIApp) -> Iterator[str]:
    """Serves `app`; yields its address as host:port."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on",
                                           proxy_headers=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@asynccontextmanager
async def serving(app: FastAPI, stop_s: float = 10) -> AsyncIterator[str]:
    """Serves `app` in the running event loop; yields its address as host:port once the runtime is
    ready (the app's start-up done)."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()  # the server's own error
            raise RuntimeError("the test server stopped before it started")
        await asyncio.sleep(0.01)
    await app.state.runtime.ready.wait()
    try:
        yield f"127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, stop_s)
