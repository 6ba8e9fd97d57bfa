"""The real server (app.shutdown.serve, as `voice-agent serve` runs it) over fake engines, named as
fakes: for tests of the server's own behaviour (graceful shutdown, fuzzing over a real socket) that
need a real process and real signals but no models. Settings come from VOICE_AGENT_* variables.

    python -m tests.app.fake_server   # every caller's turn is heard as "hello", every reply is REPLY

FAKE_TOKEN_DELAY_S sets the fake LLM's time per word, FAKE_REPLY its reply. GET /fake/tasks says how
many asyncio tasks the server holds (for bench/soak.py).
"""

from __future__ import annotations

import asyncio
import logging
import os

from fastapi import FastAPI

from app.main import create_app
from app.settings import Settings
from app.shutdown import serve
from models.protocols import Audio
from pipeline.session import Backends
from tests.pipeline.fakes import FakeLLM, FakeRecognizer, FakeSynthesizer, FakeVad

REPLY = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen."


class FakeEchoRecognizer(FakeRecognizer):
    """Hears "hello" in any audio."""

    def __init__(self) -> None:
        super().__init__([])

    def transcribe(self, audio: Audio, beam_size: int | None = None) -> str:
        return "hello"


class FakeEndlessLLM(FakeLLM):
    """Says `reply` to every prompt, a word every `token_delay` seconds."""

    def __init__(self, token_delay: float, reply: str = REPLY) -> None:
        super().__init__([], token_delay)
        self.reply = reply

    @property  # type: ignore[override]
    def replies(self) -> list[str]:
        return [self.reply]  # a fresh list each time: popping never runs it dry

    @replies.setter
    def replies(self, value: list[str]) -> None:
        pass


def fake_backends(token_delay: float = 0.05, reply: str = REPLY) -> Backends:
    return Backends(FakeVad(), FakeEchoRecognizer(), FakeSynthesizer(), FakeEndlessLLM(token_delay, reply))


def create_fake_app() -> FastAPI:
    """The app over fake engines, for any ASGI server: `uvicorn --factory tests.app.fake_server:create_fake_app`."""
    settings = Settings()
    token_delay = float(os.environ.get("FAKE_TOKEN_DELAY_S", "0.05"))
    app = create_app(settings, backends=fake_backends(token_delay, os.environ.get("FAKE_REPLY", REPLY)))

    @app.get("/fake/tasks")
    async def tasks() -> dict[str, int]:
        return {"tasks": len(asyncio.all_tasks())}

    return app


def main() -> None:
    settings = Settings()
    logging.basicConfig(level=settings.server.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(create_fake_app(), settings)


if __name__ == "__main__":
    main()
