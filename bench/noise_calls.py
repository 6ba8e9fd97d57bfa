"""Benchmark: noise on the caller's line while the bot talks (issue 36, "20 minutes of noise-only audio while the bot
talks"), live over /ws with the real models on the defaults.

One call per noise family, each `--minutes` of the bot talking: the caller's device (tests/speakerphone.py, no echo)
streams the room's noise from the moment the call opens (`LEAD_S` before the first question: the line's background,
as the VAD's noise floor learns it), asks a question over it, says nothing while the bot answers (the storyteller's
instructions: long replies, which the reply budget ends at ~15 s), and once the call has been at rest for 2.5 s asks
the next, until the bot's audio received adds up to `--minutes` (or 16 questions a minute were asked: on a line where
the noise stops every reply, the bot never talks that long). The noise stays `--snr` dB below the questions'
active RMS (bench/noise_set.py's families; the held-out ones by default, and a clean line beside them). What the
server did over the noise while the bot talked (the caller silent):
- started: replies beyond one per question (a turn made of noise);
- stopped: replies that ended "interrupted" (the noise taken for the caller);
- held: sounds that paused the bot's audio (speech.started while it talked), and the time paused: from each until
  the reply's next audio arrived or the reply ended, over the bot's talking time (the issue: under 2 %);
- gaps heard: the reply played as it arrives (each chunk once the one before has played), the silences where a
  chunk came late, over the talking time, beside the clean line's (a slow phrase is a gap too, noise or not).
Calls run `--parallel` at a time on one server (the families take turns on the same two cores).

    .venv/bin/python bench/noise_calls.py --minutes 5 --json docs/bench/noise_calls.json
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.client import VoiceClient
from bench.echo_calls import INTERRUPTION, STORYTELLER, pct, wait_audio
from bench.noise_set import HELD, active_rms, noise
from bench.voice_latency import QUESTIONS, question_audio
from bench.voices import Renderer
from models import cpu
from tests.e2e.conftest import start_server, stop_server
from tests.speakerphone import Speakerphone

RATE = 16000
LEAD_S = 5.0  # noise alone before the first question
GAP_S = 0.02  # a late chunk's silence shorter than this is not counted as a gap


def reply_spans(received: list[Any], out_rate: int) -> list[dict[str, Any]]:
    """Each reply's audio as the caller played it: from its first chunk to its response.done, the chunks it got
    (arrival, seconds of audio), played each once the one before has played."""
    spans: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for r in received:
        if r.audio:
            if current is None:
                current = {"first": r.at, "chunks": []}
            current["chunks"].append((r.at, len(r.audio) / 2 / out_rate))
        elif r.event is not None and r.event["type"] == "response.done" and current is not None:
            current["done"] = r.at
            current["status"] = r.event.get("status")
            spans.append(current)
            current = None
    if current is not None:
        current["done"] = received[-1].at
        current["status"] = "unfinished"
        spans.append(current)
    for span in spans:
        clock = span["first"]
        gaps = 0.0
        for at, seconds in span["chunks"]:
            if at > clock + GAP_S:
                gaps += at - clock
            clock = max(clock, at) + seconds
        span["played_end"] = clock
        span["talk_s"] = sum(s for _, s in span["chunks"])
        span["gaps_s"] = gaps
    return spans


def judge(received: list[Any], said_end: float, out_rate: int) -> dict[str, Any]:
    """What the server did after a question was said (`said_end`), the caller silent: the replies, the sounds that
    paused the bot's audio and for how long, the replies stopped, the replies beyond the one asked for."""
    events = [(r.at, r.event) for r in received if r.event is not None]
    spans = reply_spans(received, out_rate)
    dones = [e for _, e in events if e["type"] == "response.done" and e.get("status") != "discarded"]
    holds = []
    for at, e in events:
        if e["type"] != "speech.started" or at < said_end + 0.2:
            continue
        span = next((s for s in spans if s["first"] <= at < s["played_end"]), None)
        if span is None:
            continue  # not while the bot talked
        resumed = next((a for a, _ in span["chunks"] if a > at), span["done"])
        holds.append(min(resumed, span["played_end"]) - at)
    return {
        "replies": [(e.get("turn_id"), e.get("status"), e.get("text", "")[:60]) for e in dones],
        "started": max(0, len(dones) - 1),
        "stopped": sum(1 for e in dones if e.get("status") == "interrupted"),
        "held": len(holds),
        "held_s": round(sum(holds), 3),
        "talk_s": round(sum(s["talk_s"] for s in spans), 3),
        "gaps_s": round(sum(s["gaps_s"] for s in spans), 3),
        "transcripts": [e.get("text", "") for _, e in events if e["type"] == "transcript.final"],
    }


async def rest(client: VoiceClient, phone: Speakerphone, mark: int, settle_s: float = 2.5,
               timeout: float = 120) -> bool:
    """Wait until the caller is silent, a reply has ended, every one begun since `mark` is done and none sent
    anything for settle_s (the noise's own speech.* and transcript events do not count: on a line with a voice in
    the background they never stop). False: no rest in `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = client.received[mark:]
        begun = {r.event.get("turn_id") for r in got if r.event and r.event["type"] == "response.text.delta"}
        done = {r.event.get("turn_id") for r in got if r.event and r.event["type"] == "response.done"}
        last = max((r.at for r in got if r.audio or (r.event and r.event["type"].startswith("response."))),
                   default=0.0)
        if done and begun <= done and not phone.saying() and time.monotonic() - last > settle_s:
            return True
        await asyncio.sleep(0.1)
    return False


def interruption(received: list[Any], began: float) -> dict[str, Any]:
    """The caller said INTERRUPTION at `began`, over the reply: ms to the reply's end as "interrupted", or missed
    (the reply went on); a reply that had already ended, or that the noise stopped first, is neither."""
    dones = [(r.at, r.event) for r in received if r.event is not None and r.event["type"] == "response.done"]
    first = dones[0] if dones else None
    if first is None:
        return {"interrupting": True, "outcome": "no reply"}
    if first[0] < began:
        return {"interrupting": True, "outcome": "stopped first" if first[1].get("status") == "interrupted"
                else "ended first"}
    if first[1].get("status") == "interrupted":
        return {"interrupting": True, "outcome": "stopped", "stop_ms": round((first[0] - began) * 1000, 1)}
    return {"interrupting": True, "outcome": "missed"}


async def interrupted_turn(client: VoiceClient, phone: Speakerphone, tmp: Path, question: str) -> dict[str, Any]:
    mark = len(client.received)
    phone.say(question_audio(question, tmp, RATE))
    try:
        audio_at = await wait_audio(client, mark, 60)
    except TimeoutError:
        return {"interrupting": True, "outcome": "no reply", "question": question}
    await asyncio.sleep(max(0.0, audio_at + 1.5 - time.monotonic()))
    began = phone.say(question_audio(INTERRUPTION, tmp, RATE))
    await rest(client, phone, mark)
    return {**interruption(client.received[mark:], began), "question": question}


async def one_call(url: str, tmp: Path, family: str, track: np.ndarray | None, minutes: float,
                   first: int, max_questions: int, interrupts: int) -> list[dict[str, Any]]:
    client = VoiceClient(url, RATE)
    await client.connect(instructions=STORYTELLER)
    out_rate = client.session.get("output_audio", {}).get("sample_rate", RATE)
    phone = Speakerphone(client, level_db=-300.0, max_s=minutes * 60 * 3 + 300, noise=track)
    phone.start()
    rows: list[dict[str, Any]] = []
    talked = 0.0
    try:
        await asyncio.sleep(LEAD_S)
        k = first
        while talked < minutes * 60 and k - first < max_questions:
            question = QUESTIONS[k % len(QUESTIONS)]
            k += 1
            mark = len(client.received)
            audio = question_audio(question, tmp, RATE)
            said_end = phone.say(audio) + len(audio) / RATE
            rested = await rest(client, phone, mark)
            row = judge(client.received[mark:], said_end, out_rate)
            row["question"] = question
            row["no_rest"] = not rested
            rows.append(row)
            talked += row["talk_s"]
            print(f"  {family:<13} {talked:6.0f} s: {question[:40]!r:<42} talk {row['talk_s']:5.1f} s, "
                  f"held {row['held']} ({row['held_s']:.2f} s), stopped {row['stopped']}, started {row['started']}, "
                  f"gaps {row['gaps_s']:.2f} s", flush=True)
            if not rested:
                break  # the call went wrong: no end to the replies
        for j in range(interrupts):
            got = await interrupted_turn(client, phone, tmp, QUESTIONS[(k + j) % len(QUESTIONS)])
            rows.append(got)
            print(f"  {family:<13} interrupted: {got['outcome']} {got.get('stop_ms', '')}", flush=True)
    finally:
        await phone.stop()
        await client.close()
    return rows


def summary(all_rows: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [r for r in all_rows if not r.get("interrupting")]
    cuts = [r for r in all_rows if r.get("interrupting")]
    stops = [r["stop_ms"] for r in cuts if r.get("stop_ms") is not None]
    talk = sum(r["talk_s"] for r in rows)
    held = [r["held_s"] for r in rows]
    return {
        "questions": len(rows),
        "talk_s": round(talk, 1),
        "started": sum(r["started"] for r in rows),
        "stopped": sum(r["stopped"] for r in rows),
        "held": sum(r["held"] for r in rows),
        "held_s": round(sum(held), 2),
        "held_share": round(sum(held) / talk, 4) if talk else None,
        "gaps_s": round(sum(r["gaps_s"] for r in rows), 2),
        "gaps_share": round(sum(r["gaps_s"] for r in rows) / talk, 4) if talk else None,
        "held_s_per_question_p90": pct(held, 0.9),
        "no_rest": sum(bool(r["no_rest"]) for r in rows),
        "interruptions": len(cuts), "interruptions_stopped": len(stops),
        "interruptions_missed": sum(r["outcome"] == "missed" for r in cuts),
        "stop_ms_p50": pct(stops, 0.5), "stop_ms_p90": pct(stops, 0.9),
    }


async def run(urls: dict[str, str], tmp: Path, tracks: dict[str, np.ndarray | None], args: argparse.Namespace
              ) -> dict[str, list[dict[str, Any]]]:
    """Every family on every server (`urls`: name to /ws URL), `args.parallel` calls at a time."""
    gate = asyncio.Semaphore(args.parallel)
    keys = [(family, server) for family in tracks for server in urls]
    most = max(4, round(args.minutes * 16))

    async def one(i: int, family: str, server: str) -> list[dict[str, Any]]:
        async with gate:
            return await one_call(urls[server], tmp, f"{family}|{server}", tracks[family], args.minutes,
                                  (i // len(urls)) * 3, most, args.interrupts)

    got = await asyncio.gather(*(one(i, f, s) for i, (f, s) in enumerate(keys)))
    return {f"{family} | {server}": rows for (family, server), rows in zip(keys, got, strict=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default=",".join(("clean", *HELD)),
                        help="noise families of bench/noise_set.py, and clean (no noise)")
    parser.add_argument("--snr", type=float, default=10.0, help="the noise this many dB below the questions")
    parser.add_argument("--minutes", type=float, default=5.0, help="the bot's talking time per family")
    parser.add_argument("--parallel", type=int, default=2, help="calls at once")
    parser.add_argument("--interrupts", type=int, default=0, help="per call, after the noise-only turns, so many "
                        "questions whose reply the caller interrupts 1.5 s into its audio (INTERRUPTION, in the noise)")
    parser.add_argument("--baseline", help="a second server beside the defaults, with these settings "
                        "(KEY=VALUE,...: VOICE_AGENT_... environment), every family on both")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--logs", type=Path, help="keep the server's log in this folder")
    args = parser.parse_args()
    families = [f for f in args.families.split(",") if f]
    print(f"CPU: {cpu.describe()}")
    print(f"# {', '.join(families)} at {args.snr} dB SNR; {args.minutes} min of the bot talking each, "
          f"{args.parallel} calls at once", flush=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        spoken = [question_audio(q, tmp, RATE).astype(np.float64) / 32768 for q in QUESTIONS]
        level = float(np.mean([active_rms(s) for s in spoken])) * 10 ** (-args.snr / 20)
        renderer = Renderer()
        tracks: dict[str, np.ndarray | None] = {}
        for i, family in enumerate(families):
            tracks[family] = None if family == "clean" else (noise(family, 180.0, 100 + i, renderer) * level)
            print(f"  made {family}", flush=True)
        configs = {"defaults": {}}
        if args.baseline:
            configs["baseline"] = dict(pair.split("=", 1) for pair in args.baseline.split(","))
        started = {name: start_server(tmp, env) for name, env in configs.items()}
        try:
            rows = asyncio.run(run({name: s.ws_url for name, (s, _) in started.items()}, tmp, tracks, args))
        finally:
            for name, (server, proc) in started.items():
                stop_server(proc)
                if args.logs:
                    args.logs.mkdir(parents=True, exist_ok=True)
                    (args.logs / f"server-{name}.log").write_text(server.log())
    table = {family: summary(r) for family, r in rows.items()}
    print(f"\n{'line | server':<24} {'questions':>9} {'talk s':>7} {'started':>7} {'stopped':>7} {'held':>5} "
          f"{'held s':>7} {'held %':>7} {'gaps s':>7} {'gaps %':>7} {'interrupted: stopped/missed/of, p50/p90 ms':>44}")
    for family, s in table.items():
        held_pct = f"{100 * s['held_share']:.2f}" if s["held_share"] is not None else "-"
        gaps_pct = f"{100 * s['gaps_share']:.2f}" if s["gaps_share"] is not None else "-"
        cut = (f"{s['interruptions_stopped']}/{s['interruptions_missed']}/{s['interruptions']}, "
               f"{s['stop_ms_p50']}/{s['stop_ms_p90']}") if s["interruptions"] else "-"
        print(f"{family:<24} {s['questions']:>9} {s['talk_s']:>7} {s['started']:>7} {s['stopped']:>7} "
              f"{s['held']:>5} {s['held_s']:>7} {held_pct:>7} {s['gaps_s']:>7} {gaps_pct:>7} {cut:>44}")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu.describe(), "args": {k: str(v) for k, v in vars(args).items()},
                                         "summary": table, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
