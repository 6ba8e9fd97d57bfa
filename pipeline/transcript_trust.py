"""Whether a transcript made at a pause can be taken as evidence that the caller has finished.

Whisper, asked about audio cut off mid-sentence, sometimes guesses: it repeats itself ("Could you
remind me too? Could you remind me too?", which the language model scores 0.9 as a finished
sentence), writes more words than the audio can hold, or says so in its own confidence. Such a
transcript counts as no evidence (the pause is judged as if the words had not come), not as
"finished". Each rule is a plain test on what the recognizer gives; `doubt` names the first that
fails.
"""

from __future__ import annotations

import re

MAX_WORDS_PER_S = 6.0  # read speech runs 2.5-4 words a second; a transcript past this invents words
MIN_AVG_LOGPROB = -1.0  # faster-whisper's own log_prob_threshold: below it, Whisper retries at a temperature
MAX_NO_SPEECH = 0.6  # faster-whisper's no_speech_threshold
MIN_SPEECH_S = 1.0  # the words-per-second test needs this much audio
MIN_REPEAT_WORDS = 3

_DIGITS = frozenset(["zero", "oh", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"])


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def repeats_itself(text: str) -> bool:
    """A run of three or more words said twice in a row (Whisper looping: "Thank you very much.
    Thank you very much."); shorter repeats are how people talk ("no no no", "thank you, thank
    you") and digits repeat in numbers."""
    words = _words(text)
    for n in range(MIN_REPEAT_WORDS, len(words) // 2 + 1):
        for i in range(len(words) - 2 * n + 1):
            if words[i:i + n] == words[i + n:i + 2 * n] and not all(w in _DIGITS or w.isdigit()
                                                                    for w in words[i:i + n]):
                return True
    return False


def doubt(text: str, speech_s: float, avg_logprob: float | None = None,
          no_speech_prob: float | None = None) -> str | None:
    """Why the transcript `text` of `speech_s` seconds of audio is not evidence, or None if it is."""
    if repeats_itself(text):
        return "it repeats itself"
    if no_speech_prob is not None and no_speech_prob > MAX_NO_SPEECH:
        return f"the recognizer says it may be no speech ({no_speech_prob:.2f})"
    if avg_logprob is not None and avg_logprob < MIN_AVG_LOGPROB:
        return f"the recognizer is guessing (mean log-probability {avg_logprob:.2f})"
    n = len(_words(text))
    if speech_s >= MIN_SPEECH_S and n / speech_s > MAX_WORDS_PER_S:
        return f"{n} words in {speech_s:.1f} s of audio"
    return None
