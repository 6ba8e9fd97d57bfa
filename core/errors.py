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
