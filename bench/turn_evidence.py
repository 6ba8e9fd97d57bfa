"""The end-of-turn evidence at every pause of the turn-detection set (bench/turn_set.py), gathered once
and cached, so that bench/turn_detection.py can try any decision rule on it in seconds.

Each sample runs through the real Silero VAD and `pipeline.endpointing.Endpointer`, window by window,
as `vad_stage` does, with the turn never ended (so that every pause is seen). At each pause (silence of
`early_final_ms`), as the service does it:
- the sound: Smart Turn v3.2 hears the turn's audio (from its start less the prefix padding, up to
  the pause; its last 8 s);
- the words: the service's recognizer (faster-whisper, asr.model, asr.beam_size) transcribes the
  same audio (the early final transcript, with the recognizer's confidence), and the embedded LLM
  (llm.model, the default system prompt) gives its probability that the caller's message ends with those words
  (`EmbeddedConversation.end_of_turn` on `bare_words(transcript)`, as the session asks it).
Kept per pause: when it began, the silence and position of each of its VAD windows until the caller
went on (or the audio ended), both probabilities, the transcript, and each model's time. The words'
probability depends on the transcript alone, so it is cached apart, by transcript (`weigh_words`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from bench.turn_set import Sample
from core.clock import MonotonicClock
from models.config import AsrConfig, LlmConfig
from models.llm.llm_embedded import EmbeddedLLM
from models.llm.llm_factory import load_embedded
from models.packs.cache import cache_root, resolve
from models.protocols import ChatMessage
from models.speech.asr_faster_whisper import FasterWhisperRecognizer
from models.speech.turn_smart import SmartTurn
from models.speech.vad_silero import SileroVad
from pipeline import prosody
from pipeline.config import DEFAULT_SYSTEM_PROMPT, EndpointingConfig
from pipeline.endpointing import TURN_MODEL_S, Endpointer
from pipeline.turn_policy import bare_words

RATE = 16000
WINDOW_MS = 1000.0 * SileroVad.window_samples / RATE
CACHE_VERSION = 4
WORDS_VERSION = 2
# the settings where the pauses are (the decision's own do not change the evidence)
VAD_FIELDS = {"threshold", "neg_threshold", "min_speech_ms", "prefix_padding_ms", "max_turn_s", "early_final_ms"}


@dataclass
class Pause:
    sample: str
    at_ms: float  # when the pause was heard (early_final_ms of silence): the evidence is asked for here
    silence_from_ms: float  # where the silence began
    windows_ms: list[float]  # the end of each VAD window from the pause on, while it lasts
    silence_ms: list[float]  # the silence counted at each of those windows
    p_audio: float
    p_text: float | None  # the words' probability: filled in by weigh_words
    words: str
    audio_ms: float  # Smart Turn's inference time
    asr_ms: float
    llm_ms: float
    avg_logprob: float | None = None  # the recognizer's confidence in `words` (models.protocols.Heard)
    no_speech_prob: float | None = None
    speech_ms: float = 0.0  # the audio transcribed: the turn from its start less the padding, to the pause
    last_word_prob: float | None = None  # the recognizer's confidence in the last word and the end mark
    end_mark_prob: float | None = None
    prosody: dict[str, float] | None = None  # pipeline/prosody.py's measures at the pause: filled in by measure_prosody


class Gatherer:
    """The three models, loaded once; `pauses(sample)` gives the sample's pauses with their evidence."""

    def __init__(self, early_final_ms: int, threads: int = 1) -> None:
        self.config = EndpointingConfig(early_final_ms=early_final_ms, max_patience_ms=600_000)
        self.vad = SileroVad()
        self.turn = SmartTurn(resolve("smart-turn-v3.2-cpu"), threads=threads)
        self.asr_config = AsrConfig(end_confidence=True)
        self.asr = FasterWhisperRecognizer(self.asr_config)
        self.turn.probability(np.zeros(RATE, np.float32))  # warm up
        self.asr.transcribe(np.zeros(RATE, np.float32))

    def pauses(self, sample: Sample) -> list[Pause]:
        probs = self.vad.new_stream().probabilities(sample.audio)
        endpointer = Endpointer(self.config, WINDOW_MS, judged=True)
        out: list[Pause] = []
        open_pause: Pause | None = None
        turn_start_ms = 0.0
        for prob in probs:
            decision = endpointer.feed(prob)
            now = endpointer.position_ms
            if open_pause is not None and endpointer.in_pause():
                open_pause.windows_ms.append(now)
                open_pause.silence_ms.append(endpointer.silence_ms)
            if decision is None:
                continue
            if decision.kind == "start":
                turn_start_ms = decision.audio_ms
            elif decision.kind == "pause":
                start = int(max(0.0, turn_start_ms - self.config.prefix_padding_ms) * RATE / 1000)
                open_pause = self._ask(sample, start, int(now * RATE / 1000), now, decision.audio_ms)
                open_pause.windows_ms.append(now)
                open_pause.silence_ms.append(endpointer.silence_ms)
                out.append(open_pause)
            elif decision.kind in ("resume", "stop"):
                open_pause = None
        return out

    def _ask(self, sample: Sample, start: int, end: int, at_ms: float, silence_from_ms: float) -> Pause:
        audio = sample.audio[start:end]
        began = time.perf_counter()
        p_audio = self.turn.probability(audio[-int(TURN_MODEL_S * RATE):])
        audio_ms = 1000 * (time.perf_counter() - began)
        began = time.perf_counter()
        heard = self.asr.transcribe_scored(audio)
        asr_ms = 1000 * (time.perf_counter() - began)
        return Pause(sample.id, at_ms, silence_from_ms, [], [], round(p_audio, 5), None, heard.text.strip(),
                     round(audio_ms, 1), round(asr_ms, 1), 0.0,
                     None if heard.avg_logprob is None else round(heard.avg_logprob, 4),
                     None if heard.no_speech_prob is None else round(heard.no_speech_prob, 4),
                     round(1000 * len(audio) / RATE, 1),
                     None if heard.last_word_prob is None else round(heard.last_word_prob, 4),
                     None if heard.end_mark_prob is None else round(heard.end_mark_prob, 4))


class WordsJudge:
    """The embedded LLM (llm.model, the default system prompt, unless given), asked as the session asks it."""

    def __init__(self, pack: str | None = None, prompt: str = DEFAULT_SYSTEM_PROMPT) -> None:
        config = LlmConfig() if pack is None else LlmConfig(model=pack)
        self.llm: EmbeddedLLM = load_embedded(config, MonotonicClock(), sequences=2)
        self.loop = asyncio.new_event_loop()
        self.conversation = self.llm.conversation()
        self.system = ChatMessage("system", prompt)
        self.probability("Hello there.")  # the system prompt's prefill is not a pause's cost

    def probability(self, words: str) -> tuple[float | None, float]:
        """(P(the message ends with these words), ms taken)."""
        began = time.perf_counter()
        messages = (self.system, ChatMessage("user", bare_words(words)))
        p = self.loop.run_until_complete(self.conversation.end_of_turn(messages))
        return (None if p is None else float(f"{p:.4g}")), round(1000 * (time.perf_counter() - began), 1)

    def close(self) -> None:
        self.loop.run_until_complete(self.llm.aclose())
        self.loop.close()


def weigh_words(evidence: dict[str, list[Pause]], say: Any = print) -> None:
    """Fill in each pause's words' probability and the LLM's time, from the cache or asked now."""
    path = cache_root() / "bench-audio" / "turn_evidence" / "words.json"
    key = repr((WORDS_VERSION, LlmConfig().model, DEFAULT_SYSTEM_PROMPT))
    cached: dict[str, list[Any]] = {}
    if path.is_file() and (stored := json.loads(path.read_text()))["key"] == key:
        cached = stored["words"]
    wanted = sorted({p.words for ps in evidence.values() for p in ps if p.words and p.words not in cached})
    if wanted:
        say(f"loading the LLM to weigh {len(wanted)} transcripts")
        judge = WordsJudge()
        try:
            for n, words in enumerate(wanted):
                cached[words] = list(judge.probability(words))
                if (n + 1) % 200 == 0:
                    say(f"  words: {n + 1}/{len(wanted)}")
        finally:
            judge.close()
        path.write_text(json.dumps({"key": key, "words": cached}))
    for ps in evidence.values():
        for p in ps:
            p.p_text, p.llm_ms = cached[p.words] if p.words else (None, 0.0)


def measure_prosody(samples: list[Sample], evidence: dict[str, list[Pause]]) -> None:
    """Fill in each pause's prosody from the turn's audio up to the pause (what the session hands
    the judge: the turn from its start less the padding, the last TURN_MODEL_S seconds)."""
    for sample in samples:
        for p in evidence[sample.id]:
            end = int(p.at_ms * RATE / 1000)
            start = max(0, end - int(p.speech_ms * RATE / 1000), end - int(TURN_MODEL_S * RATE))
            measured = prosody.measure(sample.audio[start:end])
            p.prosody = None if measured is None else measured.as_dict()


def evidence_key(early_final_ms: int) -> str:
    """What the evidence depends on, besides the sample's audio: the settings and the models."""
    vad = EndpointingConfig(early_final_ms=early_final_ms).model_dump(include=VAD_FIELDS)
    return repr((CACHE_VERSION, vad, AsrConfig().model_dump(exclude={"end_confidence"}), "smart-turn-v3.2-cpu"))


def gather(samples: list[Sample], early_final_ms: int, say: Any = print) -> dict[str, list[Pause]]:
    """Every sample's pauses, from the cache (bench-audio/turn_evidence) or measured now."""
    folder = cache_root() / "bench-audio" / "turn_evidence"
    folder.mkdir(parents=True, exist_ok=True)
    gatherer: Gatherer | None = None
    out: dict[str, list[Pause]] = {}
    began, measured = time.perf_counter(), 0
    key = evidence_key(early_final_ms)
    for n, sample in enumerate(samples):
        digest = hashlib.sha256(sample.audio.tobytes()).hexdigest()[:16]
        path = folder / f"{early_final_ms}-{sample.id.replace('/', '_')}-{digest}.json"
        if path.is_file():
            cached = json.loads(path.read_text())
            if cached["key"] == key:
                out[sample.id] = [Pause(**p) for p in cached["pauses"]]
                continue
        if gatherer is None:
            say("loading Silero VAD, Smart Turn v3.2, and whisper to gather end-of-turn evidence")
            gatherer = Gatherer(early_final_ms)
        pauses = gatherer.pauses(sample)
        path.write_text(json.dumps({"key": key, "pauses": [asdict(p) for p in pauses]}))
        out[sample.id] = pauses
        measured += 1
        if measured % 50 == 0:
            say(f"  evidence: {n + 1}/{len(samples)} samples ({measured} measured, "
                f"{time.perf_counter() - began:.0f} s)")
    weigh_words(out, say)
    return out

