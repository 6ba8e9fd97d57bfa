"""Tool calls through the whole voice pipeline, per LLM pack: does a spoken request reach the right tool
with the right arguments, how soon, and does the agent stay honest where no tool can help?

The labelled set (--requests four, the default) is bench/tool_set.py's SPOKEN: 48 requests to four tools
(booking, order status, opening hours, cancelling) and 24 that need none (12 that no declared tool can
check or do, 12 small talk), split into "tune" (what the default prompt and the schemas were adjusted on)
and "held" (only run for the report). --requests wide: bench/tool_set_wide.py's 66 tool requests over six
tools (6 of them needing two calls, judged right when every expected call and no other was made) and 30
that need none.
Each is rendered in the chosen voices (bench/voices.py), streamed in real time to a server started here
(`/ws`, real ASR, turn detection, LLM and TTS) that declares the four tools in session.start
(tool_choice "auto", the default tools prompt). The client runs the tools: stand-ins for the business's
systems (FAKE_RESULTS, named as fakes) that answer after --tool-ms.

Per request: the calls (name, arguments, malformed or not), the time from the true end of speech to the
`response.function_call` (the tool dispatched), the first audio of the answer (from the end of speech and
from the tool's result), and the reply's words. A request that needs no tool and gets a call is a false
call; a reply to an "uncheckable" request (or to a tool request that got no call) that does not say it
cannot check is counted as invented (the DECLINE words decide; every such reply is printed for review).

    .venv/bin/python bench/tool_calls.py --json docs/bench/tool_calls.json | tee docs/bench/tool_calls.txt
    .venv/bin/python bench/tool_calls.py --split tune --packs qwen2.5-coder-0.5b-instruct-q4_k_m --voices hibari-heart
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tool_set import SPOKEN, SPOKEN_TOOLS  # bench/tool_set.py, beside this script
from tool_set_wide import WIDE, WIDE_TOOLS, Request

from app.client import VoiceClient
from bench.turn_set import pick_voices
from bench.voice_latency import FRAME_MS, speech_end_s
from bench.voices import Renderer, families
from models import cpu
from models.config import LlmConfig
from tests.e2e.conftest import start_server, stop_server

PACKS = ["qwen2.5-coder-0.5b-instruct-q4_k_m", "qwen2.5-coder-1.5b-instruct-q4_k_m"]
DEFAULTS = "defaults"  # as --packs: the configured llm.model and llm.tools_model, as a deployment runs them
VOICES = ["hibari-heart", "piper-joe"]  # the tuned voice and one never tuned on
# the caller says it cannot check or do it: "I can't check the weather here", "I'm unable to ..."
DECLINE = re.compile(r"\b(can ?not|can'?t|cannot|unable|not able|don'?t have|do not have|no (?:way|access)|"
                     r"not (?:sure|possible|available)|I'?m afraid|couldn'?t|could not|don'?t know|do not know|"
                     r"isn'?t something|not something|no tool)\b", re.IGNORECASE)
# a promise to check or do something ("Let me check.", "I can check the pharmacy's stock"): kept only with a call
PROMISE = re.compile(r"\b(let me (?:check|look|see|find)|I'?ll (?:check|look|find)|I will (?:check|look|find)|"
                     r"I can (?:check|look)|one moment|checking (?:on|for|that))\b", re.IGNORECASE)


def fake_result(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """FAKE_RESULTS: what the business's systems would answer (a fake: the agent is what is measured)."""
    if name == "book_table":
        return {"booked": True, "confirmation": "B-1042", **args}
    if name == "order_status":
        return {"order_number": args.get("order_number"), "status": "shipped", "expected_delivery": "Thursday"}
    if name == "opening_hours":
        return {**args, "opens": "08:00", "closes": "18:00"}
    if name == "cancel_appointment":
        return {"cancelled": True, **args}
    if name == "get_weather":
        return {**args, "forecast": "sunny", "high_c": 21, "low_c": 12}
    if name == "find_booking":
        return {"found": True, "last_name": args.get("last_name"), "party_size": 2, "day": "Friday", "time": "19:30"}
    return {"error": f"unknown tool {name}"}


# --requests: the labelled set and the tools declared for it
REQUEST_SETS: dict[str, tuple[list[Request], list[dict[str, Any]]]] = {
    "four": ([Request(s.text, (s.call,) if s.call else (), s.split, s.kind) for s in SPOKEN], SPOKEN_TOOLS),
    "wide": (WIDE, WIDE_TOOLS),
}


def normal(value: Any) -> Any:
    """Arguments compared as a careful reader would: strings without case or outer spaces."""
    if isinstance(value, str):
        return value.strip().casefold()
    if isinstance(value, dict):
        return {k: normal(v) for k, v in value.items()}
    return value


def malformed(name: str, arguments: str, tools: list[dict[str, Any]]) -> str:
    """Why a call is malformed ('' if it is not): unknown tool, not JSON, or not valid for its schema."""
    schema = next((t["parameters"] for t in tools if t["name"] == name), None)
    if schema is None:
        return f"unknown tool {name!r}"
    try:
        jsonschema.validate(json.loads(arguments), schema)
    except (ValueError, jsonschema.ValidationError) as exc:
        return str(exc).splitlines()[0]
    return ""


async def one_request(url: str, item: Request, samples: np.ndarray, tool_ms: int, tools: list[dict[str, Any]],
                      declare: bool = True) -> dict[str, Any]:
    """One call: the request, spoken; the client runs the tools; until the answer's response.done."""
    client = VoiceClient(url, 16000)
    returned: list[float] = []

    async def tool(name: str, args: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(tool_ms / 1000)
        returned.append(time.monotonic())
        return fake_result(name, args)

    client.tool_handler = tool
    started = await client.connect(tools=tools, tool_choice="auto") if declare else await client.connect()
    if started.get("type") != "session.started":
        raise SystemExit(f"session.start refused: {started}")
    lead = np.zeros(int(0.3 * 16000), dtype=np.int16)
    audio = np.concatenate([lead, samples])
    end_in_clip = len(lead) / 16000 + speech_end_s(samples, 16000)
    start = time.monotonic()
    true_end = start + int(end_in_clip * 1000) // FRAME_MS * FRAME_MS / 1000
    await client.stream(audio, FRAME_MS)
    trailing = asyncio.create_task(client.silence(40))
    try:
        done = await client.wait_for(lambda e: e["type"] == "response.done" and e["status"] != "tool_calls"
                                     and not e.get("filler"), 120)
    finally:
        trailing.cancel()
    calls = [(r.at, r.event) for r in client.received if r.event and r.event["type"] == "response.function_call"]
    # the answer's audio: after the results, and after the audio of the reply that made the calls (words
    # before them, an acknowledgement), which is all sent before its response.done
    calls_done = next((r.at for r in client.received if r.event and r.event["type"] == "response.done"
                       and r.event["status"] == "tool_calls"), 0.0)
    answer_audio = next((r.at for r in client.received
                         if r.audio and returned and r.at > max(returned[-1], calls_done)), None)
    first_audio = next((r.at for r in client.received if r.audio), None)
    replies = [e["text"] for e in client.events("response.done") if not e.get("filler")]
    heard = client.events("transcript.final")
    await client.close()
    return {
        "text": item.text, "split": item.split, "kind": item.kind if declare or item.kind == "chat" else "uncheckable",
        # the first expected call (name, arguments); every one of them where a request needs several
        "expected": list(item.calls[0]) if item.calls and declare else None,
        "expected_calls": [list(c) for c in item.calls] if declare else [],
        "heard": " ".join(e["text"] for e in heard),
        "calls": [{"name": e["name"], "arguments": e["arguments"],
                   "malformed": malformed(e["name"], e["arguments"], tools),
                   "after_speech_ms": round((at - true_end) * 1000)} for at, e in calls],
        "reply": " ".join(t for t in replies if t),
        "status": done["status"],
        "answer_first_audio_ms": round((answer_audio - true_end) * 1000) if answer_audio else None,
        "result_to_answer_audio_ms": round((answer_audio - returned[-1]) * 1000) if answer_audio else None,
        "first_audio_ms": round((first_audio - true_end) * 1000) if first_audio else None,
        "server_marks": done.get("latency_ms"),
        # each LLM step's prompt cost and first token (the follow-up's: from the results to its first token)
        "llm_steps": done.get("llm_steps") or [],
    }


def judge(r: dict[str, Any]) -> dict[str, Any]:
    """The request's verdicts: right tool, exact arguments, false call, malformed, invented."""
    calls, expected = r["calls"], r["expected"]
    first = calls[0] if calls else None
    out = {"malformed": sum(1 for c in calls if c["malformed"])}
    honest = bool(DECLINE.search(r["reply"]))
    out["promise_without_call"] = not calls and bool(PROMISE.search(r["reply"]))
    wanted = r.get("expected_calls") or []
    if len(wanted) > 1:  # every expected call made (in any order), and no other
        made = sorted(c["name"] for c in calls)
        out["right_tool"] = made == sorted(name for name, _ in wanted)
        given = [normal(json.loads(c["arguments"])) for c in calls if not c["malformed"]]
        out["exact_args"] = out["right_tool"] and all(normal(a) in given for _, a in wanted)
        out["invented"] = not calls and not honest
    elif expected:
        args = json.loads(first["arguments"]) if first and not first["malformed"] else None
        out["right_tool"] = bool(first) and first["name"] == expected[0]
        out["exact_args"] = out["right_tool"] and normal(args) == normal(expected[1])
        out["invented"] = not calls and not honest
    else:
        out["false_call"] = bool(calls)
        out["invented"] = r["kind"] == "uncheckable" and not calls and not honest
    return out


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return float(np.percentile(values, q))


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    tool = [r for r in results if r["expected"]]
    none = [r for r in results if not r["expected"]]
    unc = [r for r in none if r["kind"] == "uncheckable"]
    dispatch = [r["calls"][0]["after_speech_ms"] for r in tool if r["calls"]]
    answer = [r["answer_first_audio_ms"] for r in tool if r["answer_first_audio_ms"] is not None]
    after_result = [r["result_to_answer_audio_ms"] for r in tool if r["result_to_answer_audio_ms"] is not None]
    follow_ups = [s for r in tool for s in r.get("llm_steps", []) if s["step"] > 1]
    no_tool_audio = [r["first_audio_ms"] for r in none if not r["calls"] and r.get("first_audio_ms") is not None]
    return {
        "requests": len(results), "tool_requests": len(tool), "no_tool_requests": len(none),
        "right_tool": sum(r["verdict"]["right_tool"] for r in tool),
        "exact_args": sum(r["verdict"]["exact_args"] for r in tool),
        "false_calls": sum(r["verdict"]["false_call"] for r in none),
        "uncheckable": len(unc),
        "invented_no_tool": sum(r["verdict"]["invented"] for r in unc),
        "invented_tool_requests": sum(r["verdict"]["invented"] for r in tool),
        "malformed": sum(r["verdict"]["malformed"] for r in results),
        "promises_without_call": sum(r["verdict"].get("promise_without_call", False) for r in results),
        "calls": sum(len(r["calls"]) for r in results),
        "dispatch_p50_ms": pct(dispatch, 50), "dispatch_p90_ms": pct(dispatch, 90),
        "answer_audio_p50_ms": pct(answer, 50), "answer_audio_p90_ms": pct(answer, 90),
        "result_to_answer_p50_ms": pct(after_result, 50),
        "follow_up_first_token_p50_ms": pct([s["time_to_first_token_ms"] for s in follow_ups], 50),
        "follow_up_prefill_tokens_p50": pct([s["prefill_tokens"] for s in follow_ups], 50),
        "no_tool_first_audio_p50_ms": pct(no_tool_audio, 50),
        # the first sound a tool request's caller hears (an acknowledgement, a filler or the answer)
        "tool_first_audio_p50_ms": pct([r["first_audio_ms"] for r in tool if r.get("first_audio_ms") is not None], 50),
    }


def table_row(name: str, s: dict[str, Any]) -> str:
    def share(n: int, d: int) -> str:
        return f"{n}/{d} ({100 * n / d:.0f} %)" if d else "-"

    def ms(v: float | None) -> str:
        return f"{v:.0f}" if v is not None else "-"

    return (f"| {name} | {share(s['right_tool'], s['tool_requests'])} | {share(s['exact_args'], s['tool_requests'])} "
            f"| {share(s['false_calls'], s['no_tool_requests'])} | {share(s['invented_no_tool'], s['uncheckable'])} "
            f"| {s['malformed']} of {s['calls']} | {ms(s['dispatch_p50_ms'])} / {ms(s['dispatch_p90_ms'])} "
            f"| {ms(s['tool_first_audio_p50_ms'])} | {ms(s['answer_audio_p50_ms'])} "
            f"| {ms(s['result_to_answer_p50_ms'])} "
            f"| {ms(s['follow_up_first_token_p50_ms'])} ({ms(s['follow_up_prefill_tokens_p50'])}) "
            f"| {ms(s['no_tool_first_audio_p50_ms'])} | {share(s['promises_without_call'], s['requests'])} |")


HEADER = ("| pack, voice, split | right tool | exact arguments | false calls | invented (uncheckable) | malformed "
          "| speech end → dispatched p50 / p90 ms | → first audio heard p50 ms | → answer's first audio p50 ms "
          "| result → answer audio p50 ms "
          "| follow-up's first token p50 ms (prefill tokens) | no-tool reply's first audio p50 ms "
          "| promises without a call |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")


async def run_pack(pack: str, voices: list[Any], items: list[Request], tools: list[dict[str, Any]], tool_ms: int,
                   settings: dict[str, str], renderer: Renderer, declare: bool = True) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        # "defaults": the service's own choice (llm.model, and llm.tools_model for calls with tools)
        models = {} if pack == DEFAULTS else {"VOICE_AGENT_LLM__MODEL": pack, "VOICE_AGENT_LLM__TOOLS_MODEL": pack}
        env = {**models, **settings}
        server, proc = start_server(Path(tmp), env)
        try:
            for voice in voices:
                for item in items:
                    audio = renderer.say(voice, item.text)
                    samples = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
                    r = await one_request(server.ws_url, item, samples, tool_ms, tools, declare)
                    r["pack"], r["voice"] = pack, voice.name
                    r["verdict"] = judge(r)
                    if r["status"] == "failed":
                        errors = [line for line in server.log().splitlines() if "ERROR" in line or "Error" in line]
                        print("  the reply failed; the server's log says:\n    " + "\n    ".join(errors[-3:]))
                    results.append(r)
                    print(f"  {voice.name:18s} {item.split} {item.kind:11s} heard {r['heard']!r}\n"
                          f"      calls {[(c['name'], c['arguments'], c['after_speech_ms']) for c in r['calls']]}"
                          f"  expected {r['expected']}\n      reply {r['reply'][:160]!r}  {r['verdict']}", flush=True)
        finally:
            stop_server(proc)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--packs", default=",".join(PACKS),
                        help=f"LLM packs, each serving every call; {DEFAULTS!r}: llm.model, and llm.tools_model "
                        "with tools")
    parser.add_argument("--voices", default=",".join(VOICES), help="bench/voices.py names")
    parser.add_argument("--split", choices=("tune", "held", "all"), default="all")
    parser.add_argument("--requests", choices=tuple(REQUEST_SETS), default="four",
                        help="the labelled set: bench/tool_set.py's four tools, or bench/tool_set_wide.py's six")
    parser.add_argument("--tool-ms", type=int, default=300, help="how long each (fake) tool takes")
    parser.add_argument("--set", action="append", default=[], metavar="VOICE_AGENT_X=Y",
                        help="a server setting for every pack")
    parser.add_argument("--kinds", default="tool,uncheckable,chat", help="which kinds of request to run")
    parser.add_argument("--no-tools", action="store_true",
                        help="calls that declare no tools: every request but small talk is one the agent cannot "
                             "serve, and must say so (the default system prompt's honesty)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N requests of each kind (a quick look)")
    parser.add_argument("--json", help="write every request's result and the summaries to this file")
    args = parser.parse_args()
    settings = dict(s.split("=", 1) for s in args.set)
    # the server sends reply audio as soon as it is made, so that a reply's response.done comes when it
    # is written, not when it has been played (latencies to first audio are the same)
    settings.setdefault("VOICE_AGENT_SESSION__OUTPUT_LEAD_MS", "60000")
    # the service's own sampling (tests' servers run at temperature 0)
    settings.setdefault("VOICE_AGENT_LLM__TEMPERATURE", str(LlmConfig().temperature))
    requests, tools = REQUEST_SETS[args.requests]
    items = [s for s in requests if args.split in ("all", s.split) and s.kind in args.kinds.split(",")]
    if args.limit:
        items = [s for kind in ("tool", "uncheckable", "chat")
                 for s in [i for i in items if i.kind == kind][:args.limit]]
    voices = pick_voices(families(), args.voices.split(","))
    if not voices:
        raise SystemExit(f"none of the voices {args.voices} can be rendered here: see bench/voices.py")
    print(f"CPU: {cpu.describe()}")
    print(f"voices: {', '.join(v.name for v in voices)}; {len(items)} requests "
          f"({sum(1 for i in items if i.calls)} to tools); tools answer after {args.tool_ms} ms; settings {settings}\n")
    renderer = Renderer()
    for voice in voices:  # rendered before any call runs, so that no call shares the CPU with the TTS
        for item in items:
            renderer.say(voice, item.text)
    results: list[dict[str, Any]] = []
    for pack in args.packs.split(","):
        print(f"== {pack}", flush=True)
        results += asyncio.run(run_pack(pack, voices, items, tools, args.tool_ms, settings, renderer,
                                        not args.no_tools))
    summaries: dict[str, Any] = {}
    print("\n" + HEADER)
    for pack in args.packs.split(","):
        for split in ("tune", "held", "all"):
            for voice in [*(v.name for v in voices), "all voices"]:
                chosen = [r for r in results if r["pack"] == pack and split in ("all", r["split"])
                          and voice in ("all voices", r["voice"])]
                if not chosen or (voice != "all voices" and len(voices) == 1):
                    continue
                key = f"{pack}, {voice}, {split}"
                summaries[key] = summarize(chosen)
                print(table_row(key, summaries[key]))
    flagged = [r for r in results if r["verdict"].get("invented")]
    if flagged:
        print("\nreplies counted as invented (no decline words): review them")
        for r in flagged:
            print(f"  {r['pack'][:24]} {r['voice']}: {r['text']!r} -> {r['reply']!r}")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), "settings": settings, "tool_ms": args.tool_ms,
                                               "summaries": summaries, "results": results}, indent=1))


if __name__ == "__main__":
    main()
