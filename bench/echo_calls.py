"""Benchmark: a caller on a speakerphone (issue 36, item 4), live over /ws with the real models, echo cancellation
on and off side by side.

The caller's device is tests/speakerphone.py: it plays the bot's reply as it arrives and its microphone hears it
again through a small room (`--rt60` s), `--delay` ms later and `--level` dB below what was played. Each call asks
`--turns` questions one after another, each once the reply before has ended; every reply is heard back in full.
Per server (echo cancellation on: the defaults; off: session.echo.enabled false and session.echo.own_words false;
the two servers run side by side and take turns at each call) and line (echo at --level dB, or no echo):
- no rest: calls that never came to rest, the bot answering its own echo for 90 s (the call is ended there);
- self-interrupted: replies that ended "interrupted" with the caller silent (the bot took its own voice for the
  caller's): must be 0;
- held: replies whose audio the server paused for a sound while the caller was silent, and the paused time;
- extra replies: replies beyond the caller's turns (one per question, one more for an interruption): the bot's echo
  answered as a turn of its own;
- barge-in: with `--interrupts`, that many more calls (the storyteller's instructions: long replies) where the
  caller says INTERRUPTION over the first reply 1.5 s into its audio: ms from the first sample of their words to
  the first speech.started after it (the bot's audio paused; 0 where a sound was already held) and to the reply
  ended "interrupted" (p50 / p90), and the interruptions missed (the reply went on). A reply stopped before the
  caller began is self-interrupted.
Also the CPU cost per 20 ms frame of cancel_echo on one call (`--cost-only`: that alone).

    .venv/bin/python bench/echo_calls.py --calls 10 --turns 5 --off-calls 4 --clean-calls 2 --interrupts 8 \
        --json docs/bench/echo_calls.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.client import VoiceClient
from bench.voice_latency import QUESTIONS, question_audio
from models import cpu
from pipeline.config import EchoConfig
from pipeline.echo import PlayedTrack, cancel_echo
from pipeline.events import AudioFrame
from tests.e2e.conftest import Server, start_server, stop_server
from tests.speakerphone import Speakerphone, room_response

INTERRUPTION = "Sorry, wait, can I ask about something else?"
STORYTELLER = ("You are a storyteller on a phone call. Whatever you are asked, answer with a long, detailed story of "
               "at least ten sentences. Never stop early.")
RATE = 16000
OFF = {"VOICE_AGENT_SESSION__ECHO__ENABLED": "false", "VOICE_AGENT_SESSION__ECHO__OWN_WORDS": "false"}


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def one_call(url: str, tmp: Path, turns: int, first: int, level_db: float, delay_ms: float, rt60: float,
                   seed: int, interrupt: bool) -> list[dict[str, Any]]:
    """One call of `turns` questions over the speakerphone, each once the call is quiet again; per question what
    the server did while the caller was silent."""
    client = VoiceClient(url, RATE)
    await client.connect(instructions=STORYTELLER if interrupt else None)
    phone = Speakerphone(client, level_db=level_db, delay_ms=delay_ms, rt60_s=rt60, seed=seed)
    phone.start()
    results = []
    try:
        await asyncio.sleep(0.5)
        for k in range(turns):
            question = QUESTIONS[(first + k) % len(QUESTIONS)]
            mark = len(client.received)
            audio = question_audio(question, tmp, RATE)
            said_end = phone.say(audio) + len(audio) / RATE
            began = None
            if interrupt:
                audio_at = await wait_audio(client, mark, 120)
                await asyncio.sleep(max(0.0, audio_at + 1.5 - time.monotonic()))
                began = phone.say(question_audio(INTERRUPTION, tmp, RATE))
            rested = await quiet(client, phone, mark)
            row = judge(client.received[mark:], said_end, began)
            row["question"] = question
            row["no_rest"] = not rested
            results.append(row)
            if not rested:
                break  # the bot answers itself: the call is over
    finally:
        await phone.stop()
        await client.close()
    return results


async def wait_audio(client: VoiceClient, after: int, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in client.received[after:]:
            if r.audio:
                return r.at
        await asyncio.sleep(0.02)
    raise TimeoutError("no reply audio")


async def quiet(client: VoiceClient, phone: Speakerphone, mark: int, settle_s: float = 2.5,
                timeout: float = 90) -> bool:
    """Wait until the caller is silent, every reply begun since `mark` is done, and nothing came for settle_s
    (the last reply's echo has died away, and anything it set off has come out). False: the call never came to
    rest in `timeout` s (the bot kept answering its own echo)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = client.received[mark:]
        begun = {r.event.get("turn_id") for r in got if r.event and r.event["type"] == "response.text.delta"}
        done = {r.event.get("turn_id") for r in got if r.event and r.event["type"] == "response.done"}
        last = max((r.at for r in got), default=0.0)
        if done and begun <= done and not phone.saying() and time.monotonic() - last > settle_s:
            return True
        await asyncio.sleep(0.1)
    return False


def judge(received: list[Any], said_end: float, interrupt_began: float | None) -> dict[str, Any]:
    """What the server did after the question was said (`said_end`): every reply's end, the sounds it paused
    for while the caller was silent, the replies stopped by a sound that began then (the bot's own voice: the
    caller was silent), and with an interruption how soon the bot's audio paused and the reply stopped."""
    events = [(r.at, r.event) for r in received if r.event is not None]
    dones = [e for _, e in events if e["type"] == "response.done" and e.get("status") != "discarded"]
    silent_until = interrupt_began if interrupt_began is not None else float("inf")
    starts = [at for at, e in events if e["type"] == "speech.started"]
    held = [at for at in starts if said_end + 0.2 < at < silent_until]
    self_interrupted = 0
    for at, e in events:
        if e["type"] == "response.done" and e.get("status") == "interrupted" and at < silent_until:
            cause = max((s for s in starts if s <= at), default=None)  # the sound that stopped it
            if cause is not None and said_end + 0.2 < cause:
                self_interrupted += 1  # (once the caller interrupts, what stops a reply is theirs)
    out: dict[str, Any] = {
        "status": dones[0].get("status") if dones else "no reply",
        "held": len(held),
        "self_interrupted": self_interrupted,
        "extra_replies": max(0, len(dones) - (1 if interrupt_began is None else 2)),
        "replies": [(e.get("turn_id"), e.get("status"), e.get("text", "")[:60]) for e in dones],
    }
    if interrupt_began is not None:
        out["interrupting"] = True
        after = [(at, e) for at, e in events if at >= interrupt_began]
        # the bot's audio paused: a sound already held when the caller began counts from their first word
        holding = any(interrupt_began - 1.0 < at < interrupt_began for at in starts)
        paused = interrupt_began if holding else next((at for at in starts if at >= interrupt_began), None)
        stopped = next((at for at, e in after if e["type"] == "response.done" and e.get("status") == "interrupted"),
                       None)
        out["pause_ms"] = None if paused is None else round((paused - interrupt_began) * 1000, 1)
        out["stop_ms"] = None if stopped is None else round((stopped - interrupt_began) * 1000, 1)
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    stops = [r["stop_ms"] for r in rows if r.get("stop_ms") is not None]
    pauses = [r["pause_ms"] for r in rows if r.get("pause_ms") is not None]
    return {
        "replies": len(rows),
        "self_interrupted": sum(r["self_interrupted"] for r in rows),
        "held": sum(r["held"] for r in rows),
        "extra_replies": sum(r["extra_replies"] for r in rows),
        "pause_ms_p50": pct(pauses, 0.5), "pause_ms_p90": pct(pauses, 0.9),
        "stop_ms_p50": pct(stops, 0.5), "stop_ms_p90": pct(stops, 0.9),
        "no_rest": sum(bool(r.get("no_rest")) for r in rows),
        "missed": sum(1 for r in rows if r.get("interrupting") and r.get("stop_ms") is None
                      and not r["self_interrupted"]),
    }


def brief(row: dict[str, Any]) -> str:
    parts = [str(row["status"])]
    if row["held"]:
        parts.append(f"held {row['held']}x")
    if row.get("no_rest"):
        parts.append("NO REST (90 s of replies to its own echo)")
    if row["self_interrupted"]:
        parts.append("SELF-INTERRUPTED")
    if row.get("stop_ms") is not None:
        parts.append(f"stopped in {row['stop_ms']:.0f} ms")
    return " ".join(parts)


async def run(servers: dict[str, Server], args: argparse.Namespace, tmp: Path) -> dict[str, list[dict[str, Any]]]:
    for text in [*QUESTIONS, INTERRUPTION]:  # synthesized before the calls
        question_audio(text, tmp, RATE)
    rows: dict[str, list[dict[str, Any]]] = {}
    lines = [("echo", args.level, False, args.calls), ("no echo", -300.0, False, args.clean_calls)]
    if args.interrupts:
        lines += [("echo, interrupted", args.level, True, args.interrupts),
                  ("no echo, interrupted", -300.0, True, args.interrupts)]
    for line, level, interrupt, calls in lines:
        for i in range(calls):
            order = list(servers) if i % 2 == 0 else list(reversed(servers))
            for name in order:
                if name == "off" and i >= args.off_calls:
                    continue
                turns = 1 if interrupt else args.turns
                got = await one_call(servers[name].ws_url, tmp, turns, i * args.turns, level, args.delay, args.rt60,
                                     i, interrupt)
                rows.setdefault(f"{name} | {line}", []).extend(got)
                print(f"  {name:>3} | {line:<20} call {i + 1}/{calls}: " + ", ".join(map(brief, got)), flush=True)
    return rows


def cost(tmp: Path, seconds: float = 20.0) -> dict[str, float]:
    """ms of CPU per 20 ms frame of the caller's audio in pipeline/echo.py's cancel_echo, on a line without echo
    (the delay searched for, nothing cancelled) and on a speakerphone (found, cancelled and gated), the bot
    talking all along (its questions, one after another)."""
    speech = np.concatenate([question_audio(q, tmp, RATE) for q in QUESTIONS]).astype(np.float32) / 32768
    speech = np.tile(speech, int(np.ceil(seconds * RATE / len(speech))))[:int(seconds * RATE)]
    echo = np.convolve(np.concatenate([np.zeros(RATE // 5, np.float32), speech]), room_response(RATE, 0.3))
    lines = {"no echo": np.zeros(len(speech), np.float32),
             "echo -10 dB": (echo[:len(speech)] * 10 ** (-10 / 20)).astype(np.float32)}
    out = {}
    for name, mic in lines.items():
        track = PlayedTrack()
        frames = [AudioFrame(mic[i:i + 320], 100.0 + (i + 320) / RATE) for i in range(0, len(mic) - 319, 320)]

        async def feed(frames: list[AudioFrame] = frames, track: PlayedTrack = track) -> AsyncIterator[AudioFrame]:
            for frame in frames:
                start = frame.at - 320 / RATE
                i = round((start - 100.0) * RATE)
                track.bot(speech[i:i + 320], RATE, start)
                yield frame

        async def drain(track: PlayedTrack = track, feed: Any = feed) -> float:
            began = time.process_time()
            async for _ in cancel_echo(feed(), track, EchoConfig()):
                pass
            return time.process_time() - began

        out[name] = round(1000 * asyncio.run(drain()) / len(frames), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=10, help="speakerphone calls per server with echo")
    parser.add_argument("--off-calls", type=int, default=10**6,
                        help="at most this many calls per line on the server without echo cancellation")
    parser.add_argument("--clean-calls", type=int, default=2, help="calls per server with no echo on the line")
    parser.add_argument("--turns", type=int, default=5, help="questions per call")
    parser.add_argument("--interrupts", type=int, default=10, help="interrupted calls per server and line")
    parser.add_argument("--level", type=float, default=-10.0, help="echo level, dB below what was played")
    parser.add_argument("--delay", type=float, default=200.0, help="echo delay, ms")
    parser.add_argument("--rt60", type=float, default=0.3, help="the room's reverberation time, s")
    parser.add_argument("--only", choices=("on", "off"), help="one server only")
    parser.add_argument("--cost-only", action="store_true", help="only the CPU cost per frame, no calls")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--logs", type=Path, help="keep the servers' logs in this folder")
    parser.add_argument("--log-words", action="store_true", help="the servers log what the caller said (debugging)")
    args = parser.parse_args()
    print(f"CPU: {cpu.describe()}")
    print(f"# echo {args.level} dB, {args.delay} ms, rt60 {args.rt60} s; {args.calls} calls x {args.turns} turns")
    words = {"VOICE_AGENT_SERVER__LOG_CALLER_CONTENT": "info"} if args.log_words else {}
    configs = {"on": words, "off": {**OFF, **words}}
    if args.only:
        configs = {args.only: configs[args.only]}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        per_frame = cost(tmp)
        print("ms of CPU per 20 ms frame (cancel_echo, one call): "
              + ", ".join(f"{k}: {v}" for k, v in per_frame.items()), flush=True)
        if args.cost_only:
            return
        started = {name: start_server(tmp, env) for name, env in configs.items()}
        try:
            rows = asyncio.run(run({name: s for name, (s, _) in started.items()}, args, tmp))
        finally:
            for name, (server, proc) in started.items():
                stop_server(proc)
                if args.logs:
                    args.logs.mkdir(parents=True, exist_ok=True)
                    (args.logs / f"server-{name}.log").write_text(server.log())
    table = {key: summary(value) for key, value in rows.items()}
    print(f"\n{'server | line':<34} {'replies':>7} {'self-int':>8} {'held':>5} {'extra':>5} "
          f"{'pause p50/p90':>14} {'stop p50/p90':>14} {'missed':>6} {'no rest':>7}")
    for key, s in table.items():
        pause = f"{s['pause_ms_p50']}/{s['pause_ms_p90']}" if s["pause_ms_p50"] is not None else "-"
        stop = f"{s['stop_ms_p50']}/{s['stop_ms_p90']}" if s["stop_ms_p50"] is not None else "-"
        print(f"{key:<34} {s['replies']:>7} {s['self_interrupted']:>8} {s['held']:>5} {s['extra_replies']:>5} "
              f"{pause:>14} {stop:>14} {s['missed']:>6} {s['no_rest']:>7}")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu.describe(),
                                         "args": {k: str(v) for k, v in vars(args).items()},
                                         "cost_ms_per_frame": per_frame, "summary": table, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
