"""Benchmark: voice-to-voice latency through /ws, as a caller experiences it.

Streams spoken questions (espeak-ng) to the service in real time in 20 ms frames, each on a fresh
call, and prints per-stage p50/p95 of the turn's latency marks (ms since the server's speech_end)
and the true voice-to-voice latency: from the end of speech in the input audio to the first reply
audio byte received by the client.

    .venv/bin/python bench/voice_latency.py                 # starts its own server (defaults)
    .venv/bin/python bench/voice_latency.py --url ws://127.0.0.1:8000/ws --repeat 3
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.client import VoiceClient, read_wav
from models import cpu
from pipeline.turns import MARKS
from tests.e2e.conftest import start_server, stop_server
from tests.speech import espeak_wav

QUESTIONS = [
    "What is the capital of France?",
    "How many days are there in a week?",
    "Can you book a table for two at eight tonight?",
    "What time do you open on Sunday?",
    "I would like to order a large pepperoni pizza.",
    "What is the weather usually like in London in spring?",
    "Tell me a fun fact about octopuses.",
    "How do I reset my password?",
]
FRAME_MS = 20


def speech_end_s(samples: np.ndarray, rate: int) -> float:
    """Seconds into the clip where the last sound above -40 dBFS ends."""
    loud = np.flatnonzero(np.abs(samples.astype(np.float32)) > 32768 * 0.01)
    return (loud[-1] + 1) / rate if len(loud) else 0.0


async def one_call(url: str, question: str, tmp: Path, rate: int) -> dict:
    samples, _ = read_wav(espeak_wav(question, tmp / f"q{abs(hash(question))}.wav", rate))
    lead = np.zeros(int(0.3 * rate), dtype=np.int16)
    audio = np.concatenate([lead, samples])
    end_in_clip = len(lead) / rate + speech_end_s(samples, rate)
    client = VoiceClient(url, rate)
    await client.connect()
    start = time.monotonic()
    # the frame holding the last speech sample leaves at this frame's start time
    true_end = start + int(end_in_clip * 1000) // FRAME_MS * FRAME_MS / 1000
    await client.stream(audio, FRAME_MS)
    trailing = asyncio.create_task(client.silence(20))
    done = await client.wait_for(lambda e: e["type"] == "response.done", 120)
    trailing.cancel()
    first_audio = next((r.at for r in client.received if r.audio), None)
    final = client.events("transcript.final")
    await client.close()
    return {
        "question": question,
        "heard": final[0]["text"] if final else "",
        "reply": done["text"],
        "status": done["status"],
        "marks": done["latency_ms"],
        "server_v2v": done.get("voice_to_voice_ms"),
        "true_v2v": (first_audio - true_end) * 1000 if first_audio else None,
        "tokens_per_second": done.get("llm", {}).get("tokens_per_second"),
    }


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run(url: str, repeat: int, rate: int) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeat):
            for question in QUESTIONS:
                r = await one_call(url, question, Path(tmp), rate)
                results.append(r)
                print(f"  {r['true_v2v'] or float('nan'):6.0f} ms  heard {r['heard']!r} -> {r['reply'][:60]!r}",
                      flush=True)
    print(f"\n{len(results)} turns; ms since speech_end (the server's end-of-turn decision)")
    print(f"{'stage':22s} {'p50':>7} {'p95':>7}")
    for mark in MARKS[1:]:
        values = [r["marks"][mark] for r in results if mark in r["marks"]]
        if values:
            print(f"{mark:22s} {statistics.median(values):7.0f} {pct(values, 0.95):7.0f}")
    for name, key in (("voice-to-voice (true)", "true_v2v"), ("voice-to-voice (server)", "server_v2v")):
        values = [r[key] for r in results if r[key] is not None]
        if values:
            print(f"{name:22s} {statistics.median(values):7.0f} {pct(values, 0.95):7.0f}")
    # Every call here is a fresh call, so each turn is a call's first turn.
    after_final = [r["marks"]["llm_first_token"] - r["marks"]["asr_final"] for r in results
                   if "llm_first_token" in r["marks"] and "asr_final" in r["marks"]]
    if after_final:
        print(f"{'first token - final':22s} {statistics.median(after_final):7.0f} {pct(after_final, 0.95):7.0f}"
              "   (a call's first turn: ms from the final transcript to the first LLM token)")
    tps = [r["tokens_per_second"] for r in results if r["tokens_per_second"]]
    if tps:
        print(f"LLM tokens/s median {statistics.median(tps):.1f}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running service's /ws URL (default: start one)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--rate", type=int, default=16000)
    parser.add_argument("--set", action="append", default=[], metavar="VOICE_AGENT_X=Y",
                        help="a setting for the server this script starts (repeatable)")
    parser.add_argument("--json", help="also write every turn to this file")
    args = parser.parse_args()
    print(f"CPU: {cpu.describe()}")
    env: dict[str, str] = {}
    if args.url:
        results = asyncio.run(run(args.url, args.repeat, args.rate))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            env = {"VOICE_AGENT_LLM__TEMPERATURE": "0.7", **dict(s.split("=", 1) for s in args.set)}
            print("server settings:", env)
            server, proc = start_server(Path(tmp), env=env)
            try:
                results = asyncio.run(run(server.ws_url, args.repeat, args.rate))
            finally:
                stop_server(proc)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), "settings": env, "turns": results}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
