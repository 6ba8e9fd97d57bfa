"""The narrow interfaces between the pipeline and the model engines.

Every engine method here is blocking unless it is `async`; the pipeline calls blocking ones on the
engine's own worker thread (see core/worker.py), never on the event loop.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from models.llm.tool_calls import ToolCall, Tools

Audio = npt.NDArray[np.float32]  # mono samples in [-1, 1]


class VadStream(Protocol):
    """One caller's voice-activity state."""

    def probabilities(self, samples: Audio) -> list[float]:
        """Feed 16 kHz samples; one speech probability per complete window (leftovers are kept)."""
        ...


class VoiceActivityDetector(Protocol):
    sample_rate: int
    window_samples: int

    def new_stream(self) -> VadStream: ...


class TurnDetector(Protocol):
    """An end-of-turn model: from the turn's audio, how likely the caller has finished speaking."""

    name: str
    sample_rate: int

    def probability(self, audio: Audio) -> float:
        """Blocking: the probability (0-1) that the turn in this audio (16 kHz mono) is complete."""
        ...


class SpeechRecognizer(Protocol):
    sample_rate: int

    def transcribe(self, audio: Audio, beam_size: int | None = None) -> str:
        """Blocking: the text of 16 kHz mono audio ("" when nothing was said); `beam_size` overrides
        the engine's own where it has one."""
        ...


@dataclass(frozen=True)
class Heard:
    """A transcript with the recognizer's own confidence in it, where it gives one: the mean
    log-probability of its tokens, the chance that the audio held no speech, and how sure it was of
    the transcript's end: its last word (the mean probability of that word's tokens: a word cut
    mid-way is written with low confidence even where the sentence looks complete, "Can I pay with
    her?") and its final punctuation mark (None where the transcript ends without one)."""

    text: str
    avg_logprob: float | None = None
    no_speech_prob: float | None = None
    last_word_prob: float | None = None
    end_mark_prob: float | None = None


class Synthesizer(Protocol):
    name: str
    sample_rate: int

    def synthesize(self, text: str) -> Iterator[Audio]:
        """Blocking: audio chunks for the text, each as soon as it is ready."""
        ...


@dataclass(frozen=True)
class ChatMessage:
    """One message. An assistant's may end in tool calls; a "tool" message is one call's result."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    # the last message only, an assistant's: the words the reply must begin with; the model goes on from them
    unfinished: bool = False

    def as_template(self) -> dict[str, Any]:
        """The message as chat templates read it (arguments as an object, as Qwen's expects)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [{"type": "function", "id": c.call_id,
                                  "function": {"name": c.name, "arguments": c.parsed_arguments()}}
                                 for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


@dataclass(frozen=True)
class Speculation:
    """A request's choice of speculative decoding (embedded engine): method "off", "ngram" or
    "draft_model"; k a fixed number of drafted tokens, or None to let the controller choose."""

    method: str
    k: int | None = None


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy. top_k 0 and top_p 1.0 switch those filters off."""

    temperature: float = 0.7
    top_p: float = 0.8
    top_k: int = 20
    max_tokens: int = 160
    seed: int | None = None
    speculation: Speculation | None = None  # None: the engine's configured default


@dataclass
class GenerationStats:
    """What one generation did. The speculative fields stay zero under plain decoding."""

    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens actually computed (the rest came from the KV cache)
    completion_tokens: int = 0
    time_to_first_token_ms: float = 0.0
    duration_ms: float = 0.0
    finish_reason: str = "stop"
    method: str = "off"
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    forced_tokens: int = 0  # emitted because a tool call's grammar left no choice (no model step)
    accepted_per_position: list[int] = field(default_factory=list)
    k_chosen: list[int] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return 1000.0 * self.completion_tokens / self.duration_ms if self.duration_ms > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "prefill_tokens": self.prefill_tokens,
            "completion_tokens": self.completion_tokens,
            "time_to_first_token_ms": round(self.time_to_first_token_ms, 1),
            "duration_ms": round(self.duration_ms, 1),
            "tokens_per_second": round(self.tokens_per_second, 2),
            "finish_reason": self.finish_reason,
            "method": self.method,
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "forced_tokens": self.forced_tokens,
            "accepted_per_position": list(self.accepted_per_position),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_acceptance_length": round(self.mean_acceptance_length, 3),
            "k_chosen": list(self.k_chosen),
        }


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ToolCallOutput:
    """A tool call the reply made, complete (its arguments follow the tool's schema)."""

    call: ToolCall


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a tool call's arguments as the model writes them (the ToolCallOutput with the same
    `call_id` follows, its arguments these pieces joined)."""

    call_id: str
    name: str
    delta: str


@dataclass(frozen=True)
class GenerationDone:
    stats: GenerationStats


LLMOutput = TextDelta | ToolCallDelta | ToolCallOutput | GenerationDone


class Conversation(Protocol):
    """One caller's conversation with a language model: backends may keep state between turns
    (the embedded one keeps its KV cache so a turn computes only its new tokens)."""

    async def prepare(self, messages: Sequence[ChatMessage], tools: Tools | None = None,
                      open_last: bool = False) -> None:
        """Optional head start: compute what can be computed before the caller has finished (with
        the tools the next reply is offered: they are part of the prompt). `open_last`: only up to
        where the last message's content begins (a tool's result, while the tool runs)."""
        ...

    def stream(self, messages: Sequence[ChatMessage], params: SamplingParams,
               tools: Tools | None = None) -> AsyncGenerator[LLMOutput, None]:
        """Stream the assistant's reply to `messages`: text deltas and, where `tools` are offered,
        each tool call once complete; then one GenerationDone (finish_reason "tool_calls" when the
        reply made calls). Closing the iterator early cancels the generation."""
        ...

    async def end_of_turn(self, messages: Sequence[ChatMessage], tools: Tools | None = None) -> float | None:
        """The model's probability that the last message (the caller's words so far) ends there: the
        chance of its chat template's end-of-message token, or of a sentence mark, after the text.
        None where the backend cannot tell (a remote server). What the embedded engine computes for
        it stays in its cache, so a reply to the same words starts from there: the text signal costs
        one logit read."""
        ...

    def set_speculation_cap(self, cap: int | None) -> None:
        """Limit the tokens drafted per step (None: no limit); backends without speculation ignore it."""
        ...

    def set_deadline(self, at: float | None) -> None:
        """When the reply's next tokens are due (a clock time: its first audio's budget, then when
        its queued audio runs out), or None when no reply runs. A backend shared by several calls
        serves the one due soonest first; one that cannot ignores it."""
        ...

    async def aclose(self) -> None: ...


class LanguageModel(Protocol):
    name: str

    @property
    def weighs_words(self) -> bool:
        """Whether its conversations answer `end_of_turn` (the embedded engine does; a remote one not)."""
        ...

    def conversation(self, context_tokens: int | None = None) -> Conversation:
        """A conversation of its own; `context_tokens`: the most tokens it may hold (prompt and
        reply), None for the model's own bound (llm.max_context_tokens)."""
        ...

    async def aclose(self) -> None: ...
