"""Benchmark: ending the caller's turn, fixed silence against the end-of-turn model, on a labelled set.

Two figures per method: the false cut-off rate (the turn was ended before the caller's true end of
speech) and the median decision delay (from the true end of speech to the end-of-turn decision, on
turns that really were complete). The methods: (a) 480 ms of silence, the fallback, and (b) Smart
Turn v3.2 asked at each pause, swept over early_final_ms, turn_threshold and incomplete_silence_ms.

The labelled set is built here, deterministically, from voice-agent requests spoken by hibari's
'heart' voice at three speeds and with sox pitch shifts (the headline, "neural"), and by espeak-ng
en-us / en-gb (robotic, reported apart). The headline set holds, per voice:
- complete: the whole request, then 2.5 s of silence. Some requests have a comma, and the voice may
  pause there: a turn ended at such a pause is a false cut-off too ("early");
- mid-phrase cut: the whole request synthesized, transcribed by faster-whisper (whisper-tiny.en)
  with word timestamps, and its AUDIO cut right after a word that cannot end a sentence (a function
  word: an article, a preposition, a possessive, an auxiliary, "to", "like", ..., see FUNCTION_WORDS)
  that lies between 25% and 80% of the words and that whisper heard as written, with the next word;
  a pause, then the rest ("Can you book me a table for | two people at eight tonight?"). Whisper-tiny's
  word ends run ~100 ms late (into the next word), so the word's end is found by aligning (DTW over
  log-mel frames) the same voice saying the words up to it alone onto the whole, and the cut is the
  quietest 20 ms within 60 ms of that; a cut whose frame is not 20 dB below the speech, or lies
  more than 250 ms before or 150 ms after whisper's end, tries the next such word. Cutting the audio
  keeps the voice's running intonation, where a truncated TEXT would end on a final fall;
- hesitation: "I'd like to book, um" + pause + "a table for two.", the parts synthesized apart, the
  first ending in a filler (um, uh, so).
Reported apart, with the same voices: "cut anywhere" (the quietest 20 ms between 40% and 70% of the
speech, which often follows a complete prefix, "Find me an Italian restaurant | with outdoor
seating", so that a listener too might take it as finished) and hesitations that end in a bare
ellipsis ("I'd like to book..."), which the voice speaks with a final fall. The robotic voices get
complete, mid-phrase cut and hesitation samples.
The pause is 0.6, 0.9 or 1.2 s (one per sample, in rotation). Ending the turn anywhere before the
true end of speech is a false cut-off.

The decisions come from `pipeline.endpointing.Endpointer`, fed by the real Silero VAD, window by
window, with time taken from the audio position. With the model, as `vad_stage` does it: at a pause
the model hears the turn's audio (from the start less the prefix padding, its last 8 s); its answer
is ready 120 ms later (--answer-ms: one-thread inference's p90 on the 2-core EPYC with other work
running, 56 ms without; a fixed figure, since with each call's measured time the results move from
run to run with the CPU's load), is read at the first VAD window after that, and ends the turn if it
is >= turn_threshold and the pause still goes on; otherwise the turn ends after
incomplete_silence_ms. Decision times are VAD window ends (32 ms steps).

    .venv/bin/python bench/turn_detection.py --json docs/bench/turn_detection.json > docs/bench/turn_detection.txt
    .venv/bin/python bench/turn_detection.py --voices heart,espeak-en-us --limit 6    # a quick look

Synthesized audio and its word timings are cached under the model cache folder
(bench-audio/turn_detection).
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import itertools
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import wave
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models import cpu
from models.cache import cache_root, resolve
from models.turn_smart import SmartTurn
from models.vad_silero import SileroVad
from pipeline.audio import resample
from pipeline.config import EndpointingConfig
from pipeline.endpointing import TURN_MODEL_S, Endpointer

RATE = 16000
WINDOW_MS = 1000.0 * SileroVad.window_samples / RATE
PAUSES_S = (0.6, 0.9, 1.2)
LEAD_S, TAIL_S = 0.5, 2.5
FIXED_SILENCE_MS = 480
EARLY_MS = (150, 200)
THRESHOLDS = (0.5, 0.7, 0.8, 0.9, 0.95)
INCOMPLETE_MS = (1000, 1500, 2000)
TARGET_CUT_OFF_PCT = 5.0
ANSWER_MS = 120.0  # the model's answer latency in the decisions: one-thread inference's p90 here under load
CUT_SPAN = (0.25, 0.8)  # a mid-phrase cut follows a word between these shares of the words
REFINE_MS = 60  # ... at the quietest 20 ms frame within this of the word's end
MAX_CUT_DB = -20.0  # a clean cut: its frame this far below the speech's RMS (not inside a sound) ...
CUT_OFF_WHISPER_MS = (-250, 150)  # ... and this near whisper's end of the word (whisper-tiny's ends run late)
INTERNAL_PAUSE_MS = 5 * WINDOW_MS  # a complete sample "has a pause" if the VAD hears this much silence inside

# Words after which an English sentence cannot end. Particles of phrasal verbs ("log in") and
# "like" after "be" ("what will it be like") can, and are kept out by NOT_AFTER.
_FUNCTION_WORDS = {
    "articles": "a an the",
    "prepositions": "to for in on at of from with by about into onto near after before under between through "
                    "during without than over across towards",
    "possessives": "my your our their its",
    "conjunctions": "and or but because if whether when while unless although",
    "auxiliaries": "is are was were be been being am do does did can could will would should shall may might must "
                   "i'd i'm i'll you'd we'd what's where's how's there's it's let's",
    "verbs that want an object, determiners": "like want need wanted needed trying gonna wanna some any every each",
}
FUNCTION_WORDS = frozenset(w for words in _FUNCTION_WORDS.values() for w in words.split())
NOT_AFTER = {"in": {"log", "logged", "check", "checked", "sign", "signed", "come", "get", "got", "plug", "fill"},
             "on": {"turn", "turned", "put", "log", "logged", "come", "hold", "go"},
             "over": {"come", "go", "hand", "move"},
             "like": {"be", "is", "was", "it's", "look", "looks", "feel", "feels"}}

REQUESTS = [
    "Can you book me a table for two people at eight tonight?",
    "What is the weather going to be like in Paris tomorrow?",
    "I forgot my password, and now I can't get into my account.",
    "How long should I bake a chicken breast at two hundred degrees?",
    "Is there a pharmacy near the station that is open after ten at night?",
    "I'd like to move my dentist appointment from Tuesday to Thursday morning.",
    "What's the balance on my checking account ending in four two one?",
    "Can you recommend a vegetarian recipe that takes less than thirty minutes?",
    "Will it snow in the mountains near Denver this weekend?",
    "Please cancel my order for the blue running shoes.",
    "How do I set up automatic payments for my electricity bill?",
    "What time does the last train to Boston leave tonight?",
    "Could you add milk, eggs, and a loaf of bread to my shopping list?",
    "Why was I charged twice for the same purchase last week?",
    "Book me a taxi to the airport for six in the morning.",
    "What's a good substitute for buttermilk in pancakes?",
    "Actually, I want to upgrade my phone plan to unlimited data.",
    "How many tablespoons are in a quarter of a cup?",
    "Can you check whether my package from the bookstore has been delivered yet?",
    "Find me an Italian restaurant with outdoor seating for Saturday night.",
    "Okay, what's the difference between the basic and the premium membership?",
    "Remind me to water the plants every Sunday at nine.",
    "If it rains tomorrow, move my tennis lesson to the indoor court.",
    "Sorry, I meant the flight to Lisbon on Thursday, not the one on Friday.",
]
HESITATIONS = [
    ("I'd like to book, um", "a table for two."),
    ("My account number is, uh", "four five six."),
    ("Can you tell me, um", "what the weather will be like tomorrow?"),
    ("I was wondering if, uh", "you could move my appointment to Friday."),
    ("What's the best way to, um", "cook salmon in the oven?"),
    ("I need to change the, uh", "delivery address on my last order."),
    ("Could you remind me to, um", "call my mother at six?"),
    ("My flight lands at noon, so", "can you book me a taxi for one o'clock?"),
    ("How long does it take to, um", "boil an egg?"),
    ("I'm looking for a flight to, uh", "Lisbon next Thursday morning."),
    ("Is it going to, um", "rain in Seattle this weekend?"),
    ("Can I pay with, uh", "a gift card?"),
    ("The heating in my flat is broken, so", "I need a plumber today."),
    ("What time does the, uh", "pharmacy on Main Street close?"),
    ("Please send the invoice to, um", "the accounts team."),
    ("I think I left my, uh", "umbrella on the train."),
]
ELLIPSES = [  # reported apart: the voice ends a bare ellipsis with a final fall
    ("I'd like to book...", "a table for two at eight tonight."),
    ("I was wondering if...", "you could move my appointment to Friday."),
    ("I need to change the...", "delivery address on my last order."),
    ("So the problem is...", "my card keeps getting declined."),
    ("I'm looking for a flight to...", "Lisbon next Thursday morning."),
    ("Can I pay with...", "a gift card, or only by credit card?"),
    ("What time does the...", "pharmacy on Main Street close?"),
    ("I think I left my...", "umbrella on the train this morning."),
]
KINDS = ("complete", "midcut", "hesitation", "anycut", "ellipsis")
HEADLINE_KINDS = ("complete", "midcut", "hesitation")
KIND_LABELS = {"complete": "complete", "midcut": "mid-phrase cut", "hesitation": "hesitation with a filler",
               "anycut": "cut anywhere (may sound finished)", "ellipsis": "hesitation, bare ellipsis"}


@dataclass(frozen=True)
class Voice:
    name: str
    engine: str  # "hibari" | "espeak"
    group: str  # "neural" (the headline) | "robotic"
    speed: float = 1.0
    pitch_cents: int = 0
    espeak_voice: str = ""


VOICES = [
    Voice("heart", "hibari", "neural"),
    Voice("heart-slow", "hibari", "neural", speed=0.85),
    Voice("heart-fast", "hibari", "neural", speed=1.15),
    Voice("heart-low", "hibari", "neural", pitch_cents=-300),
    Voice("heart-high", "hibari", "neural", pitch_cents=300),
    Voice("heart-low-slow", "hibari", "neural", speed=0.85, pitch_cents=-300),
    Voice("espeak-en-us", "espeak", "robotic", espeak_voice="en-us"),
    Voice("espeak-en-gb", "espeak", "robotic", espeak_voice="en-gb"),
]


@dataclass
class Sample:
    id: str
    voice: str
    group: str
    kind: str  # one of KINDS
    text: str  # with " | " where the pause goes
    pause_s: float  # 0 for complete samples
    true_end_ms: float  # where the caller's last word ends
    pause_ms: tuple[float, float] | None  # the pause that is not an end (cuts, hesitations)
    note: str  # the cut's word and its class, or a complete sample's inner pause
    audio: np.ndarray


SAMPLE_FIELDS = [f.name for f in fields(Sample) if f.name != "audio"]

# ------------------------------------------------------------------------------------------ the audio


@dataclass(frozen=True)
class Word:
    text: str  # as whisper wrote it, with its punctuation
    start: int  # samples, in the trimmed speech
    end: int

    @property
    def bare(self) -> str:
        return re.sub(r"[^a-z']", "", self.text.lower().replace("’", "'"))

    @property
    def ends_clause(self) -> bool:
        return bool(re.search(r"[,.;:!?]\W*$", self.text.strip()))


class Speaker:
    """Synthesizes text in a voice as 16 kHz float32, peak 0.5, and transcribes it; cached on disk."""

    def __init__(self, folder: Path, threads: int) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.threads = threads
        self._hibari: Any = None
        self._whisper: Any = None

    def _key(self, voice: Voice, text: str) -> str:
        key = repr((voice.engine, voice.espeak_voice, voice.speed, voice.pitch_cents, text))
        return hashlib.sha1(key.encode()).hexdigest()[:16]

    def say(self, voice: Voice, text: str) -> np.ndarray:
        path = self.folder / f"{self._key(voice, text)}.npy"
        if path.is_file():
            cached: np.ndarray = np.load(path)
            return cached
        audio = self._hibari_audio(text, voice.speed) if voice.engine == "hibari" else _espeak(text, voice)
        if voice.pitch_cents:
            audio = _sox(audio, ["pitch", str(voice.pitch_cents)])
        audio = (0.5 * audio / max(1e-6, float(np.abs(audio).max()))).astype(np.float32)
        np.save(path, audio)
        return audio

    def words(self, voice: Voice, text: str, audio: np.ndarray, offset: int) -> list[Word]:
        """faster-whisper's words for the rendering `audio`, in samples from `offset` (the speech's start)."""
        path = self.folder / f"{self._key(voice, text)}.words.json"
        if path.is_file():
            timed = json.loads(path.read_text())
        else:
            if self._whisper is None:
                from faster_whisper import WhisperModel

                self._whisper = WhisperModel(resolve("whisper-tiny.en"), device="cpu", compute_type="int8",
                                             cpu_threads=self.threads)
            segments, _ = self._whisper.transcribe(audio, language="en", word_timestamps=True, beam_size=5)
            timed = [[w.word, round(w.start, 3), round(w.end, 3)] for s in segments for w in (s.words or [])]
            path.write_text(json.dumps(timed))
        return [Word(t, int(s * RATE) - offset, int(e * RATE) - offset) for t, s, e in timed]

    def _hibari_audio(self, text: str, speed: float) -> np.ndarray:
        if self._hibari is None:
            from hibari import Hibari

            self._hibari = Hibari()
        chunks = [np.asarray(c, dtype=np.float32) for c in self._hibari.stream(text, speed=speed, seed=0)]
        return resample(np.concatenate(chunks), 24000, RATE)


def _espeak(text: str, voice: Voice) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.wav"
        subprocess.run(["espeak-ng", "-v", voice.espeak_voice, "-s", str(int(160 * voice.speed)), "-w", str(raw),
                        "--", text], check=True, capture_output=True)
        audio, rate = _read_wav(raw)
    return resample(audio, rate, RATE)


def _sox(audio: np.ndarray, effect: list[str]) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.wav", Path(tmp) / "out.wav"
        with wave.open(str(src), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(RATE)
            w.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
        subprocess.run(["sox", str(src), str(dst), *effect], check=True, capture_output=True)
        out, _ = _read_wav(dst)
    return out


def _read_wav(path: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path)) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        return pcm.astype(np.float32) / 32768.0, w.getframerate()


def speech_span(audio: np.ndarray) -> tuple[int, int]:
    """First and one-past-last sample above -40 dB of the 0.5 peak."""
    loud = np.flatnonzero(np.abs(audio) > 0.005)
    return (int(loud[0]), int(loud[-1]) + 1) if len(loud) else (0, 0)


def quietest(audio: np.ndarray, lo: int, hi: int) -> int:
    """The middle of the quietest 20 ms frame (10 ms steps) whose middle lies in [lo, hi]."""
    frame = RATE // 50
    starts = [s for s in range(max(0, lo - frame // 2), min(hi - frame // 2, len(audio) - frame) + 1, frame // 4)]
    energies = [float(np.mean(audio[s:s + frame] ** 2)) for s in starts]
    return starts[int(np.argmin(energies))] + frame // 2


def quiet_point(audio: np.ndarray) -> int:
    """The old cut: the quietest 20 ms frame between 40% and 70% of the speech."""
    start, end = speech_span(audio)
    return quietest(audio, start + int(0.4 * (end - start)), start + int(0.7 * (end - start)))


def is_function_word(words: list[Word], i: int) -> bool:
    word = words[i].bare
    before = words[i - 1].bare if i else ""
    return word in FUNCTION_WORDS and before not in NOT_AFTER.get(word, set())


def phrase_cuts(words: list[Word], text: str) -> list[tuple[int, int]]:
    """The words a mid-phrase cut may follow, as (index in `words`, index in the text's words): function words
    between 25% and 80% of the words, not followed by punctuation, where whisper heard this word and the next
    one as written (a misheard word may straddle a boundary: "with outdoor" heard as "without door")."""
    n = len(words)
    written = [re.sub(r"[^a-z']", "", w.lower().replace("’", "'")) for w in text.split()]
    blocks = difflib.SequenceMatcher(None, [w.bare for w in words], written, autojunk=False).get_matching_blocks()
    heard = {i: b.b + i - b.a for b in blocks for i in range(b.a, b.a + b.size - 1)}  # i and i + 1 as written
    return sorted((i, j) for i, j in heard.items() if CUT_SPAN[0] <= (i + 1) / n <= CUT_SPAN[1]
                  and not words[i].ends_clause and is_function_word(words, i))


def log_mel(audio: np.ndarray) -> np.ndarray:
    """40 log-mel bands per 10 ms (25 ms windows), mean-normalized: features to align two renderings."""
    win, hop, n_fft = 400, 160, 512
    frames = np.lib.stride_tricks.sliding_window_view(np.pad(audio, (0, win)), win)[::hop] * np.hanning(win)
    power = np.abs(np.fft.rfft(frames, n_fft)) ** 2
    mel = 2595 * np.log10(1 + np.linspace(0, RATE / 2, n_fft // 2 + 1) / 700)
    edges = np.linspace(mel[0], mel[-1], 42)
    bank = np.clip(np.minimum((mel[None] - edges[:-2, None]) / (edges[1:-1, None] - edges[:-2, None]),
                              (edges[2:, None] - mel[None]) / (edges[2:, None] - edges[1:-1, None])), 0, None)
    feats = np.log(power @ bank.T + 1e-8)
    return feats - feats.mean(axis=0)


def prefix_end(prefix: np.ndarray, whole: np.ndarray) -> int:
    """Where the speech of `prefix` (the same voice saying the first words alone) ends in `whole`: the free end
    of a dynamic time warping of the prefix onto the start of the whole (steps (1,1), (1,2), (2,1))."""
    a, b = log_mel(prefix), log_mel(whole)
    a /= np.linalg.norm(a, axis=1, keepdims=True) + 1e-8
    b /= np.linalg.norm(b, axis=1, keepdims=True) + 1e-8
    cost = 1 - a @ b.T
    n, m = cost.shape
    total = np.full((n, m), np.inf)
    total[0, 0] = cost[0, 0]
    for i in range(1, n):
        best = np.full(m, np.inf)
        best[1:] = total[i - 1, :-1]
        best[2:] = np.minimum(best[2:], total[i - 1, :-2])
        if i >= 2:
            best[1:] = np.minimum(best[1:], total[i - 2, :-1])
        total[i] = cost[i] + best
    steps = n + np.arange(m)
    return int(np.argmin(total[-1] / steps)) * 160 + 200


def level_db(speech: np.ndarray, at: int) -> float:
    """The level of the 20 ms around sample `at`, in dB against the speech's RMS."""
    frame = speech[max(0, at - RATE // 100):at + RATE // 100]
    return round(10 * float(np.log10((np.mean(frame ** 2) + 1e-12) / (np.mean(speech ** 2) + 1e-12))), 1)


def word_before(words: list[Word], cut: int) -> int | None:
    """The last word that ends (give or take 60 ms) before sample `cut`."""
    before = [i for i, w in enumerate(words) if (w.start + w.end) / 2 < cut]
    return before[-1] if before else None


def build_set(speaker: Speaker, voices: list[Voice], limit: int | None) -> tuple[list[Sample], list[str]]:
    lead, tail = np.zeros(int(LEAD_S * RATE), np.float32), np.zeros(int(TAIL_S * RATE), np.float32)
    samples: list[Sample] = []
    skipped: list[str] = []
    refine = int(REFINE_MS * RATE / 1000)

    def add(voice: Voice, kind: str, n: int, text: str, pause_s: float, parts: list[np.ndarray],
            pause_at: int | None, note: str = "") -> None:
        audio = np.concatenate([lead, *parts, tail])
        end = len(lead) + sum(len(p) for p in parts)
        pause = None
        if pause_at is not None:
            start = len(lead) + pause_at
            pause = (1000 * start / RATE, 1000 * (start + pause_s * RATE) / RATE)
        noise = np.random.default_rng(len(samples)).standard_normal(len(audio)).astype(np.float32) * 3e-4
        samples.append(Sample(f"{voice.name}/{kind}/{n}", voice.name, voice.group, kind, text, pause_s,
                              1000 * end / RATE, pause, note, audio + noise))

    def paused(voice: Voice, kind: str, n: int, speech: np.ndarray, cut: int, text: str, note: str,
               pause_s: float) -> None:
        gap = np.zeros(int(pause_s * RATE), np.float32)
        add(voice, kind, n, text, pause_s, [speech[:cut], gap, speech[cut:]], cut, note)

    for v, voice in enumerate(voices):
        for i, text in enumerate(REQUESTS[:limit]):
            a, b = speech_span(whole := speaker.say(voice, text))
            speech = whole[a:b]
            words = speaker.words(voice, text, whole, a)
            add(voice, "complete", i, text, 0.0, [speech], None)
            pause_s = PAUSES_S[(i + v) % len(PAUSES_S)]
            choices = phrase_cuts(words, text)
            for c in range(len(choices)):  # in rotation, the first that makes a clean cut
                k, j = choices[(i + v + c) % len(choices)]
                said = " ".join(text.split()[:j + 1])
                prefix = speaker.say(voice, said)
                end = prefix_end(prefix[slice(*speech_span(prefix))], speech)
                cut = quietest(speech, end - refine, end + refine)
                level, off_ms = level_db(speech, cut), 1000 * (cut - words[k].end) / RATE
                if level <= MAX_CUT_DB and CUT_OFF_WHISPER_MS[0] <= off_ms <= CUT_OFF_WHISPER_MS[1]:
                    note = (f"after '{words[k].bare}' (function word), cut {off_ms:+.0f} ms from whisper's word end, "
                            f"cut frame {level:g} dB")
                    paused(voice, "midcut", i, speech, cut, f"{said} | {' '.join(text.split()[j + 1:])}", note,
                           pause_s)
                    break
            else:
                skipped.append(f"{voice.name}/midcut/{i}: no clean cut after a function word among {len(choices)} "
                               f"in {' '.join(w.text.strip() for w in words)!r}")
            if voice.group == "neural":
                cut = quiet_point(speech)
                k_before = word_before(words, cut)
                if k_before is None:
                    label, said = "none", f"| {text}"
                else:
                    w = words[k_before]
                    label = ("clause end" if w.ends_clause else "function word" if is_function_word(words, k_before)
                             else "other word")
                    said = " ".join(x.text.strip() for x in words[:k_before + 1]) + " | " + " ".join(
                        x.text.strip() for x in words[k_before + 1:])
                    label = f"after '{w.bare}' ({label}), cut frame {level_db(speech, cut):g} dB"
                paused(voice, "anycut", i, speech, cut, said, label, PAUSES_S[(i + v + 2) % len(PAUSES_S)])
        hesitations = [("hesitation", HESITATIONS)] + ([("ellipsis", ELLIPSES)] if voice.group == "neural" else [])
        for kind, pairs in hesitations:
            for i, (first, rest) in enumerate(pairs[:limit]):
                one, two = speaker.say(voice, first), speaker.say(voice, rest)
                one = one[slice(*speech_span(one))]
                two = two[slice(*speech_span(two))]
                pause_s = PAUSES_S[(i + v + 1) % len(PAUSES_S)]
                gap = np.zeros(int(pause_s * RATE), np.float32)
                add(voice, kind, i, f"{first} | {rest}", pause_s, [one, gap, two], len(one))
    return samples, skipped


def inner_pauses(sample: Sample, probs: list[float], neg_threshold: float) -> list[tuple[float, float]]:
    """Silences of >= INTERNAL_PAUSE_MS that the VAD hears inside a complete sample's speech."""
    out: list[tuple[float, float]] = []
    start_ms = LEAD_S * 1000
    run_from: float | None = None
    for n, prob in enumerate(probs):
        at = n * WINDOW_MS
        if at < start_ms or at >= sample.true_end_ms:
            continue
        if prob < neg_threshold:
            run_from = at if run_from is None else run_from
        elif run_from is not None:
            if at - run_from >= INTERNAL_PAUSE_MS:
                out.append((run_from, at))
            run_from = None
    return out


# ---------------------------------------------------------------------------------------- the decisions


class TurnModel:
    """Smart Turn, each answer kept by (sample, audio span) with the time it takes: fixed, or as measured."""

    def __init__(self, threads: int, answer_ms: float) -> None:
        self.model = SmartTurn(resolve("smart-turn-v3.2-cpu"), threads=threads)
        self.answer_ms = answer_ms  # > 0: every answer is taken to be ready this long after the question
        self.model.probability(np.zeros(RATE, np.float32))  # warm up
        self.answers: dict[tuple[str, int, int], tuple[float, float]] = {}
        self.times_ms: list[float] = []

    def ask(self, sample: Sample, start: int, end: int) -> tuple[float, float]:
        key = (sample.id, start, end)
        if key not in self.answers:
            audio = sample.audio[max(start, end - int(TURN_MODEL_S * RATE)):end]
            began = time.perf_counter()
            probability = self.model.probability(audio)
            elapsed = 1000 * (time.perf_counter() - began)
            self.times_ms.append(elapsed)
            self.answers[key] = (probability, self.answer_ms if self.answer_ms > 0 else elapsed)
        return self.answers[key]


def run_turns(sample: Sample, probs: list[float], config: EndpointingConfig,
              model: TurnModel | None) -> dict[str, Any]:
    """Drive the Endpointer over the sample as `vad_stage` does; the turn ends ("stops") it decided."""
    endpointer = Endpointer(config, WINDOW_MS, turn_model=model is not None)
    stops: list[dict[str, Any]] = []
    asked: list[dict[str, Any]] = []
    asking: tuple[int, float, float] | None = None  # (pause number, answer ready at ms, probability)
    turn_start_ms = 0.0
    for prob in probs:
        decision = endpointer.feed(prob)
        now = endpointer.position_ms
        by_model = False
        if decision is None and asking is not None and now >= asking[1]:
            pause, _, answer = asking
            asking = None
            if answer >= config.turn_threshold and endpointer.in_pause(pause):
                decision, by_model = endpointer.end_turn(), True
        if decision is None:
            continue
        if decision.kind == "start":
            turn_start_ms = decision.audio_ms
        elif decision.kind == "pause" and model is not None:
            start = int(max(0.0, turn_start_ms - config.prefix_padding_ms) * RATE / 1000)
            answer, took_ms = model.ask(sample, start, int(now * RATE / 1000))
            asking = (endpointer.pauses, now + took_ms, answer)
            asked.append({"at_ms": now, "probability": round(answer, 4), "took_ms": round(took_ms, 1)})
        elif decision.kind == "stop":
            asking = None
            stops.append({"at_ms": now, "silence_from_ms": decision.audio_ms, "by_model": by_model})
    early = [s for s in stops if s["at_ms"] < sample.true_end_ms]
    final = next((s for s in stops if s["at_ms"] >= sample.true_end_ms), None)
    in_pause = sample.pause_ms is not None and any(sample.pause_ms[0] <= s["at_ms"] < sample.pause_ms[1] + WINDOW_MS
                                                    for s in early)
    return {"cut_off": bool(early), "cut_off_in_pause": in_pause,
            "delay_ms": None if final is None else round(final["at_ms"] - sample.true_end_ms, 1),
            "late": final is not None and model is not None and not final["by_model"],
            "stops": stops, "asked": asked}


# ------------------------------------------------------------------------------------------ the report

Pair = tuple[Sample, dict[str, Any]]


def summarize(pairs: list[Pair], inner: set[str]) -> dict[str, Any]:
    """The figures of one method over one group; `inner`: the complete samples with a pause inside."""
    head = [(s, r) for s, r in pairs if s.kind in HEADLINE_KINDS]
    complete = [r for s, r in head if s.kind == "complete"]
    continued = [r for s, r in head if s.kind != "complete" or s.id in inner]
    cut_paused = [(s, r) for s, r in head if s.kind != "complete"]
    delays = [r["delay_ms"] for r in complete if r["delay_ms"] is not None and not r["cut_off"]]
    return {
        "samples": len(head), "false_cut_off_pct": _rate([r for _, r in head]),
        "paused_samples": len(continued), "paused_cut_off_pct": _rate(continued),
        "complete_samples": len(complete), "early_pct": _rate(complete),
        "complete_with_inner_pause": len([1 for s, _ in head if s.id in inner]),
        "early_pct_with_inner_pause": _rate([r for s, r in head if s.id in inner]),
        "median_delay_ms": round(statistics.median(delays), 1) if delays else None,
        "p90_delay_ms": round(float(np.percentile(delays, 90)), 1) if delays else None,
        "late_pct": _pct(sum(r["late"] for r in complete), len(complete)),
        "cut_off_pct_by_pause": {f"{p:.1f}s": _rate([r for s, r in cut_paused if s.pause_s == p]) for p in PAUSES_S},
        "cut_off_pct_by_kind": {k: _rate([r for s, r in pairs if s.kind == k]) for k in KINDS if k != "complete"},
    }


def _rate(results: list[dict[str, Any]]) -> float | None:
    return _pct(sum(r["cut_off"] for r in results), len(results))


def _pct(n: int, total: int) -> float | None:
    return round(100 * n / total, 1) if total else None


def _fmt(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:g}{unit}"


def row(name: str, s: dict[str, Any], kinds: list[str]) -> str:
    by_kind = s["cut_off_pct_by_kind"]
    return (f"  {name:<38} {_fmt(s['false_cut_off_pct'], '%'):>7} {_fmt(s['paused_cut_off_pct'], '%'):>7} "
            f"{_fmt(s['early_pct'], '%'):>6} {_fmt(s['median_delay_ms']):>7} {_fmt(s['p90_delay_ms']):>7} "
            f"{_fmt(s['late_pct'], '%'):>6}  "
            + " ".join(f"{_fmt(v, '%'):>6}" for v in s["cut_off_pct_by_pause"].values()) + "  "
            + " ".join(f"{_fmt(by_kind[k], '%'):>7}" for k in kinds))


SHORT = {"midcut": "midcut", "hesitation": "hes.", "anycut": "|anycut", "ellipsis": "|ellip."}


def head(kinds: list[str]) -> str:
    return (f"  {'method':<38} {'FALSE':>7} {'paused':>7} {'early':>6} {'p50 ms':>7} {'p90 ms':>7} {'late':>6}  "
            + " ".join(f"{f'@{p:.1f}s':>6}" for p in PAUSES_S) + "  " + " ".join(f"{SHORT[k]:>7}" for k in kinds))


def probability_spread(pairs: list[Pair]) -> dict[str, Any]:
    """The model's first answer after the true end of complete turns, and at the labelled pauses, by kind."""
    values: dict[str, list[float]] = {"complete (at the end)": []}
    for sample, result in pairs:
        for asked in result["asked"]:
            if sample.kind == "complete" and asked["at_ms"] >= sample.true_end_ms:
                values["complete (at the end)"].append(asked["probability"])
                break
            # the VAD may hear the silence begin a little before the cut
            if sample.pause_ms is not None and sample.pause_ms[0] - 250 <= asked["at_ms"] < sample.pause_ms[1]:
                values.setdefault(sample.kind, []).append(asked["probability"])
                break

    def share(v: list[float]) -> dict[str, Any]:
        return {"n": len(v), **{f">={t}": _pct(sum(x >= t for x in v), len(v)) for t in THRESHOLDS}}
    return {k: share(v) for k, v in values.items()}


def anycut_by_word(pairs: list[Pair]) -> dict[str, Any]:
    """Cut-anywhere samples by the word the cut follows, with their cut-off rate."""
    classes: dict[str, list[dict[str, Any]]] = {}
    for sample, result in pairs:
        if sample.kind == "anycut":
            label = sample.note[sample.note.find("(") + 1:sample.note.find(")")] if "(" in sample.note else "none"
            classes.setdefault(label, []).append(result)
    return {k: {"n": len(v), "cut_off_pct": _rate(v)} for k, v in sorted(classes.items())}


def choose(table: dict[str, dict[str, Any]], silence: str) -> tuple[str, str]:
    """The recommended model setting and why: false cut-offs <= the target at a median delay below silence's,
    the fewest cut-offs first; failing that, the fewest cut-offs at a delay below silence's."""
    limit = table[silence]["median_delay_ms"]
    models = {n: s for n, s in table.items() if n != silence and s["median_delay_ms"] is not None}

    def key(n: str) -> tuple[float, float, float]:
        s = models[n]
        return (s["false_cut_off_pct"], s["median_delay_ms"], s["late_pct"])
    faster = [n for n in models if models[n]["median_delay_ms"] < limit]
    meets = [n for n in faster if models[n]["false_cut_off_pct"] <= TARGET_CUT_OFF_PCT]
    if meets:
        return min(meets, key=key), (f"false cut-offs <= {TARGET_CUT_OFF_PCT:g}% at a median delay below silence's "
                                     f"{limit:g} ms ({len(meets)} settings qualify; the fewest cut-offs)")
    if faster:
        return min(faster, key=key), (f"no setting reaches {TARGET_CUT_OFF_PCT:g}% at a median delay below "
                                      f"{limit:g} ms: the fewest cut-offs among those faster than silence")
    return min(models, key=key), "no setting is faster than silence: the fewest cut-offs"


def compact(results: list[dict[str, Any]], full: bool) -> dict[str, Any]:
    """One row per sample, in the order of "samples"; the stops and the model's answers only if `full`."""
    columns = ["cut_off", "cut_off_in_pause", "delay_ms", "late"]
    rows: list[list[Any]] = [[int(r["cut_off"]), int(r["cut_off_in_pause"]), r["delay_ms"], int(r["late"])]
                             for r in results]
    if full:
        columns += ["stops [at_ms, silence_from_ms, by_model]", "asked [at_ms, probability, took_ms]"]
        for out, r in zip(rows, results, strict=True):
            out.append([[s["at_ms"], s["silence_from_ms"], int(s["by_model"])] for s in r["stops"]])
            out.append([[a["at_ms"], a["probability"], a["took_ms"]] for a in r["asked"]])
    return {"columns": columns, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write every sample's result and the summary to this file")
    parser.add_argument("--voices", help="comma-separated voice names (default: all)")
    parser.add_argument("--limit", type=int, help="at most this many requests and hesitations per voice")
    parser.add_argument("--threads", type=int, default=1, help="the model's CPU threads (the service's turn.threads)")
    parser.add_argument("--answer-ms", type=float, default=ANSWER_MS,
                        help="the model's answer is ready this long after a pause is heard (0: each call's measured "
                        "inference time, which makes the results vary from run to run with the CPU's load)")
    args = parser.parse_args()
    voices = [v for v in VOICES if not args.voices or v.name in args.voices.split(",")]

    print(f"CPU: {cpu.describe()}")
    began = time.perf_counter()
    speaker = Speaker(cache_root() / "bench-audio" / "turn_detection", args.threads)
    samples, skipped = build_set(speaker, voices, args.limit)
    vad = SileroVad()
    probs = {s.id: vad.new_stream().probabilities(s.audio) for s in samples}
    model = TurnModel(args.threads, args.answer_ms)
    base = EndpointingConfig()
    neg = base.neg_threshold if base.neg_threshold is not None else max(0.01, base.threshold - 0.15)
    inner_at = {s.id: p for s in samples if s.kind == "complete" and (p := inner_pauses(s, probs[s.id], neg))}
    for s in samples:
        if s.id in inner_at:
            s.note = "pauses inside: " + ", ".join(f"{b - a:.0f} ms at {a - LEAD_S * 1000:.0f} ms"
                                                   for a, b in inner_at[s.id])
    print(f"{len(samples)} samples, {len(voices)} voices; set built and VAD run in {time.perf_counter() - began:.0f} s")
    for line in skipped:
        print(f"  no mid-phrase cut: {line}")

    methods: list[tuple[str, EndpointingConfig, TurnModel | None]] = [
        (f"silence {FIXED_SILENCE_MS} ms", base.model_copy(update={"end_silence_ms": FIXED_SILENCE_MS}), None)]
    for early, threshold, patience in itertools.product(EARLY_MS, THRESHOLDS, INCOMPLETE_MS):
        update = {"early_final_ms": early, "turn_threshold": threshold, "incomplete_silence_ms": patience}
        methods.append((f"model e{early} t{threshold} i{patience}", base.model_copy(update=update), model))
    silence = methods[0][0]
    default = f"model e{base.early_final_ms} t{base.turn_threshold} i{base.incomplete_silence_ms}"

    results: dict[str, list[dict[str, Any]]] = {}
    for name, config, turn_model in methods:
        results[name] = [run_turns(s, probs[s.id], config, turn_model) for s in samples]
    groups = {"neural": "hibari 'heart' at speeds and sox pitch shifts: the headline",
              "robotic": "espeak-ng, robotic: reported apart, not in the headline"}
    summary: dict[str, Any] = {"groups": {}}
    recommended = default
    for group, label in groups.items():
        idx = [i for i, s in enumerate(samples) if s.group == group]
        if not idx:
            continue
        chosen = [samples[i] for i in idx]
        inner = {s.id for s in chosen if s.id in inner_at}
        table = {name: summarize([(samples[i], res[i]) for i in idx], inner) for name, res in results.items()}
        counts = {k: sum(s.kind == k for s in chosen) for k in KINDS}
        kinds = [k for k in KINDS if k != "complete" and counts[k]]
        pick, why = choose(table, silence)
        if group == "neural":
            recommended = pick
        spread = {n: probability_spread([(samples[i], results[n][i]) for i in idx]) for n in (default, pick)}
        anycut = {n: anycut_by_word([(samples[i], results[n][i]) for i in idx]) for n in (silence, default, pick)}
        summary["groups"][group] = {"samples": counts, "complete_with_inner_pause": len(inner), "methods": table,
                                    "recommended": pick, "why": why, "model_probability": spread,
                                    "anycut_by_word": anycut if counts["anycut"] else None}
        names = ", ".join(f"{v.name} ({v.speed}x, {v.pitch_cents:+d} c)" if v.engine == "hibari" else v.name
                          for v in voices if v.group == group)
        print(f"\n{group}: {label}. Voices: {names}.")
        print("  samples: " + ", ".join(f"{counts[k]} {KIND_LABELS[k]}" for k in KINDS if counts[k])
              + f"; {len(inner)} of the complete ones have a pause inside (>= {INTERNAL_PAUSE_MS:.0f} ms of "
              "VAD silence).")
        print(f"\n  headline ({', '.join(KIND_LABELS[k] for k in HEADLINE_KINDS)}):")
        print(head(kinds))
        for name in dict.fromkeys([silence, default, pick]):
            tags = [t for n, t in ((default, "default"), (pick, "recommended")) if n == name]
            print(row(name + (f" ({', '.join(tags)})" if tags else ""), table[name], kinds))
        print(f"  recommended: {pick}: {why}")
        print(f"\n  the sweep ({len(table) - 1} model settings):")
        print(head(kinds))
        for name in table:
            print(row(name, table[name], kinds))
        print("\n  the model's probability (the first answer after the true end, or in the labelled pause), "
              "share >= each threshold:")
        for n, by_kind in spread.items():
            print(f"    {n}: " + "; ".join(f"{k} {v}" for k, v in by_kind.items()))
        if counts["anycut"]:
            print("  cut anywhere, by the word the cut follows (after a clause end or another word than a function "
                  "word the prefix may sound finished), cut-off rate:")
            for n, by_word in anycut.items():
                print(f"    {n}: " + "; ".join(f"{k}: {v['cut_off_pct']:g}% of {v['n']}" for k, v in by_word.items()))
    times = model.times_ms
    summary["model_inference_ms"] = {"calls": len(times), "p50": round(statistics.median(times), 1),
                                     "p90": round(float(np.percentile(times, 90)), 1), "threads": args.threads}
    summary["model_inference_ms"]["answer_ms_in_decisions"] = args.answer_ms or "measured"
    print(f"\nSmart Turn v3.2 inference: median {summary['model_inference_ms']['p50']} ms, "
          f"p90 {summary['model_inference_ms']['p90']} ms over {len(times)} calls ({args.threads} thread); the "
          "decisions take each answer to be ready "
          + (f"{args.answer_ms:g} ms after the pause is heard" if args.answer_ms > 0 else "after its measured time"))
    print("FALSE: false cut-offs, the share of all headline samples (complete, mid-phrase cut, hesitation with a "
          "filler) whose turn was ended before the caller's true end of speech; paused: the same over the samples "
          "with a pause the caller meant to talk on through (the cuts, the hesitations and the complete samples "
          "with a pause inside); early: complete samples ended before their true end; p50/p90 ms: true end of "
          "speech to the end-of-turn decision on complete samples not ended early; late: complete samples that "
          "the model judged unfinished, ended by incomplete_silence_ms; @P: the cut-off rate of the mid-phrase "
          "cut and hesitation samples by pause length; midcut, hes.: the cut-off rate of those two kinds; "
          "|anycut, |ellip.: the cut-off rate of the cut-anywhere and bare-ellipsis samples, NOT in the headline. "
          "eE tT iI: early_final_ms, turn_threshold, incomplete_silence_ms. Every inserted pause is 0.6-1.2 s, so "
          "480 ms of silence cuts off all of them by construction, and i1500 and i2000 cut off the same samples "
          f"(they differ only in the delay of late ones). Run took {time.perf_counter() - began:.0f} s.")
    if args.json:
        keep = {silence, default, recommended}
        report = {"cpu": cpu.describe(), "settings": base.model_dump(), "function_words": sorted(FUNCTION_WORDS),
                  "summary": summary, "skipped": skipped,
                  "samples": [{k: getattr(s, k) for k in SAMPLE_FIELDS} for s in samples],
                  "results": {name: compact(res, name in keep) for name, res in results.items()}}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=None, separators=(",", ":")))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
