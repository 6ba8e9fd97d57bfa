"""Speech recognition with faster-whisper (CTranslate2): int8 on CPU, float16 on CUDA.

Whisper pads every input to a 30 s window, and its encoder's cost grows with the window, not with
the speech: on 2 CPU cores, whisper-tiny.en encodes 30 s in ~240 ms and 10 s in ~30 ms. A caller's
turn is a few seconds, so the utterance is padded only up to a multiple of `asr.window_s` and
decoded in one pass. Short windows can make Whisper repeat itself; such a transcript (compression
ratio over 2.4, faster-whisper's own test) is redone on the full 30 s window.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from core.errors import BackendUnavailableError, EngineError, ModelMissingError
from core.private import log_private, words
from models.config import AsrConfig
from models.cpu import cores
from models.packs.cache import resolve
from models.protocols import Audio, Heard

log = logging.getLogger(__name__)


class FasterWhisperRecognizer:
    sample_rate = 16000

    def __init__(self, config: AsrConfig) -> None:
        try:
            from faster_whisper import WhisperModel
        except ImportError as exc:
            raise BackendUnavailableError("faster-whisper is not installed: pip install faster-whisper") from exc
        self.config = config
        path = resolve(config.model)
        device = config.device
        compute_type = config.compute_type
        if device == "cuda" and compute_type == "int8":
            compute_type = "float16"
        try:
            self._model = WhisperModel(path, device=device, compute_type=compute_type,
                                       cpu_threads=config.threads or cores())
        except (RuntimeError, ValueError, OSError) as exc:
            if "not found" in str(exc).lower() or isinstance(exc, OSError):
                raise ModelMissingError(
                    f"cannot load Whisper from {path!r}: {exc}; fetch it with `voice-agent models fetch`"
                ) from exc
            raise BackendUnavailableError(f"faster-whisper cannot run on {device}/{compute_type}: {exc}") from exc
        self._windowed: ShortWindow | None = None
        if config.window_s < WHISPER_WINDOW_S and config.language:
            self._windowed = ShortWindow(self._model, config.language, config.window_s, config.end_confidence)
        log.info("ASR: faster-whisper %s on %s (%s), %d s window", config.model, device, compute_type,
                 config.window_s if self._windowed else WHISPER_WINDOW_S)

    def transcribe(self, audio: Audio, beam_size: int | None = None) -> str:
        return self.transcribe_scored(audio, beam_size).text

    def transcribe_scored(self, audio: Audio, beam_size: int | None = None) -> Heard:
        if len(audio) < self.sample_rate // 10:
            return Heard("")
        audio = np.ascontiguousarray(audio, dtype=np.float32)
        beam = beam_size or self.config.beam_size
        try:
            if self._windowed is not None and len(audio) < (WHISPER_WINDOW_S - 1) * self.sample_rate:
                heard = self._windowed(audio, beam)
                if heard is not None:
                    return heard
            return self._whole(audio, beam)
        except RuntimeError as exc:
            raise EngineError(f"faster-whisper failed: {exc}") from exc

    def _whole(self, audio: np.ndarray, beam: int) -> Heard:
        """faster-whisper's own path: 30 s windows, temperature fallback."""
        segments, _ = self._model.transcribe(
            audio, language=self.config.language, beam_size=beam, vad_filter=False,
            condition_on_previous_text=False, without_timestamps=True,
        )
        kept = [s for s in segments if not _no_speech(s.no_speech_prob, s.avg_logprob)]
        text = " ".join(s.text.strip() for s in kept).strip()
        if not kept:
            return Heard(text)
        return Heard(text, min(s.avg_logprob for s in kept), max(s.no_speech_prob for s in kept))


WHISPER_WINDOW_S = 30
FRAMES_PER_S = 100  # Whisper's log-mel hop: 10 ms
MAX_TOKENS = 448  # Whisper's decoder context


def _no_speech(no_speech_prob: float, avg_logprob: float) -> bool:
    """faster-whisper's silence test (its no_speech_threshold and log_prob_threshold defaults)."""
    return no_speech_prob > 0.6 and avg_logprob < -1.0


class ShortWindow:
    """One utterance decoded in one pass over a window of `window_s` multiples (see the module doc)."""

    def __init__(self, model: Any, language: str, window_s: int, end_confidence: bool = False) -> None:
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_suppressed_tokens

        self.model = model
        self.end_confidence = end_confidence
        self.step = window_s * FRAMES_PER_S
        self.tokenizer = Tokenizer(model.hf_tokenizer, model.model.is_multilingual, task="transcribe",
                                   language=language)
        self.prompt = [*self.tokenizer.sot_sequence, self.tokenizer.no_timestamps]
        self.suppress = list(get_suppressed_tokens(self.tokenizer, [-1]))

    def __call__(self, audio: np.ndarray, beam: int) -> Heard | None:
        """The transcript, or None when the full window must decide (Whisper repeated itself)."""
        from faster_whisper.audio import pad_or_trim
        from faster_whisper.transcribe import get_compression_ratio

        features = self.model.feature_extractor(audio)
        window = min(WHISPER_WINDOW_S * FRAMES_PER_S, -(-features.shape[-1] // self.step) * self.step)
        encoded = self.model.encode(pad_or_trim(features, window))
        result = self.model.model.generate(
            encoded, [self.prompt], beam_size=beam, patience=1.0, length_penalty=1.0, max_length=MAX_TOKENS,
            return_scores=True, return_no_speech_prob=True, suppress_blank=True, suppress_tokens=self.suppress,
        )[0]
        tokens = result.sequences_ids[0]
        text: str = self.tokenizer.decode(tokens).strip()
        # the score is the summed log-probability over len(tokens) (length_penalty 1); faster-whisper
        # averages it over the tokens and the end token
        avg_logprob = result.scores[0] * len(tokens) / (len(tokens) + 1)
        if result.no_speech_prob > 0.6:
            # Maybe no speech: a short window makes "Thank you." of silence where the full one
            # makes nothing. Rare behind the VAD; the full window decides.
            log_private(log, logging.DEBUG, "ASR: no speech? (%.2f, %.2f, %r); decoding the full 30 s window",
                        result.no_speech_prob, avg_logprob, words(text))
            return None
        if get_compression_ratio(text) > 2.4:
            log_private(log, logging.INFO, "ASR: the %d s window repeated itself (%r); decoding the full 30 s window",
                        window // 100, words(text))
            return None
        if not any(c.isalnum() for c in text):
            return Heard("")
        if not self.end_confidence:
            return Heard(text, float(avg_logprob), float(result.no_speech_prob))
        last_word, end_mark = self.tail_confidence(encoded, tokens, features.shape[-1])
        return Heard(text, float(avg_logprob), float(result.no_speech_prob), last_word, end_mark)

    def tail_confidence(self, encoded: Any, tokens: list[int], frames: int) -> tuple[float | None, float | None]:
        """How sure the decoder was of the transcript's last word (the mean probability of its tokens)
        and of its final punctuation mark, each given the tokens before it: one teacher-forced
        decoder pass over the transcript (CTranslate2's align, as word timestamps use; ~10 ms for
        whisper-tiny on 2 cores)."""
        if not tokens:
            return None, None
        probs = list(self.model.model.align(encoded, self.tokenizer.sot_sequence, [tokens], frames)[0]
                     .text_token_probs)
        return tail_probabilities([self.tokenizer.decode([t]) for t in tokens], probs)


def tail_probabilities(pieces: list[str], probs: list[float]) -> tuple[float | None, float | None]:
    """(the last word's probability, the final punctuation's) from a transcript's tokens as text
    (`pieces`) and each one's probability: the word is the last run of tokens with letters or digits
    that begins at a space (the mean of its tokens, as faster-whisper's word probabilities), the mark
    the punctuation after it (its least likely token); None where there is no such word or mark."""
    end = len(pieces)
    while end and not any(c.isalnum() for c in pieces[end - 1]):
        end -= 1
    end_mark = float(min(probs[end:])) if end < len(pieces) else None
    if not end:
        return None, end_mark
    start = end - 1
    while start > 0 and not pieces[start].startswith(" ") and any(c.isalnum() for c in pieces[start - 1]):
        start -= 1
    return float(np.mean(probs[start:end])), end_mark
