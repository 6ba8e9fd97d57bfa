"""Every event that flows between stages, in one place. Frozen: a stage never changes what it got.

Times (`at`) are seconds from the session's injected Clock. Audio inside the pipeline is float32
mono: 16 kHz on the input side, the output rate on the reply side.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from models.llm.tool_calls import ToolCall, Tools
from models.protocols import Audio, ChatMessage, GenerationStats

# -- input side: audio in -> endpointing -> ASR ------------------------------------------------------


@dataclass(frozen=True)
class AudioFrame:
    samples: Audio  # 16 kHz: what the VAD hears
    at: float
    heard: Audio | None = None  # what the recognizer hears instead, sample for sample (noise suppressed), if other


@dataclass(frozen=True)
class SpeechStarted:
    turn_id: int
    at: float
    audio_ms: float  # where speech began in the caller's audio stream


@dataclass(frozen=True)
class SpeechAudio:
    turn_id: int
    samples: Audio  # 16 kHz, the turn's speech (with its prefix padding)


@dataclass(frozen=True)
class SpeechPaused:
    """The caller has been silent for `early_final_ms`: the turn may be ending (the end-of-turn model
    is asked, and the final transcript starts)."""

    turn_id: int
    at: float


@dataclass(frozen=True)
class SpeechResumed:
    """The caller spoke again after a pause: the turn goes on."""

    turn_id: int
    at: float


@dataclass(frozen=True)
class SpeechStopped:
    turn_id: int
    at: float  # when endpointing decided the turn is over: the `speech_end` mark
    audio_ms: float  # where speech ended in the caller's audio stream
    ended_at: float  # estimated clock time the caller actually stopped (at - the silence waited for)
    forced: bool = False  # cut at the turn length limit rather than by silence
    turn_probability: float | None = None  # the end-of-turn model's answer at the pause that ended it


@dataclass(frozen=True)
class TranscriptPartial:
    turn_id: int
    text: str
    at: float


@dataclass(frozen=True)
class TranscriptFinal:
    turn_id: int
    text: str
    at: float


@dataclass(frozen=True)
class TranscriptEarly:
    """The turn's transcript made at a pause, before the turn is known to be over: a preemptive
    reply may start on it, its audio held until the turn ends (and dropped if the caller goes on)."""

    turn_id: int
    text: str
    at: float
    speech_s: float = 0.0  # the audio the transcript was made of
    avg_logprob: float | None = None  # the recognizer's confidence, where it gives one
    no_speech_prob: float | None = None
    paused_at: float | None = None  # when the pause was heard
    last_word_prob: float | None = None  # the recognizer's confidence in the last word (models.protocols.Heard)
    end_mark_prob: float | None = None  # ... and in the final punctuation mark


SpeechEvent = SpeechStarted | SpeechAudio | SpeechPaused | SpeechResumed | SpeechStopped

# -- reply side: LLM -> phrase chunker -> TTS -------------------------------------------------------


@dataclass(frozen=True)
class ReplyRequest:
    turn_id: int
    messages: tuple[ChatMessage, ...]
    at: float
    tools: Tools | None = None  # what the reply may call


@dataclass(frozen=True)
class ReplyToolCall:
    """A tool call the reply made, complete."""

    turn_id: int
    call: ToolCall
    at: float


@dataclass(frozen=True)
class ReplyToolCallDelta:
    """A piece of a tool call's arguments as the LLM writes them."""

    turn_id: int
    call_id: str
    name: str
    delta: str


@dataclass(frozen=True)
class FunctionCallDelta:
    """A piece of the arguments of a call of one of the client's tools, as the model writes them;
    the FunctionCallRequest with the same call id follows once the reply is known to be heard."""

    turn_id: int
    call_id: str
    name: str
    delta: str


@dataclass(frozen=True)
class FunctionCallRequest:
    """The server asks the client to run one of the client's tools (`response.function_call`)."""

    turn_id: int
    call: ToolCall


@dataclass(frozen=True)
class ReplyText:
    """A piece of the reply's text as the LLM produced it."""

    turn_id: int
    text: str
    at: float


@dataclass(frozen=True)
class ReplyFinished:
    """The LLM finished (or failed) this reply; stats as the backend measured them."""

    turn_id: int
    stats: GenerationStats | None
    at: float
    error: str | None = None


@dataclass(frozen=True)
class Phrase:
    """A speakable piece of the reply, cut where a listener would pause."""

    turn_id: int
    index: int
    text: str  # as the LLM wrote it (what the history keeps)
    speech: str  # cleaned for the synthesizer (no markdown, no emoji)
    at: float


@dataclass(frozen=True)
class ReplyAudio:
    turn_id: int
    phrase_index: int
    samples: Audio  # at the session's output rate
    at: float


ReplyEvent = ReplyText | ReplyToolCallDelta | ReplyToolCall | ReplyFinished | Phrase | ReplyAudio

# -- what the session tells its transport -----------------------------------------------------------


@dataclass(frozen=True)
class ResponseDone:
    turn_id: int
    text: str  # what the caller was sent
    status: str  # completed | interrupted | failed
    latency_ms: dict[str, float]
    voice_to_voice_ms: float | None = None  # from the caller's true end of speech to first audio sent
    stats: GenerationStats | None = None
    deadline_missed: bool = False  # first audio sent later than session.first_audio_budget_ms after speech ended
    underruns: int = 0  # gaps in the reply's audio once it started (the caller's playback ran dry)
    underrun_ms: float = 0.0  # their total length
    preemptive: bool = False  # started at a pause, before the turn was known to be over, and used
    discarded: int = 0  # preemptive replies dropped during this turn because the caller went on
    discarded_words: int = 0  # the words those had generated: work thrown away
    # For the call's record (app/call_log.py), not the wire: what the caller said (or the keys), what
    # the LLM wrote and what went out as audio (`text` is what was heard), the reply's error, the keys
    # pressed, and the clock time of speech_end.
    user_text: str = ""
    generated_text: str = ""
    sent_text: str = ""
    error: str | None = None
    dtmf: str | None = None
    speech_end_at: float | None = None
    tool_calls: tuple[dict[str, Any], ...] = ()  # the reply's calls (ToolRun.as_dict), status "tool_calls"
    filler: bool = False  # the spoken filler while a slow tool ran, not an answer
    endpointing_ms: dict[str, float] = field(default_factory=dict)  # the end-of-turn decision's own marks
    taken_back: bool = False  # the caller went on at its start: not in the history, their words join the next turn
    llm_steps: tuple[dict[str, Any], ...] = ()  # every LLM reply to the turn so far (Turn.llm_steps)


@dataclass(frozen=True)
class ErrorEvent:
    code: str
    message: str
    turn_id: int | None = None


InputEvent = (SpeechStarted | SpeechPaused | SpeechResumed | SpeechStopped | TranscriptPartial | TranscriptEarly
              | TranscriptFinal | ErrorEvent)
OutEvent = InputEvent | ReplyText | ResponseDone | FunctionCallDelta | FunctionCallRequest
