"""Benchmark: does a caller's final transcript wait for another call's LLM decoding?

One process, as in the service: faster-whisper (Whisper tiny.en, int8) on the ASR worker and the
embedded LLM (llama.cpp, Qwen2.5-Coder-0.5B Q4_K_M) on its worker, both with every core. It times
the transcript of a spoken question (espeak-ng) alone, and while the LLM generates a long reply for
another conversation, with the CPU gate (the service's default: the LLM waits between steps while
a transcript is made) and without it (the LLM's worker at normal priority, both engines' threads
running at once). Medians of --repeat runs, and the LLM's speed while it shares the CPU.

    .venv/bin/python bench/cpu_sharing.py --json docs/bench/cpu_sharing.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.client import read_wav
from core.clock import MonotonicClock
from core.worker import ModelWorker
from models import cpu
from models.config import AsrConfig, LlmConfig, SpeculativeConfig
from models.llm.llm_factory import load_embedded
from models.protocols import ChatMessage, GenerationDone, SamplingParams
from models.registry import load_asr
from tests.speech import espeak_wav

QUESTION = "Could you book me a table for four people at seven thirty tonight, please?"


async def transcribe_times(asr: Any, worker: ModelWorker, audio: np.ndarray, repeat: int,
                           llm: Any = None) -> tuple[list[float], float]:
    """ASR seconds per run; with `llm`, while it generates (its tokens/s over the whole time)."""
    stop = asyncio.Event()
    produced = 0

    async def generate() -> None:
        nonlocal produced
        while not stop.is_set():
            conversation = llm.conversation()
            async for out in conversation.stream(
                    [ChatMessage("user", "Tell me a long story about a lighthouse keeper.")],
                    SamplingParams(temperature=0.7, max_tokens=48, seed=1)):
                if isinstance(out, GenerationDone):
                    produced += out.stats.completion_tokens
            await conversation.aclose()

    task = asyncio.create_task(generate()) if llm is not None else None
    started = time.perf_counter()
    await asyncio.sleep(0.5 if llm is not None else 0)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        await worker.run(asr.transcribe, audio)
        times.append(time.perf_counter() - t0)
        await asyncio.sleep(0.3)
    stop.set()
    if task is not None:
        await task
    return times, produced / (time.perf_counter() - started)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        samples, rate = read_wav(espeak_wav(QUESTION, Path(tmp) / "q.wav", 16000))
    audio = samples.astype(np.float32) / 32768
    asr = load_asr(AsrConfig())
    asr.transcribe(audio)
    print(f"heard: {asr.transcribe(audio)!r} ({len(audio) / rate:.1f} s of speech)")
    asr_worker = ModelWorker("asr", priority="urgent")
    llm = load_embedded(LlmConfig(speculative=SpeculativeConfig(method="off")), MonotonicClock(), sequences=2)
    llm.warm_up()
    results: dict[str, Any] = {"cpu": cpu.describe(), "question_s": round(len(audio) / rate, 2)}
    cases = [("alone", None, "background"), ("beside a reply, gated (default)", llm, "background"),
             ("beside a reply, not gated", llm, "normal")]
    for name, model, priority in cases:
        llm.worker.priority = priority
        times, tps = await transcribe_times(asr, asr_worker, audio, args.repeat, model)
        results[name] = {"asr_ms_median": round(1000 * statistics.median(times), 1),
                         "asr_ms": [round(1000 * t, 1) for t in times],
                         "llm_tokens_per_second": round(tps, 1) if model is not None else None}
        print(f"{name:34s} ASR {1000 * statistics.median(times):6.0f} ms (median of {len(times)})"
              + (f"; the reply meanwhile at {tps:.1f} tok/s" if model is not None else ""), flush=True)
    await llm.aclose()
    asr_worker.shutdown()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json")
    args = parser.parse_args()
    print(f"CPU: {cpu.describe()}")
    results = asyncio.run(main_async(args))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
