"""One exception tree for the service. Engines' own errors are translated at the backend boundary
into these, keeping the original as __cause__; `retryable` says whether trying again may help."""

from __future__ import annotations


class VoiceAgentError(Exception):
    """Base of every error the service raises on purpose."""

    code = "internal_error"
    retryable = False


class ConfigError(VoiceAgentError):
    """Settings that cannot work (unknown backend, bad value)."""

    code = "config_error"


class ModelMissingError(VoiceAgentError):
    """A model is not in the cache; the message names the command that fetches it."""

    code = "model_missing"


class ModelFetchError(VoiceAgentError):
    """Downloading, verifying or converting a model pack failed."""

    code = "model_fetch_failed"
    retryable = True


class IntegrityError(ModelFetchError):
    """A downloaded or assembled file does not match its pinned SHA-256."""

    code = "integrity_error"
    retryable = False


class BackendUnavailableError(VoiceAgentError):
    """An engine's extra is not installed, or an engine cannot run on this machine."""

    code = "backend_unavailable"


class MemoryBudgetError(VoiceAgentError):
    """Loading these models would exceed the configured memory budget."""

    code = "memory_budget_exceeded"


class IncompatibleModelsError(VoiceAgentError):
    """A draft model whose tokenizer or vocabulary does not match the target's."""

    code = "incompatible_models"


class EngineError(VoiceAgentError):
    """A model engine failed while running (ASR, LLM, TTS)."""

    code = "engine_error"


class ContextLengthError(EngineError):
    """A prompt longer than the model's configured context (llm.max_context_tokens)."""

    code = "context_length_exceeded"


class LLMUnavailableError(EngineError):
    """A remote LLM server could not be reached, refused, or stopped answering. `retry_after`: the
    seconds the server asked to wait (its Retry-After header), when it said."""

    code = "llm_unavailable"
    retryable = True

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ProtocolError(VoiceAgentError):
    """A client broke the wire protocol; `fatal` says whether the session must close."""

    code = "protocol_error"

    def __init__(self, code: str, message: str, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.fatal = fatal


# What a caller or an API client is told of a failure on the server's side: a stable code (the
# error's `code`) and one of these plain sentences, which say what to do. The error's own text
# (URLs, paths, the engine's exception) goes to the log and the call's record, never to a client:
# it shows the server's insides (docs/security.md, "What clients are told").
PLAIN_MESSAGES = {
    "llm_unavailable": "the language model is not reachable; try again later",
    "context_length_exceeded": "the conversation is longer than the language model can take; start a new one",
    "engine_error": "a model failed on the server; try again, and tell the server's operator if it keeps failing",
    "internal_error": "the server failed unexpectedly; try again, and tell the server's operator if it keeps failing",
}
GENERIC_MESSAGE = "the server could not do this; try again, and tell the server's operator if it keeps failing"


def error_code(error: str | None, default: str = "internal_error") -> str:
    """The code of an error as the records keep it ("llm_unavailable: cannot connect to ..." -> the
    code before the first colon), or `default`."""
    code = (error or "").split(":", 1)[0].strip()
    return code if code and " " not in code else default


def plain_message(code: str) -> str:
    """What a client is told of a server-side failure with this code (never the error's own text)."""
    return PLAIN_MESSAGES.get(code, GENERIC_MESSAGE)
