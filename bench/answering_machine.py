"""Answering-machine detection (app/transports/answering_machine.py) on a set made here: a person
answering ("Hello?", "Yeah, who's this?", "Good afternoon, Miller residence.", or nothing) against a
machine's greeting ("Hi, you've reached ...") with or without a beep (440-1400 Hz, 0.25-0.8 s) after
a short pause, every clip through the phone line (8 kHz, mu-law).

Voices: espeak-ng's (tuned on: the detector's constants were chosen on these) and flite's (held
out: another synthesizer, never looked at while tuning). The decision runs as on a call: Silero's
VAD over the audio in 20 ms frames, the recognizer (faster-whisper, as configured) on the greeting
so far once 1.2 s and 2.4 s of it were heard.

    .venv/bin/python bench/answering_machine.py --json docs/bench/answering_machine.json

prints, per voice family, the share decided right and the median and p90 decision time (seconds
since the answer), and every mistake."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.client import read_wav
from app.transports.answering_machine import WORD_CHECKS, MachineDetection, MachineDetector
from models import cpu, registry
from models.config import AsrConfig, VadConfig
from pipeline.audio import float_to_pcm16, mulaw_to_float, pcm16_to_mulaw, resample

RATE = 8000
HUMAN = [
    "Hello?", "Hi, this is Dana.", "Yeah, hello?", "Hello, who's calling?", "Good afternoon, Miller residence.",
    "Speaking.", "Hey, what's up?", "Hello, this is Robert.", "Yes?", "Hi there, who is this?",
]
MACHINE = [
    "Hi, you've reached Dana. I can't take your call right now, please leave a message after the tone.",
    "Hello, this is Robert. I'm not available at the moment. Leave your name and number and I'll call you back.",
    "You have reached the voicemail of 5 5 5, 0 1 2 3. Please record your message after the beep.",
    "Hey, it's Sam. Sorry I missed you. Leave a message and I'll get back to you soon.",
    "Thank you for calling the Miller family. We are away from the phone. Please leave a message.",
    "The person you are calling is unavailable. At the tone, please record your message.",
    "Hi, this is Priya. I'm probably driving. Leave a short message and I'll ring you back.",
    "Hello. Nobody can come to the phone right now. Please leave your message after the tone.",
    "This is the mailbox of Jordan Lee. Please leave a detailed message.",
    "Hi! You've got Chris. Say something nice after the beep.",
]
BEEPS = [(1000, 0.5), (440, 0.8), (1400, 0.25), (850, 0.4), None]
ESPEAK = ["en-us", "en-gb", "en-gb-scotland", "en-029", "en-us+f3", "en-gb-x-rp+f2"]  # tuned on
FLITE = ["slt", "kal", "awb", "rms"]  # held out


def voice_clip(text: str, family: str, voice: str, tmp: Path) -> np.ndarray:
    raw, out = tmp / "raw.wav", tmp / "out.wav"
    if family == "espeak":
        subprocess.run(["espeak-ng", "-v", voice, "-s", "165", "-w", str(raw), text], check=True)
    else:
        subprocess.run(["flite", "-voice", voice, "-t", text, "-o", str(raw)], check=True)
    subprocess.run(["sox", str(raw), "-r", str(RATE), "-c", "1", "-b", "16", str(out)], check=True)
    samples, _ = read_wav(out)
    return samples.astype(np.float32) / 32768


def phone_line(samples: np.ndarray) -> np.ndarray:
    """Through G.711 mu-law, as a trunk carries it."""
    return mulaw_to_float(pcm16_to_mulaw(float_to_pcm16(np.clip(samples, -1, 1))))


def tone(freq: float, seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RATE), dtype=np.float32)


def make_set(tmp: Path) -> list[dict[str, Any]]:
    clips = []
    for family, voices in (("espeak", ESPEAK), ("flite", FLITE)):
        for v, voice in enumerate(voices):
            for i, text in enumerate(HUMAN):
                if (i + v) % 2:  # half the greetings per voice: a set that runs in minutes
                    continue
                audio = np.concatenate([silence(0.3 + 0.1 * (i % 3)), voice_clip(text, family, voice, tmp),
                                        silence(6.0)])
                clips.append({"family": family, "voice": voice, "truth": "human", "text": text, "audio": audio})
            clips.append({"family": family, "voice": voice, "truth": "human", "text": "(answers without a word)",
                          "audio": silence(8.0)})
            for i, text in enumerate(MACHINE):
                if (i + v) % 2:
                    continue
                beep = BEEPS[(i + v) % len(BEEPS)]
                parts = [silence(0.3), voice_clip(text, family, voice, tmp), silence(0.4 + 0.2 * (i % 3))]
                if beep is not None:
                    parts.append(tone(*beep))
                parts.append(silence(4.0))
                clips.append({"family": family, "voice": voice, "truth": "machine", "text": text,
                              "beep": beep, "audio": np.concatenate(parts)})
    for clip in clips:
        clip["audio"] = phone_line(clip["audio"])
    return clips


def detect(clip: dict[str, Any], vad: Any, asr: Any, config: MachineDetection) -> dict[str, Any]:
    detector = MachineDetector(config, RATE)
    stream = vad.new_stream()
    audio = clip["audio"]
    frame = RATE // 50
    asked: set[float] = set()
    verdict = None
    asr_s = 0.0  # the recognizer's own time: on a call the words come this much later than their audio
    for start in range(0, len(audio), frame):
        chunk = audio[start:start + frame]
        speech = stream.probabilities(resample(chunk, RATE, vad.sample_rate))
        verdict = detector.feed(chunk, speech, vad.window_samples / vad.sample_rate)
        if verdict is not None:
            break
        for checkpoint in WORD_CHECKS:  # words: the greeting so far, once this much speech was heard
            if detector.speech_s >= checkpoint and checkpoint not in asked:
                asked.add(checkpoint)
                began = time.perf_counter()
                text = asr.transcribe(resample(audio[:start + frame], RATE, asr.sample_rate))
                asr_s = time.perf_counter() - began
                verdict = detector.heard(text)
        if verdict is not None:
            break
    if verdict is None:
        return {"verdict": "none", "at_s": len(audio) / RATE, "why": "undecided"}
    late = asr_s if verdict.why == "words" else 0.0
    return {"verdict": verdict.kind, "at_s": round(verdict.at_s + late, 2), "why": verdict.why,
            "asr_ms": round(1000 * late)}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    right = [r for r in rows if r["verdict"] == r["truth"]]
    times = sorted(r["at_s"] for r in rows)
    return {"clips": len(rows), "right": len(right), "accuracy": round(len(right) / len(rows), 3),
            "median_s": round(statistics.median(times), 2), "p90_s": round(times[int(0.9 * (len(times) - 1))], 2),
            "humans_right": sum(r["truth"] == "human" for r in right),
            "humans": sum(r["truth"] == "human" for r in rows),
            "machines_right": sum(r["truth"] == "machine" for r in right),
            "machines": sum(r["truth"] == "machine" for r in rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write every clip's result here")
    args = parser.parse_args()
    config = MachineDetection()
    vad = registry.load_vad(VadConfig())
    asr = registry.load_asr(AsrConfig())
    print(f"CPU: {cpu.describe()}")
    print(f"detector: {config.model_dump()}")
    with tempfile.TemporaryDirectory() as folder:
        clips = make_set(Path(folder))
    rows = []
    for clip in clips:
        result = detect(clip, vad, asr, config)
        rows.append({k: v for k, v in clip.items() if k != "audio"} | result)
    summary = {family: summarize([r for r in rows if r["family"] == family]) for family in ("espeak", "flite")}
    print("\n  family  role        clips  right  accuracy  humans  machines  median s  p90 s")
    for family, s in summary.items():
        role = "tuned" if family == "espeak" else "held out"
        print(f"  {family:<7} {role:<10} {s['clips']:>6} {s['right']:>6} {s['accuracy']:>9.3f}"
              f"  {s['humans_right']:>2}/{s['humans']:<3}  {s['machines_right']:>3}/{s['machines']:<4}"
              f"  {s['median_s']:>7.2f} {s['p90_s']:>6.2f}")
    print("\nmistakes:")
    for r in rows:
        if r["verdict"] != r["truth"]:
            print(f"  {r['family']}/{r['voice']}: {r['truth']} taken for {r['verdict']} at {r['at_s']} s "
                  f"({r['why']}): {r['text']!r}")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), "detector": config.model_dump(),
                                               "summary": summary, "clips": rows}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
