"""The end-of-turn evidence at the caller's latest pause, gathered where each kind is made.

The VAD stage starts a pause (`pause`): the end-of-turn model hears the turn's audio on its worker.
The session, once the transcript made at the pause is ready (TranscriptEarly), asks the language
model how likely the caller's sentence ends with those words and hands the answer over (`words`).
Where the learned decision weighs the turn's prosody, it is measured at the pause too (pipeline/prosody.py).
The VAD stage reads `evidence()` at every window of the pause and ends the turn when the policy
(pipeline/turn_policy.py) says the silence so far is enough. A resumption or the turn's end clears
it. One judge per session; everything runs on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import numpy as np

from core.worker import ModelWorker
from models.protocols import TurnDetector
from pipeline import prosody
from pipeline.prosody import Prosody
from pipeline.turn_policy import Evidence, TurnPolicy

log = logging.getLogger(__name__)


class TurnJudge:
    def __init__(self, policy: TurnPolicy, audio_model: TurnDetector | None, worker: ModelWorker,
                 words: bool) -> None:
        """`policy`: the decision the evidence is for; the model is asked only where it weighs the
        model's answer. `words`: whether the session will hand over the words' probability."""
        self.policy = policy
        self.audio_model = audio_model if policy.hears else None
        self.worker = worker
        self.expects_words = words
        self.measures_prosody = policy.model is not None and policy.model.weighs_prosody
        self.turn_id: int | None = None  # the turn whose pause is being judged, if any
        self._audio: asyncio.Future[float] | None = None
        self._prosody: asyncio.Future[Prosody | None] | None = None
        self._said = Evidence()  # the words' part of the evidence, once weighed

    @property
    def active(self) -> bool:
        """Whether there is any evidence to gather (else turns end on silence alone)."""
        return self.audio_model is not None or self.expects_words

    def pause(self, turn_id: int, audio: np.ndarray) -> None:
        """A pause began in turn `turn_id`: ask the end-of-turn model about `audio` (its last 8 s, at
        16 kHz), and measure its prosody where the decision weighs it."""
        self.clear()
        self.turn_id = turn_id
        if self.audio_model is not None:
            self._audio = asyncio.ensure_future(self.worker.run(self.audio_model.probability, audio))
        if self.measures_prosody:
            self._prosody = asyncio.ensure_future(self.worker.run(prosody.measure, audio))

    def words(self, turn_id: int, probability: float | None, words: str | None = None,
              asr_logprob: float | None = None, last_word: float | None = None,
              end_mark: float | None = None) -> None:
        """The language model's probability that the caller's sentence ends with `words`, the
        transcript of what was said up to the pause of turn `turn_id` (ignored once that pause is
        over), and the recognizer's confidence in it: overall, in its last word and in its final
        punctuation mark (models.protocols.Heard)."""
        if turn_id == self.turn_id and probability is not None:
            self._said = Evidence(text=probability, words=words, asr_logprob=asr_logprob, asr_last_word=last_word,
                                  asr_end_mark=end_mark)

    def clear(self) -> None:
        """The pause is over (the caller went on, or the turn ended)."""
        for task in (self._audio, self._prosody):
            if task is not None:
                task.cancel()
        self.turn_id, self._audio, self._prosody, self._said = None, None, None, Evidence()

    def evidence(self) -> Evidence:
        return dataclasses.replace(self._said, audio=self._audio_answer(), prosody=self._prosody_answer())

    def _prosody_answer(self) -> Prosody | None:
        task = self._prosody
        if task is None or not task.done() or task.cancelled():
            return None
        exc = task.exception()
        if exc is not None:
            log.warning("measuring the turn's prosody failed (%s); this pause is judged without it", exc)
            self._prosody = None
            return None
        return task.result()

    def _audio_answer(self) -> float | None:
        """The model's probability once it has answered; None before, or if it failed (the pause is
        then judged on the words, or on silence)."""
        task = self._audio
        if task is None or not task.done() or task.cancelled():
            return None
        exc = task.exception()
        if exc is not None:
            log.warning("the end-of-turn model failed (%s); this pause is judged without it", exc)
            self._audio = None
            return None
        return task.result()
