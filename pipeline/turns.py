"""A turn's latency marks and the bookkeeping of what part of a reply the caller was sent."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MARKS = ("speech_end", "asr_final", "llm_first_token", "first_phrase", "tts_first_audio", "first_audio_sent")
# a turn that made tool calls also has these (its first call sent, every result in, the answer's first audio)
TOOL_MARKS = ("tool_dispatched", "tools_done", "answer_first_audio_sent")


@dataclass
class Turn:
    """One caller utterance and the reply to it. Marks are clock times; latency_ms() gives them as
    milliseconds since `speech_end`."""

    turn_id: int
    marks: dict[str, float] = field(default_factory=dict)
    ended_at: float | None = None  # estimated clock time the caller's speech really ended
    dtmf: str | None = None  # the keys pressed, when the turn is a keypad turn
    tool_runs: list[Any] = field(default_factory=list)  # every tool call of the turn (pipeline.tools.ToolRun)
    held_record: Any = None  # a tool-calls reply's ResponseDone, recorded only if no follow-up comes
    # each LLM reply to the turn, in order (the calls' reply, then the follow-up): what its prompt
    # cost (prefill_tokens were computed; the rest came from the cache) and its first token
    llm_steps: list[dict[str, Any]] = field(default_factory=list)
    sent_samples: int = 0  # reply audio sent for this turn so far, by every reply to it (a filler, an answer)
    played_samples: int = 0  # the client's latest report of this turn's audio played (it counts per turn)
    # the end-of-turn decision at the turn's last pause: when the pause was heard, the transcript made
    # there was ready, and the words were weighed (clock times; each pause overwrites them)
    endpointing: dict[str, float] = field(default_factory=dict)

    def mark(self, name: str, at: float) -> None:
        self.marks.setdefault(name, at)

    def latency_ms(self) -> dict[str, float]:
        end = self.marks.get("speech_end")
        if end is None:
            return {}
        return {name: round((self.marks[name] - end) * 1000, 1) for name in (*MARKS, *TOOL_MARKS)
                if name in self.marks}

    def endpointing_ms(self) -> dict[str, float]:
        """The decision's marks as milliseconds since `speech_end` (negative: before the decision)."""
        end = self.marks.get("speech_end")
        if end is None:
            return {}
        return {name: round((at - end) * 1000, 1) for name, at in self.endpointing.items()}

    def voice_to_voice_ms(self) -> float | None:
        sent = self.marks.get("first_audio_sent")
        if sent is None or self.ended_at is None:
            return None
        return round((sent - self.ended_at) * 1000, 1)


@dataclass
class PhraseLedger:
    """Per phrase: its text, how much audio was produced, how much was sent."""

    texts: dict[int, str] = field(default_factory=dict)
    produced: dict[int, int] = field(default_factory=dict)
    sent: dict[int, int] = field(default_factory=dict)

    def add_phrase(self, index: int, text: str) -> None:
        self.texts[index] = text

    def add_audio(self, index: int, samples: int) -> None:
        self.produced[index] = self.produced.get(index, 0) + samples

    def add_sent(self, index: int, samples: int) -> None:
        self.sent[index] = self.sent.get(index, 0) + samples

    def full_text(self) -> str:
        return " ".join(self.texts[i] for i in sorted(self.texts))

    def sent_samples(self) -> int:
        return sum(self.sent.values())

    def sent_text(self) -> str:
        """The reply as far as its audio went out."""
        return self.text_until(self.sent_samples())

    def text_until(self, samples: int) -> str:
        """The words whose audio lies within the first `samples` samples sent: whole phrases, then
        the part of the phrase that was cut, in proportion to its characters (to within a word)."""
        parts: list[str] = []
        left = samples
        for i in sorted(self.texts):
            sent = min(self.sent.get(i, 0), left)
            if sent <= 0:
                break
            produced = max(self.produced.get(i, 0), sent)
            if sent >= produced:  # the whole phrase
                parts.append(self.texts[i])
                left -= sent
                continue
            # the cut phrase: the words within the played share of its characters; a word counts
            # once half of it was heard
            text, kept, chars = self.texts[i], [], 0
            limit = sent / produced * len(text)
            for word in text.split():
                if chars + len(word) / 2 > limit:
                    break
                kept.append(word)
                chars += len(word) + 1
            parts.append(" ".join(kept))
            break
        return " ".join(p for p in parts if p)
