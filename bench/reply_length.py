"""Benchmark: how long the default agent's spoken replies last, with and without the spoken budget
(session.reply_budget, pipeline/reply_budget.py), side by side on the same generated text.

Each request is answered once by the embedded LLM with the default system prompt and sampling (the
full reply, up to llm.max_tokens); the budget is then applied to that same stream of text deltas, as
the LLM stage applies it, so the two columns differ only by the budget. Both texts go through the
service's own phrase chunker and synthesizer (with its silence trimming), and the spoken length is
the audio's. Two sets of requests: `tune`, on which the rule was shaped (its first run showed a
40 s run-on and a 27 s reply of three long sentences: hence the run-on cut and the look at the next
sentence), and `held-out`, written after that and never used to choose anything.

    .venv/bin/python bench/reply_length.py --set held-out --json docs/bench/reply_length_heldout.json

With --texts, the replies of an earlier run's JSON are used instead of generating new ones (the LLM
samples at its default temperature, so a new run has new replies): a change to the budget is then
measured on the very same text.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.settings import Settings
from core.clock import MonotonicClock
from core.worker import ModelWorker
from models import cpu
from models.protocols import ChatMessage, GenerationDone, Synthesizer, TextDelta
from models.registry import load_llm, load_tts
from pipeline.chunker import chunk_stage
from pipeline.config import ReplyBudgetConfig
from pipeline.events import Phrase, ReplyAudio, ReplyEvent, ReplyFinished, ReplyText
from pipeline.reply_budget import SpokenBudget
from pipeline.tts_stage import tts_stage

RATE = 16000
# Requests a caller makes that invite a long answer (how-to, explain, list), and ordinary ones.
TUNE_LONG = [
    "How do I reset my password?",
    "How do I set up voicemail on my phone?",
    "Can you explain how a mortgage works?",
    "What are the steps to change a flat tire?",
    "How do I make a good cup of coffee?",
    "What should I pack for a week at the beach?",
    "Explain how vaccines protect people.",
    "How do I get started with running?",
    "What are some tips for a job interview?",
    "How does recycling work?",
    "Tell me about the history of the bicycle.",
    "What can I do in Rome for three days?",
]
TUNE_SHORT = [
    "What is the capital of Spain?",
    "How many minutes are in an hour?",
    "Is a tomato a fruit?",
    "What color do you get when you mix red and white?",
    "Can you say good morning in French?",
    "What is twelve times three?",
    "Thanks, that's all for today.",
    "Do penguins live at the North Pole?",
]
HELD_OUT_LONG = [
    "How do I cook rice on the stove?",
    "What are the steps to open a bank account?",
    "Can you explain how solar panels make electricity?",
    "How do I clean my oven?",
    "What should I do before a long road trip?",
    "How do I teach my dog to sit?",
    "Explain how the stock market works.",
    "How can I sleep better at night?",
    "What are good ways to save money each month?",
    "How do airplanes stay in the air?",
    "Tell me about the history of the telephone.",
    "How do I plant tomatoes in my garden?",
]
HELD_OUT_SHORT = [
    "What is the capital of Canada?",
    "How many legs does a spider have?",
    "Is the sun a star?",
    "What is nine plus seven?",
    "How do you say thank you in Spanish?",
    "What day comes after Friday?",
    "Okay, goodbye.",
    "Is ice lighter than water?",
]
SETS = {"tune": (TUNE_LONG, TUNE_SHORT), "held-out": (HELD_OUT_LONG, HELD_OUT_SHORT)}
NUMBERED = re.compile(r"(^|\n)\s*\d{1,2}[.)]\s")
LIST_MARK = re.compile(r"\s*\d{1,2}[.)](\s+\S|$)")  # the synthesizer would say "one." or "two."


async def generate(llm: Any, settings: Settings, question: str) -> tuple[list[str], str]:
    """The reply's text deltas, as the LLM streamed them, and its finish reason."""
    conversation = llm.conversation()
    messages = (ChatMessage("system", settings.session.system_prompt), ChatMessage("user", question))
    deltas, reason = [], "?"
    try:
        async for out in conversation.stream(messages, settings.sampling()):
            if isinstance(out, TextDelta):
                deltas.append(out.text)
            elif isinstance(out, GenerationDone):
                reason = out.stats.finish_reason
    finally:
        await conversation.aclose()
    return deltas, reason


def budgeted(deltas: list[str], config: ReplyBudgetConfig) -> tuple[str, bool]:
    """The text the LLM stage lets through for these deltas, with the offer if the budget ended it."""
    budget = SpokenBudget(config)
    said = ""
    for delta in deltas:
        said += budget.take(delta)
        if budget.spent:
            return said + (" " + config.offer if config.offer else ""), True
    return said, False


async def spoken(text: str, settings: Settings, tts: Synthesizer, worker: ModelWorker) -> tuple[float, list[str]]:
    """Seconds of audio the service would send for `text`, and the phrases the synthesizer was given."""
    clock = MonotonicClock()

    async def events() -> AsyncGenerator[ReplyEvent, None]:
        yield ReplyText(1, text, clock.now())
        yield ReplyFinished(1, None, clock.now())

    samples, said = 0, []
    async for event in tts_stage(chunk_stage(events(), settings.chunker, clock), tts, worker, RATE, clock,
                                 settings.session.tts_trim):
        if isinstance(event, ReplyAudio):
            samples += len(event.samples)
        elif isinstance(event, Phrase):
            said.append(event.speech)
    return samples / RATE, said


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run(settings: Settings, chosen: str, texts: dict[str, tuple[str, str]] | None) -> list[dict[str, Any]]:
    """`texts`: each question's reply and finish reason from an earlier run, instead of the LLM's."""
    llm = load_llm(settings.llm, MonotonicClock(), sequences=2) if texts is None else None
    tts = load_tts(settings.tts)
    worker = ModelWorker("tts")
    rows = []
    try:
        for kind, questions in zip(("long", "short"), SETS[chosen], strict=True):
            for question in questions:
                if texts is None:
                    deltas, reason = await generate(llm, settings, question)
                else:
                    deltas, reason = [texts[question][0]], texts[question][1]
                full = "".join(deltas)
                cut, stopped = budgeted(deltas, settings.session.reply_budget)
                full_s, _ = await spoken(full, settings, tts, worker)
                cut_s, phrases = await spoken(cut, settings, tts, worker)
                row = {"kind": kind, "question": question, "finish_reason": reason, "full_text": full,
                       "budget_text": cut, "budget_stopped": stopped, "full_s": round(full_s, 2),
                       "budget_s": round(cut_s, 2), "numbered_items": len(NUMBERED.findall(full)),
                       "phrases_starting_with_a_list_number": sum(
                           bool(LIST_MARK.match(p)) for p in phrases[:-1])}  # the last: "... is 36."
                rows.append(row)
                print(f"  {kind:5s} {full_s:5.1f} s -> {cut_s:5.1f} s {'(stopped)' if stopped else '         '} "
                      f"{question!r}", flush=True)
    finally:
        worker.shutdown()
        if llm is not None:
            await llm.aclose()
    return rows


def report(rows: list[dict[str, Any]], settings: Settings) -> dict[str, Any]:
    budget = settings.session.reply_budget
    print(f"\nspoken reply length, {settings.llm.model} (temperature {settings.llm.temperature}, max_tokens "
          f"{settings.llm.max_tokens}), {settings.tts.engine} voice; budget {budget.max_sentences} sentences or "
          f"{budget.max_seconds:g} s:")
    print(f"  {'requests':10s} {'n':>3} {'p50 without':>12} {'p95 without':>12} {'max':>6} "
          f"{'p50 with':>9} {'p95 with':>9} {'max':>6} {'stopped':>8}")
    summary: dict[str, Any] = {}
    for kind in ("long", "short", "all"):
        chosen = [r for r in rows if kind in ("all", r["kind"])]
        full, cut = [r["full_s"] for r in chosen], [r["budget_s"] for r in chosen]
        stopped = sum(r["budget_stopped"] for r in chosen)
        summary[kind] = {"n": len(chosen), "without_p50_s": statistics.median(full), "without_p95_s": pct(full, .95),
                         "without_max_s": max(full), "with_p50_s": statistics.median(cut),
                         "with_p95_s": pct(cut, .95), "with_max_s": max(cut), "stopped": stopped}
        s = summary[kind]
        print(f"  {kind:10s} {len(chosen):3d} {s['without_p50_s']:11.1f}s {s['without_p95_s']:11.1f}s "
              f"{s['without_max_s']:5.1f}s {s['with_p50_s']:8.1f}s {s['with_p95_s']:8.1f}s {s['with_max_s']:5.1f}s "
              f"{stopped:5d}/{len(chosen)}")
    items = sum(r["numbered_items"] for r in rows)
    said = sum(r["phrases_starting_with_a_list_number"] for r in rows)
    print(f"  numbered list items written: {items}; phrases the synthesizer was given starting with a list number: "
          f"{said}")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="also write every reply and the figures here")
    parser.add_argument("--set", choices=sorted(SETS), default="held-out", help="which requests")
    parser.add_argument("--texts", help="an earlier run's JSON: its replies, not new ones")
    args = parser.parse_args()
    print(f"CPU: {cpu.describe()}")
    settings = Settings()
    texts = None
    if args.texts:
        texts = {r["question"]: (r["full_text"], r["finish_reason"])
                 for r in json.loads(Path(args.texts).read_text())["replies"]}
        print(f"replies from {args.texts}")
    print(f"requests: {args.set}")
    rows = asyncio.run(run(settings, args.set, texts))
    summary = report(rows, settings)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), "set": args.set, "llm": settings.llm.model,
                                               "temperature": settings.llm.temperature, "tts": settings.tts.engine,
                                               "budget": settings.session.reply_budget.model_dump(),
                                               "summary": summary, "replies": rows}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
