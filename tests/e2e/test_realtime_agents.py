"""/v1/realtime driven by the OpenAI Agents SDK for Python, unmodified: a `RealtimeAgent` with a
`function_tool`, run by `RealtimeRunner` against the real server and the real models. The caller
speaks (real audio in); the agent's tool runs in the test and the spoken answer (transcribed back)
uses its result."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner

from models.config import AsrConfig
from models.speech.asr_faster_whisper import FasterWhisperRecognizer
from pipeline.audio import resample
from tests.e2e.conftest import Server
from tests.speech import speech_samples, words

pytestmark = pytest.mark.slow


async def test_an_agents_sdk_realtime_agent_calls_its_function_tool_and_speaks_the_result(
        server: Server, tmp_path: Path) -> None:
    looked_up: list[str] = []

    @function_tool
    def get_order_status(order_number: str) -> str:
        """Look up where a customer's order is, by its order number."""
        looked_up.append(order_number)
        return f"Order {order_number} was shipped yesterday and arrives on Friday."

    agent = RealtimeAgent(
        name="Shop assistant",
        instructions="You answer a shop's phone. To say where an order is, call get_order_status with its "
                     "number, then tell the caller what it says in one short sentence.",
        tools=[get_order_status],
    )
    url = server.base_url.replace("http://", "ws://") + "/v1/realtime?model=gpt-realtime"
    session = await RealtimeRunner(agent).run(model_config={"url": url, "api_key": "not-needed-here"})
    seen: list[Any] = []
    audio: list[bytes] = []
    async with session:
        async def read() -> None:
            async for event in session:
                seen.append(event)
                if event.type == "audio":
                    audio.append(event.audio.data)

        reader = asyncio.create_task(read())
        pcm = speech_samples("Where is my order? The number is 4 1 7 7 3.", tmp_path, 24000).astype("<i2").tobytes()
        for i in range(0, len(pcm), 4800):  # 100 ms at 24 kHz, in real time
            await session.send_audio(pcm[i:i + 4800])
            await asyncio.sleep(0.1)
        deadline = asyncio.get_running_loop().time() + 90
        while not _answered(seen):
            assert asyncio.get_running_loop().time() < deadline, [e.type for e in seen]
            await session.send_audio(bytes(4800))
            await asyncio.sleep(0.1)
        reader.cancel()
    kinds = [e.type for e in seen]
    assert "error" not in kinds, [getattr(e, "error", None) for e in seen if e.type == "error"]
    assert looked_up and "".join(ch for ch in looked_up[0] if ch.isdigit()) == "41773", looked_up
    tool_end = next(e for e in seen if e.type == "tool_end")
    assert "Friday" in tool_end.output
    after = kinds.index("tool_end")
    assert "audio" in kinds[after:] and "agent_end" in kinds[after:], kinds
    # the answer's audio, transcribed back, says what the tool found
    spoken = np.frombuffer(b"".join(audio), dtype="<i2").astype(np.float32) / 32768
    heard = words(FasterWhisperRecognizer(AsrConfig()).transcribe(resample(spoken, 24000, 16000)))
    assert "friday" in heard or "shipped" in heard, heard


def _answered(seen: list[Any]) -> bool:
    """A tool ran, and a spoken response after it has ended."""
    kinds = [e.type for e in seen]
    if "tool_end" not in kinds:
        return False
    after = kinds[kinds.index("tool_end"):]
    return "audio" in after and "agent_end" in after[after.index("audio"):]
