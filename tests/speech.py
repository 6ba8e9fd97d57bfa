"""Test speech: real audio made with espeak-ng (and flite where asked), as 16-bit WAV files."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np

from app.client import read_wav


def espeak_wav(text: str, path: Path, rate: int = 16000, voice: str = "en-us", speed: int = 160) -> Path:
    """Speak `text` with espeak-ng into a mono 16-bit WAV at `rate` (resampled with sox)."""
    if shutil.which("espeak-ng") is None or shutil.which("sox") is None:
        raise RuntimeError("test speech needs espeak-ng and sox: run scripts/setup.sh --test")
    raw = path.with_suffix(".raw.wav")
    subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(raw), text], check=True)
    # -D: no dither. sox's dither is random, and whisper-tiny.en flips some transcripts on a difference that
    # small ("How many days are there in a week?" at 8 kHz heard as "How many day are you...", now and then):
    # the same text must make the same audio in every run
    subprocess.run(["sox", "-D", str(raw), "-r", str(rate), "-c", "1", "-b", "16", str(path)], check=True)
    raw.unlink()
    return path


def speech_samples(text: str, tmp: Path, rate: int = 16000) -> np.ndarray:
    samples, _ = read_wav(espeak_wav(text, tmp / f"speech_{abs(hash(text))}.wav", rate))
    return samples


def flite_samples(text: str, tmp: Path, rate: int = 16000, voice: str = "slt") -> np.ndarray:
    """`text` in one of flite's voices (another synthesizer than espeak-ng's), at `rate`."""
    if shutil.which("flite") is None or shutil.which("sox") is None:
        raise RuntimeError("test speech needs flite and sox: run scripts/setup.sh --test")
    raw = tmp / f"flite_{voice}_{abs(hash(text))}.raw.wav"
    path = raw.with_suffix("").with_suffix(".wav")
    subprocess.run(["flite", "-voice", voice, "-t", text, "-o", str(raw)], check=True)
    subprocess.run(["sox", "-D", str(raw), "-r", str(rate), "-c", "1", "-b", "16", str(path)], check=True)  # as above
    raw.unlink()
    samples, _ = read_wav(path)
    return samples


def words(text: str) -> list[str]:
    return ["".join(ch for ch in w.lower() if ch.isalnum()) for w in text.split() if any(c.isalnum() for c in w)]
