"""Trimming a synthesizer's silence around a phrase, as its audio streams: the silence before the
first sound is dropped (but for `onset_ms`), a silence inside the phrase is held back and sent
once the sound resumes (cut to `max_inner_silence_ms`), and the silence after the last sound is
cut to a pause chosen from the phrase's last mark. Only silence is ever held back or dropped; no
sample is added, so audio without silence passes as it is."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import numpy as np

from models.protocols import Audio
from pipeline.config import TrimConfig

FRAME_MS = 5  # silence is decided over frames this long, counted from the phrase's first sample
_CLOSERS = "\"')]}”’»"
_SENTENCE_MARKS = (".", "?", "!", "…")
_CLAUSE_MARKS = (",", ";", ":", "-", "–", "—")
_EMPTY: Audio = np.zeros(0, dtype=np.float32)


def pause_ms(text: str, config: TrimConfig) -> int:
    """The pause after a phrase, by its last mark (past closing quotes and brackets): a
    sentence's end, a clause's end, or none (a phrase cut mid-sentence)."""
    end = text.rstrip().rstrip(_CLOSERS)
    if end.endswith(_SENTENCE_MARKS):
        return config.sentence_pause_ms
    if end.endswith(_CLAUSE_MARKS):
        return config.clause_pause_ms
    return config.cut_pause_ms


class SilenceTrimmer:
    """One phrase's audio, chunk by chunk: `push` returns what may be sent now (sound, and the
    silence before it), `finish` the pause after the last sound. A phrase that is all silence
    gives nothing. Any cut of the same audio into chunks gives the same audio out."""

    def __init__(self, rate: int, pause_ms: int, config: TrimConfig) -> None:
        self.enabled = config.enabled
        self.level = 10 ** (config.silence_db / 20)  # RMS, relative to full scale (1.0)
        self.frame = max(1, rate * FRAME_MS // 1000)
        self.onset = rate * config.onset_ms // 1000
        self.max_held = rate * config.max_inner_silence_ms // 1000
        self.pause = rate * pause_ms // 1000
        self.sounded = False  # a sound came: silence from now on is inside the phrase or after it
        self.pending = _EMPTY  # the start of a frame not yet whole
        self.held: list[Audio] = []  # silence held back (before the first sound: its last `onset` samples)
        self.held_samples = 0  # after the first sound: the samples in `held`

    def push(self, chunk: Audio) -> Audio:
        if not self.enabled:
            return chunk
        audio = np.concatenate((self.pending, chunk)) if len(self.pending) else chunk
        whole = len(audio) // self.frame * self.frame
        self.pending = audio[whole:]
        return self._frames(audio[:whole])

    def finish(self) -> Audio:
        """The last (shorter) frame, if it sounds, and the silence after the last sound cut to
        the pause."""
        if not self.enabled:
            return _EMPTY
        out = self._frames(self.pending)
        self.pending = _EMPTY
        tail = np.concatenate(self.held)[:self.pause] if self.sounded and self.held else _EMPTY
        self.held, self.held_samples = [], 0
        return np.concatenate((out, tail)) if len(tail) else out

    def _frames(self, audio: Audio) -> Audio:
        """Decide each frame of `audio` (whole frames; at the phrase's end, one shorter frame) and
        pass on its runs of sound and silence; what may be sent now is returned."""
        if not len(audio):
            return _EMPTY
        starts = np.arange(0, len(audio), self.frame)
        squares = np.add.reduceat(np.square(audio, dtype=np.float64), starts)
        loud = squares / np.diff(np.append(starts, len(audio))) >= self.level ** 2  # RMS >= level
        out: list[Audio] = []
        edges = [0, *(np.flatnonzero(np.diff(loud)) + 1), len(loud)]
        for first, last in itertools.pairwise(edges):
            run = audio[starts[first]:starts[last] if last < len(starts) else len(audio)]
            if loud[first]:
                self._sound(run, out)
            else:
                self._silence(run)
        return np.concatenate(out) if out else _EMPTY

    def _sound(self, run: Audio, out: list[Audio]) -> None:
        if not self.sounded:  # the first sound: from `onset` before its first loud sample
            first = int(np.argmax(np.abs(run) >= self.level))
            before = np.concatenate((*self.held, run[:first]))
            out.append(before[max(0, len(before) - self.onset):])
            run = run[first:]
            self.sounded = True
        else:
            out.extend(self.held)
        out.append(run)
        self.held, self.held_samples = [], 0

    def _silence(self, run: Audio) -> None:
        if not self.sounded:
            before = np.concatenate((*self.held, run))
            self.held = [before[max(0, len(before) - self.onset):]]
        elif self.held_samples < self.max_held:
            kept = run[:self.max_held - self.held_samples]
            self.held.append(kept)
            self.held_samples += len(kept)


def trim_phrase(chunks: Iterable[Audio], rate: int, text: str, config: TrimConfig) -> Iterator[Audio]:
    """A phrase's chunks with its silence trimmed (non-empty pieces, as soon as each may go)."""
    trimmer = SilenceTrimmer(rate, pause_ms(text, config), config)
    for chunk in chunks:
        if len(out := trimmer.push(chunk)):
            yield out
    if len(out := trimmer.finish()):
        yield out
