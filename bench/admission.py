"""Admission from outside, on the defaults, with the real models: what a client sees.

    .venv/bin/python bench/admission.py [--out docs/bench/admission]

Starts `voice-agent serve` with its default settings (the embedded CPU models; only the Twilio
credentials the phone case needs are set) and, as clients would:
1. asks for /api/calls, /qa, /v1/models and /ws naming a rebinding Host (attacker.example), and the
   same with the server's own;
2. makes 10 calls from one address, never more than 4 open, each caller calling again as soon as
   its call ends (a call centre's gateway);
3. makes 20 calls from 8 addresses, 8 open at a time (every call slot), the same way;
4. places a Twilio call (webhook, TwiML, signed stream that hands back its <Parameter>s), then
   replays its captured stream after it ended, and places a fresh call after that.
Each call asks one spoken question (hibari's voice) and waits for its reply. Prints a table (and
with --out, writes OUT.txt and OUT.json with every call's outcome).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import publish
from bench.voice_latency import question_audio
from models import cpu
from tests.e2e.conftest import Server, start_server, stop_server
from tests.phone_sim import PhoneSim, call_records, dial

QUESTIONS = ["What is the capital of France?", "How many days are there in a week?",
             "What color is the sky on a clear day?", "Name a fruit that is yellow."]
PUBLIC_URL = "https://voice.example.test"
AUTH_TOKEN = "bench-admission-twilio-token"
RATE = 16000
FRAME = RATE // 50


async def one_call(server: Server, source: str, audio: np.ndarray) -> dict[str, Any]:
    """One /ws call from `source`: a question, its reply, hang up."""
    started = time.monotonic()
    try:
        async with websockets.connect(server.ws_url, local_addr=(source, 0), max_size=None) as ws:
            await ws.send(json.dumps({"type": "session.start", "audio": {"sample_rate": RATE}}))
            first = json.loads(await ws.recv())
            if first["type"] != "session.started":
                return {"source": source, "outcome": f"refused: {first.get('code')}"}
            pcm = np.concatenate([np.zeros(RATE // 4, np.int16), audio, np.zeros(RATE * 2, np.int16)])
            sender = asyncio.create_task(_stream(ws, pcm))
            try:
                async with asyncio.timeout(120):
                    while True:
                        message = await ws.recv()
                        if isinstance(message, str) and (event := json.loads(message))["type"] == "response.done":
                            ok = event["status"] == "completed" and bool(event["text"])
                            return {"source": source, "outcome": "answered" if ok else f"reply {event['status']}",
                                    "reply": event["text"], "seconds": round(time.monotonic() - started, 2)}
            finally:
                sender.cancel()
    except websockets.ConnectionClosed as exc:
        return {"source": source, "outcome": f"refused: close {exc.rcvd.code if exc.rcvd else '?'} "
                                             f"{exc.rcvd.reason if exc.rcvd else ''}"}
    except TimeoutError:
        return {"source": source, "outcome": "no reply in 120 s"}


async def _stream(ws: Any, pcm: np.ndarray) -> None:
    """The caller's line in real time: the question, then silence until hung up."""
    start = time.monotonic()
    for i, offset in enumerate(range(0, 1 << 40, FRAME)):
        chunk = pcm[offset:offset + FRAME] if offset < len(pcm) else np.zeros(FRAME, np.int16)
        await asyncio.sleep(max(0.0, start + i * 0.02 - time.monotonic()))
        await ws.send(chunk.astype("<i2").tobytes())


async def calls(server: Server, sources: list[str], total: int, audio: list[np.ndarray]) -> list[dict[str, Any]]:
    """`total` calls, one caller per source, each calling again as soon as its call ends."""
    left = iter(range(total))
    done: list[dict[str, Any]] = []

    async def caller(source: str) -> None:
        for n in left:
            done.append(await one_call(server, source, audio[n % len(audio)]))

    await asyncio.gather(*(caller(s) for s in sources))
    return done


def rebinding(server: Server) -> list[dict[str, Any]]:
    port = server.base_url.rsplit(":", 1)[1]
    rows = []
    for host in (f"attacker.example:{port}", f"127.0.0.1:{port}"):
        for path in ("/api/calls", "/qa", "/v1/models"):
            status = httpx.get(server.base_url + path, headers={"host": host}, timeout=10).status_code
            rows.append({"host": host, "path": path, "status": status})
        rows.append({"host": host, "path": "/ws", "status": asyncio.run(_ws_status(server, host, port))})
    return rows


async def _ws_status(server: Server, host: str, port: str) -> int:
    try:
        async with websockets.connect(f"ws://{host}/ws", host="127.0.0.1", port=int(port),
                                      origin=websockets.Origin(f"http://{host}")):
            return 101
    except websockets.InvalidStatus as exc:
        return int(exc.response.status_code)


async def phone(server: Server, audio: np.ndarray, tmp: Path) -> list[dict[str, Any]]:
    ws_base = server.base_url.replace("http://", "ws://")
    rows = []
    first = await dial(server.base_url, ws_base, PUBLIC_URL, AUTH_TOKEN)
    rows.append(await _phone_question(server, first, audio, "fresh call"))
    await first.hangup()
    replay = PhoneSim(first.url, auth_token=AUTH_TOKEN, signed_url=first.signed_url,
                      parameters=dict(first.parameters), call_sid=first.call_sid, stream_sid=first.stream_sid)
    await replay.connect()
    try:
        await replay.wait_until(lambda: replay.closed, 20)
        rows.append({"case": "replayed stream", "outcome": f"closed {replay.close_code}"})
    except TimeoutError:
        rows.append({"case": "replayed stream", "outcome": "accepted: still open after 20 s"})
        await replay.hangup()
    fresh = await dial(server.base_url, ws_base, PUBLIC_URL, AUTH_TOKEN)
    rows.append(await _phone_question(server, fresh, audio, "fresh call after the replay"))
    await fresh.hangup()
    return rows


async def _phone_question(server: Server, sim: PhoneSim, audio: np.ndarray, case: str) -> dict[str, Any]:
    from pipeline.audio import resample

    await asyncio.sleep(0.4)
    await sim.say((resample(audio.astype(np.float32) / np.float32(32768), RATE, 8000) * 32767).astype(np.int16))
    deadline = time.monotonic() + 120
    while not (done := call_records(server.log(), sim.call_sid)):
        if time.monotonic() > deadline:
            return {"case": case, "outcome": "no reply in 120 s"}
        await asyncio.sleep(0.1)
    return {"case": case, "outcome": "answered" if done[0]["status"] == "completed" else done[0]["status"],
            "reply": done[0]["text"]}


def table(results: dict[str, Any]) -> str:
    lines = [f"Admission on the defaults, real models ({cpu.describe()})", ""]
    lines += ["| Host | path | status |", "| --- | --- | ---: |"]
    lines += [f"| {r['host']} | {r['path']} | {r['status']} |" for r in results["rebinding"]]
    for name, title in (("one_address", "10 calls from one address, 4 at a time"),
                        ("eight_addresses", "20 calls from 8 addresses, 8 at a time")):
        rows = results[name]
        answered = sum(r["outcome"] == "answered" for r in rows)
        other = sorted({r["outcome"] for r in rows} - {"answered"})
        seconds = sorted(r["seconds"] for r in rows if "seconds" in r)
        median = seconds[len(seconds) // 2] if seconds else float("nan")
        lines += ["", f"{title}: {answered} of {len(rows)} answered (median call {median:.1f} s)"
                  + (f"; others: {', '.join(other)}" if other else "")]
    lines += ["", "| Twilio | outcome |", "| --- | --- |"]
    lines += [f"| {r['case']} | {r['outcome']} |" for r in results["phone"]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write OUT.txt (the table) and OUT.json (every call)")
    args = parser.parse_args()
    print(cpu.describe(), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        env = {"VOICE_AGENT_TWILIO__AUTH_TOKEN": AUTH_TOKEN, "VOICE_AGENT_TWILIO__PUBLIC_URL": PUBLIC_URL,
               "VOICE_AGENT_LLM__TEMPERATURE": "0.7"}  # start_server's default is 0: back to the service's
        server, proc = start_server(Path(tmp), env=env)
        try:
            audio = [question_audio(q, Path(tmp), RATE, "-admission") for q in QUESTIONS]
            results: dict[str, Any] = {"rebinding": rebinding(server)}
            results["one_address"] = asyncio.run(calls(server, ["127.0.0.51"] * 4, 10, audio))
            results["eight_addresses"] = asyncio.run(calls(server, [f"127.0.0.{60 + n}" for n in range(8)], 20, audio))
            results["phone"] = asyncio.run(phone(server, audio[0], Path(tmp)))
        finally:
            stop_server(proc)
    rows = [{"part": part, **row} for part, part_rows in results.items() for row in part_rows]
    publish(table(results), rows, args.out)


if __name__ == "__main__":
    main()
