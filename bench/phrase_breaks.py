"""Benchmark: does a reply cut into phrases sound like one sentence? Heard breaks and inner silences.

The chunker cuts a reply's first phrase after a few words, mid-sentence, so the first audio comes
early ("The pharmacy closes on | Sundays at 7 PM."); each phrase is synthesized on its own, so a cut
phrase can end with a falling, final tone and a listener hears a full stop where the text has none.
Each sentence below goes through the service's own chunker, synthesizer and silence trimming, and
the reply audio is transcribed back by Whisper (the service's recognizer): a heard break is a
sentence mark (. ? !) in the transcript that the text does not have. The longest silence inside the
sentence is measured on the audio (5 ms frames under -50 dBFS between its first and last sound).
Side by side on the same sentences: the synthesizer's audio as made (session.tts_trim.enabled false:
its padding around every phrase), and trimmed with each max_inner_silence_ms tried.

A first run also tried giving a phrase cut mid-sentence a continuing mark ("," or "...") for the
synthesizer: with the padding trimmed, no variant had a heard break on the tune set (0 of 12 each),
so no mark is added. Two sets: `tune` chose session.tts_trim.max_inner_silence_ms; `held-out`,
written beside it, was not looked at before.

    .venv/bin/python bench/phrase_breaks.py --set held-out --json docs/bench/phrase_breaks_heldout.json
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.settings import Settings
from core.clock import MonotonicClock
from core.worker import ModelWorker
from models import cpu
from models.protocols import SpeechRecognizer, Synthesizer
from models.registry import load_asr, load_tts
from pipeline.chunker import chunk_stage
from pipeline.config import TrimConfig
from pipeline.events import Phrase, ReplyAudio, ReplyEvent, ReplyFinished, ReplyText
from pipeline.transcript_trust import repeats_itself
from pipeline.tts_stage import tts_stage

RATE = 16000
VARIANTS = {"untrimmed": {"enabled": False}, "inner 400 ms": {"max_inner_silence_ms": 400},
            "inner 250 ms": {"max_inner_silence_ms": 250}}
TUNE = [
    "The pharmacy closes on Sundays at seven in the evening.",
    "Please provide your new delivery address and a phone number.",
    "In a week there are seven days and fifty two weeks in a year.",
    "Your table for two is booked for eight o'clock tonight.",
    "The train to the airport leaves every twenty minutes from platform three.",
    "You can reset your password from the sign in page of the app.",
    "The nearest parking garage is two blocks north of the station.",
    "Mixing blue and yellow paint gives you a bright shade of green.",
    "Our support team answers calls from nine in the morning until five.",
    "The package should arrive at your door by Thursday afternoon.",
    "A return is free within thirty days if you keep the receipt.",
    "The moon is about three hundred eighty thousand kilometers away from Earth.",
]
HELD_OUT = [
    "The museum opens its doors at ten and closes at six on weekdays.",
    "Your order number is four five two one and it ships tomorrow.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "The library has a quiet room on the second floor for studying.",
    "I can send the invoice to the accounts team by email today.",
    "The bus stops right in front of the hotel every half hour.",
    "Most dentists recommend brushing your teeth twice a day for two minutes.",
    "The concert starts at half past seven so please arrive a little early.",
    "Spiders have eight legs while insects such as ants have six.",
    "Your appointment has been moved from Tuesday to Thursday at noon.",
    "The fastest way downtown is the red line toward Central Square.",
    "Paris is the capital of France and sits on the river Seine.",
    "The gym is open all night except on public holidays.",
    "You will need your account number and the last four digits of your card.",
    "A week from today is the twelfth of the month.",
    "The recipe needs two cups of flour and one cup of sugar.",
]
SETS = {"tune": TUNE, "held-out": HELD_OUT}


async def speak(text: str, trim: TrimConfig, settings: Settings, tts: Synthesizer,
                worker: ModelWorker) -> tuple[np.ndarray, list[str]]:
    """The reply audio the service sends for `text` (as the LLM would stream it), and its phrases."""
    clock = MonotonicClock()

    async def events() -> AsyncGenerator[ReplyEvent, None]:
        for i, word in enumerate(text.split(" ")):  # token-like deltas, as the chunker sees them live
            yield ReplyText(1, word if i == 0 else " " + word, clock.now())
        yield ReplyFinished(1, None, clock.now())

    audio, said = [], []
    async for event in tts_stage(chunk_stage(events(), settings.chunker, clock), tts, worker, RATE, clock, trim):
        if isinstance(event, ReplyAudio):
            audio.append(event.samples)
        elif isinstance(event, Phrase):
            said.append(event.speech)
    return (np.concatenate(audio) if audio else np.zeros(0, dtype=np.float32)), said


def longest_inner_silence_ms(audio: np.ndarray, level_db: float = -50.0) -> float:
    frame = RATE // 200  # 5 ms
    frames = len(audio) // frame
    if frames == 0:
        return 0.0
    rms = np.sqrt(np.mean(audio[:frames * frame].reshape(frames, frame).astype(np.float64) ** 2, axis=1))
    loud = np.flatnonzero(rms >= 10 ** (level_db / 20))
    if len(loud) < 2:
        return 0.0
    return float((np.diff(loud).max() - 1) * 5)


def heard_breaks(text: str, heard: str) -> int | None:
    """Sentence marks heard that the text does not have; None where Whisper repeated itself (its own
    failure, not the audio's: the same sentence twice)."""
    if repeats_itself(heard):
        return None
    marks = re.compile(r"[.?!](?=\s|$)")
    return max(0, len(marks.findall(heard.strip())) - len(marks.findall(text.strip())))


async def run(sentences: list[str], settings: Settings) -> list[dict[str, Any]]:
    tts = load_tts(settings.tts)
    asr: SpeechRecognizer = load_asr(settings.asr)
    worker = ModelWorker("tts")
    rows = []
    try:
        for text in sentences:
            for name, change in VARIANTS.items():
                trim = settings.session.tts_trim.model_copy(update=change)
                audio, phrases = await speak(text, trim, settings, tts, worker)
                heard = asr.transcribe(audio)
                row = {"text": text, "variant": name, "phrases": phrases, "heard": heard,
                       "heard_breaks": heard_breaks(text, heard), "inner_silence_ms": longest_inner_silence_ms(audio),
                       "audio_s": round(len(audio) / RATE, 2)}
                rows.append(row)
                breaks = "?" if row["heard_breaks"] is None else row["heard_breaks"]
                print(f"  {name:12s} breaks {breaks}  silence {row['inner_silence_ms']:4.0f} ms  "
                      f"{' | '.join(phrases)!r} -> {heard!r}", flush=True)
    finally:
        worker.shutdown()
    return rows


def report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    print(f"\n{'audio':>12} {'sentences':>9} {'with a heard break':>19} {'silence p50':>12} {'max':>6} "
          f"{'> 250 ms':>9}")
    summary = {}
    for name in VARIANTS:
        chosen = [r for r in rows if r["variant"] == name]
        silences = [r["inner_silence_ms"] for r in chosen]
        broken = sum((r["heard_breaks"] or 0) > 0 for r in chosen)
        repeated = sum(r["heard_breaks"] is None for r in chosen)
        summary[name] = {"sentences": len(chosen), "with_heard_break": broken, "whisper_repeated": repeated,
                         "silence_p50_ms": statistics.median(silences), "silence_max_ms": max(silences),
                         "over_250_ms": sum(s > 250 for s in silences)}
        s = summary[name]
        print(f"{name:>12} {len(chosen):9d} {broken:12d} ({broken / len(chosen):4.0%}) {s['silence_p50_ms']:11.0f} "
              f"{s['silence_max_ms']:6.0f} {s['over_250_ms']:9d}" + (f"  (Whisper repeated itself on {repeated})"
                                                                   if repeated else ""))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", choices=sorted(SETS), default="held-out")
    parser.add_argument("--json", help="also write every sentence's phrases, transcript and figures here")
    args = parser.parse_args()
    print(f"CPU: {cpu.describe()}")
    settings = Settings()
    print(f"requests: {args.set}; {settings.tts.engine} voice, chunker first_max_words "
          f"{settings.chunker.first_max_words}, max_words {settings.chunker.max_words}; heard by {settings.asr.model}")
    rows = asyncio.run(run(SETS[args.set], settings))
    summary = report(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), "set": args.set, "tts": settings.tts.engine,
                                               "asr": settings.asr.model, "summary": summary, "sentences": rows},
                                              indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
