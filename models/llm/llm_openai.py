"""The LLM backend for any OpenAI-compatible chat completions server (vLLM in production).

Each reply is one `POST {base_url}/chat/completions` with `stream: true`, read as server-sent
events with httpx. The server keeps no conversation state between turns (vLLM's prefix cache does
that work), so a Conversation here only sends the whole history each turn.

- Timeouts: `connect_timeout_s` to open the connection; `read_timeout_s` is the longest silence
  allowed while waiting for the response headers or between chunks (httpx's read timeout), and the
  longest gap between two complete events (by the clock, so keep-alive comments cannot hide a
  stalled generation).
- Retries: only before the first text has been handed to the caller, and only for errors that
  may pass (connection refused, timeouts, 5xx, a broken stream). Never after: the caller may
  already have heard the words.
- Cancellation: closing the reply's iterator (or cancelling the task that reads it) closes the HTTP
  response mid-stream, which closes the connection, so the server sees the disconnect and aborts
  the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import email.utils
import json
import logging
import os
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from core.clock import Clock
from core.errors import ConfigError, EngineError, LLMUnavailableError, VoiceAgentError
from models.config import LlmConfig
from models.llm.tool_calls import ToolCall, Tools, new_call_id
from models.protocols import (
    ChatMessage,
    GenerationDone,
    GenerationStats,
    LLMOutput,
    SamplingParams,
    TextDelta,
    ToolCallOutput,
)

log = logging.getLogger(__name__)


class OpenAIChatLLM:
    """LanguageModel over an OpenAI-compatible server. Nothing is sent at construction, so the
    service starts while the server is down; `warm_up` checks it and only warns."""

    def __init__(self, config: LlmConfig, clock: Clock) -> None:
        if not config.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"llm.base_url {config.base_url!r} is not an http(s) URL, e.g. http://vllm:8000/v1")
        self.config = config
        self.clock = clock
        self.base_url = config.base_url.rstrip("/")
        self.model: str | None = config.remote_model or None  # None: ask GET /models once
        self.name = self.model or f"openai@{self.base_url}"
        self._model_lock = asyncio.Lock()
        self._client: httpx.AsyncClient | None = None

    weighs_words = False  # a remote server gives no end-of-message probabilities

    def conversation(self, context_tokens: int | None = None) -> OpenAIConversation:
        return OpenAIConversation(self)  # the remote server bounds its own context

    def client(self) -> httpx.AsyncClient:
        """The connection pool shared by all conversations, made on first use (in the event loop)."""
        if self._client is None:
            self._client = httpx.AsyncClient(base_url=self.base_url, timeout=self._timeout(), headers=self._headers())
        return self._client

    def _timeout(self) -> httpx.Timeout:
        c = self.config
        return httpx.Timeout(connect=c.connect_timeout_s, read=c.read_timeout_s, write=c.read_timeout_s,
                             pool=c.connect_timeout_s)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}

    def warm_up(self, system_prompt: str | None = None, tools: Tools | None = None,
                tools_prompt: str | None = None) -> None:
        """Blocking (start-up, off the event loop): ask the server which models it serves, to learn
        the model name when llm.remote_model is empty. A server that is down only logs a warning:
        the service starts anyway and each turn tries again. (The prompts are the server's to cache:
        vLLM's prefix cache keeps them after the first call.)"""
        try:
            with httpx.Client(base_url=self.base_url, timeout=self._timeout(), headers=self._headers()) as client:
                served = self._served_models(client.get("/models"))
        except httpx.RequestError as exc:
            log.warning("LLM server not ready at start-up: %s", self.transport_error(exc))
            return
        except VoiceAgentError as exc:
            log.warning("LLM server not ready at start-up: %s", exc)
            return
        if self.model is None:
            self.model = self.name = served[0]
        elif self.model not in served:
            log.warning("llm.remote_model %r is not among the models served at %s (%s)",
                        self.model, self.base_url, ", ".join(served))
        log.info("LLM server at %s serves %s; using %s", self.base_url, ", ".join(served), self.model)

    async def model_name(self) -> str:
        """llm.remote_model, or the first model the server lists (asked once)."""
        if self.model is None:
            async with self._model_lock:
                if self.model is None:
                    try:
                        response = await self.client().get("/models")
                    except httpx.RequestError as exc:
                        raise self.transport_error(exc) from exc
                    self.model = self.name = self._served_models(response)[0]
                    log.info("LLM server at %s serves %s", self.base_url, self.model)
        return self.model

    def _served_models(self, response: httpx.Response) -> list[str]:
        if response.is_error:
            raise self.status_error(response)
        try:
            served = [str(m["id"]) for m in response.json()["data"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise EngineError(f"GET {self.base_url}/models did not answer an OpenAI model list "
                              f"({response.text[:200]!r}); is llm.base_url an OpenAI-compatible API "
                              "(vLLM's ends in /v1)?") from exc
        if not served:
            raise EngineError(f"the LLM server at {self.base_url} serves no models; set llm.remote_model")
        return served

    def transport_error(self, exc: httpx.RequestError) -> VoiceAgentError:
        """An httpx error (no HTTP answer) as the service's error, naming the server and what to check."""
        url, c = self.base_url, self.config
        if isinstance(exc, httpx.UnsupportedProtocol):
            return ConfigError(f"llm.base_url {url!r} cannot be used: {exc}")
        if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
            return LLMUnavailableError(f"connecting to the LLM server at {url} timed out after "
                                       f"{c.connect_timeout_s:g} s; check that it is up and reachable (llm.base_url)")
        if isinstance(exc, httpx.ConnectError):
            return LLMUnavailableError(f"cannot connect to the LLM server at {url} ({_os_reason(exc)}); check that "
                                       "it is running and that llm.base_url is right")
        if isinstance(exc, httpx.TimeoutException):
            return LLMUnavailableError(f"the LLM server at {url} sent nothing for {c.read_timeout_s:g} s (stalled); "
                                       "check its load and logs, or raise llm.read_timeout_s")
        return LLMUnavailableError(f"the connection to the LLM server at {url} broke "
                                   f"({type(exc).__name__}: {exc or 'no detail'}); check the server's logs")

    def status_error(self, response: httpx.Response) -> VoiceAgentError:
        """An HTTP error answer (its body already read) as the service's error, with the server's message."""
        status = response.status_code
        detail = _error_message(response.content) or response.reason_phrase
        hint = {401: "check llm.api_key", 403: "check llm.api_key",
                404: "check llm.base_url (vLLM's ends in /v1) and llm.remote_model"}.get(status, "")
        if status >= 500 or status == 429:
            hint = "check the server's logs and load"
        message = (f"the LLM server at {self.base_url} answered {status} to {response.request.method} "
                   f"{response.request.url.path}: {detail}" + (f"; {hint}" if hint else ""))
        if status >= 500 or status == 429:
            return LLMUnavailableError(message, retry_after=_retry_after(response.headers.get("retry-after")))
        return EngineError(message)

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


@dataclass
class _Progress:
    """How far one reply got: `text_sent` once the caller has text (no retry after that)."""

    text_sent: bool = False
    deltas: int = 0
    finished: bool = False  # a finish_reason arrived: the reply is whole even if the stream then breaks


class OpenAIConversation:
    """One caller's conversation. Stateless between turns: every turn sends the whole history."""

    def __init__(self, llm: OpenAIChatLLM) -> None:
        self.llm = llm
        self.deadline: float | None = None

    async def prepare(self, messages: Sequence[ChatMessage], tools: Tools | None = None,
                      open_last: bool = False) -> None:
        """Nothing to do ahead of time: the server's prefix cache keeps the prompt's KV."""

    async def end_of_turn(self, messages: Sequence[ChatMessage], tools: Tools | None = None) -> float | None:
        """Not known: an OpenAI-compatible server gives no probabilities of a message's end."""
        return None

    def set_speculation_cap(self, cap: int | None) -> None:
        """Ignored: the server's speculative decoding is set when it starts (vLLM's --speculative-config)."""

    def set_deadline(self, at: float | None) -> None:
        """Sent as vLLM's `priority` where llm.send_priority is set (see _priority)."""
        self.deadline = at

    def _priority(self) -> int:
        """vLLM's request priority (lower goes first): the ms until the reply is due, 0 when it is
        overdue; a request with no deadline (a /v1 request) gets llm.api_deadline_s's worth."""
        slack = self.llm.config.api_deadline_s if self.deadline is None else self.deadline - self.llm.clock.now()
        return max(0, round(slack * 1000))

    async def aclose(self) -> None:
        """Nothing to release: the connection pool belongs to the OpenAIChatLLM."""

    async def stream(self, messages: Sequence[ChatMessage], params: SamplingParams,
                     tools: Tools | None = None) -> AsyncGenerator[LLMOutput, None]:
        llm = self.llm
        started = llm.clock.now()
        attempts = 1 + llm.config.retries_before_first_token
        for attempt in range(1, attempts + 1):
            stats = GenerationStats()
            progress = _Progress()
            try:
                async with contextlib.aclosing(self._attempt(messages, params, tools, started, stats,
                                                             progress)) as outputs:
                    async for output in outputs:
                        yield output
                return
            except LLMUnavailableError as exc:
                if progress.text_sent or attempt == attempts:
                    raise
                config = llm.config
                wait = exc.retry_after if exc.retry_after is not None else config.retry_backoff_s * 2 ** (attempt - 1)
                if wait > config.retry_max_wait_s:
                    if exc.retry_after is None:
                        wait = config.retry_max_wait_s
                    else:  # the server asks for longer than a caller can wait: not retried
                        raise
                log.warning("LLM request failed before its first token (attempt %d of %d), retrying in %.2f s: %s",
                            attempt, attempts, wait, exc)
                await llm.clock.sleep(wait)

    async def _attempt(self, messages: Sequence[ChatMessage], params: SamplingParams, tools: Tools | None,
                       started: float, stats: GenerationStats,
                       progress: _Progress) -> AsyncGenerator[LLMOutput, None]:
        llm = self.llm
        body: dict[str, Any] = {
            "model": await llm.model_name(),
            "messages": [_message(m) for m in messages],
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_tokens,
        }
        if params.top_k > 0:
            body["top_k"] = params.top_k  # vLLM's extension; 0 (off) is left to the server's default
        if params.seed is not None:
            body["seed"] = params.seed
        if llm.config.send_priority:
            body["priority"] = self._priority()
        if messages and messages[-1].unfinished:  # the reply goes on from these words: vLLM's chat extension
            body["continue_final_message"], body["add_generation_prompt"] = True, False
        if tools is not None:
            body["tools"] = [t.as_openai() for t in tools.tools]
            body["tool_choice"] = tools.choice if tools.must_call() in (None, "") else \
                {"type": "function", "function": {"name": tools.choice}}
            body["parallel_tool_calls"] = tools.parallel
        usage: dict[str, Any] | None = None
        calls: dict[int, dict[str, str]] = {}  # the streamed calls by index: id, name, arguments so far
        try:
            async with llm.client().stream("POST", "/chat/completions", json=body,
                                           headers={"Accept": "text/event-stream"}) as response:
                if response.is_error:
                    await response.aread()
                    raise llm.status_error(response)
                kind = response.headers.get("content-type", "")
                if not kind.startswith("text/event-stream"):
                    raise EngineError(f"the LLM server at {llm.base_url} answered {kind or 'no content type'}, not a "
                                      "stream of server-sent events; is llm.base_url an OpenAI-compatible API?")
                async with contextlib.aclosing(self._events(response)) as events:
                    async for data in events:
                        if data == "[DONE]":
                            break
                        text, finish, chunk_usage, call_deltas = self._read_chunk(data)
                        for delta in call_deltas:
                            _merge_call(calls, delta)
                        if text:
                            if not progress.text_sent:
                                stats.time_to_first_token_ms = (llm.clock.now() - started) * 1000
                                progress.text_sent = True
                            progress.deltas += 1
                            yield TextDelta(text)
                        if finish:
                            stats.finish_reason = finish
                            progress.finished = True
                        usage = chunk_usage or usage
                    else:  # the stream ended without [DONE]: whole only if a finish_reason came
                        if not progress.finished:
                            raise LLMUnavailableError(f"the LLM server at {llm.base_url} ended the stream before "
                                                      "the reply was finished; check the server's logs")
        except httpx.RequestError as exc:
            if not progress.finished:
                raise llm.transport_error(exc) from exc
            log.warning("the LLM stream broke after the reply had finished (%s); keeping the reply", exc)
        for index in sorted(calls):
            yield ToolCallOutput(_finished_call(llm.base_url, calls[index]))
        if calls:
            stats.finish_reason = "tool_calls"
        _apply_usage(stats, usage, progress.deltas)
        stats.duration_ms = (llm.clock.now() - started) * 1000
        yield GenerationDone(stats)

    async def _events(self, response: httpx.Response) -> AsyncGenerator[str, None]:
        """The data of each server-sent event as it completes. Raises LLMUnavailableError when no
        event completes for read_timeout_s even though bytes (e.g. keep-alive comments) arrive; the
        time the consumer spends between events does not count."""
        clock, limit = self.llm.clock, self.llm.config.read_timeout_s
        waiting_since = clock.now()
        data: list[str] = []
        async for line in response.aiter_lines():
            if clock.now() - waiting_since > limit:
                raise LLMUnavailableError(f"the LLM server at {self.llm.base_url} sent no event for {limit:g} s "
                                          "(stalled); check its load and logs, or raise llm.read_timeout_s")
            if line:
                name, _, value = line.partition(":")
                if name == "data":
                    data.append(value.removeprefix(" "))
                # other fields (event:, id:, retry:) and comments (": ping") carry nothing for us
            elif data:  # a blank line ends an event
                yield "\n".join(data)
                data = []
                waiting_since = clock.now()
        if data:
            yield "\n".join(data)

    def _read_chunk(self, data: str) -> tuple[str, str | None, dict[str, Any] | None, list[dict[str, Any]]]:
        """(text, finish_reason, usage, tool-call deltas) of one chat.completion.chunk; a streamed
        error becomes ours."""
        base_url = self.llm.base_url
        try:
            chunk = json.loads(data)
            if not isinstance(chunk, dict):
                raise TypeError("not a JSON object")
            if "error" in chunk:
                raise _streamed_error(base_url, chunk["error"])
            text, finish = "", None
            call_deltas: list[dict[str, Any]] = []
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                text += delta.get("content") or ""
                call_deltas += delta.get("tool_calls") or []
                finish = choice.get("finish_reason") or finish
            usage = chunk.get("usage")
            return text, finish, usage if isinstance(usage, dict) else None, call_deltas
        except (ValueError, TypeError, AttributeError) as exc:
            raise EngineError(f"the LLM server at {base_url} sent a malformed event ({data[:120]!r}: {exc}); is "
                              "llm.base_url an OpenAI-compatible chat completions API?") from exc


def _message(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.call_id, "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments}} for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def _merge_call(calls: dict[int, dict[str, str]], delta: Any) -> None:
    """One streamed piece of a tool call (OpenAI sends the id and name first, the arguments in parts)."""
    if not isinstance(delta, dict):
        raise TypeError("a tool_calls delta is not an object")
    call = calls.setdefault(int(delta.get("index", 0)), {"id": "", "name": "", "arguments": ""})
    call["id"] = delta.get("id") or call["id"]
    function = delta.get("function") or {}
    call["name"] += function.get("name") or ""
    call["arguments"] += function.get("arguments") or ""


def _finished_call(base_url: str, call: dict[str, str]) -> ToolCall:
    """A streamed call, whole; a server that sent arguments that are not a JSON object is an error
    (vLLM's parser lets a model's malformed call through as text it could not parse)."""
    arguments = call["arguments"] or "{}"
    try:
        parsed = json.loads(arguments)
        if not isinstance(parsed, dict):
            raise TypeError("not an object")
    except (ValueError, TypeError) as exc:
        raise EngineError(f"the LLM server at {base_url} sent a call to {call['name']!r} whose arguments are not "
                          f"a JSON object ({arguments[:120]!r}: {exc})") from exc
    return ToolCall(call["id"] or new_call_id(), call["name"], json.dumps(parsed, ensure_ascii=False))


def _streamed_error(base_url: str, error: Any) -> VoiceAgentError:
    """An error the server sent inside the stream (vLLM and this project's API both do)."""
    message = error.get("message") if isinstance(error, dict) else error
    code = error.get("code") if isinstance(error, dict) else None
    text = f"the LLM server at {base_url} failed mid-reply: {message} (code {code})"
    transient = (isinstance(code, int) and code >= 500) or code == LLMUnavailableError.code
    return LLMUnavailableError(text) if transient else EngineError(text)


def _os_reason(exc: BaseException) -> str:
    """The operating system's reason under a connect error ("Connection refused", "Name or service
    not known"), which httpx's async client wraps as "All connection attempts failed"."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and isinstance(cause.errno, int) and cause.errno > 0:
            return os.strerror(cause.errno)
        if isinstance(cause, OSError) and cause.strerror:  # e.g. a resolver error (negative errno)
            return str(cause.strerror)
        cause = cause.__cause__ or cause.__context__
    return str(exc)


def _error_message(body: bytes) -> str:
    """The message of an OpenAI-style error body ({"error": {"message": ...}}), else the body's start."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.decode(errors="replace").strip()[:300]
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict):
            return str(error.get("message") or error.get("detail") or error)[:300]
        return str(data.get("message") or data.get("detail") or error)[:300]
    return str(data)[:300]


def _apply_usage(stats: GenerationStats, usage: dict[str, Any] | None, deltas: int) -> None:
    """Fill `stats` from the final chunk's usage (and this project's `usage.speculative_decoding`).
    Without usage, completion_tokens counts the text deltas (one token each on vLLM without
    speculation)."""
    if usage is None:
        stats.completion_tokens = deltas
        return
    stats.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    stats.completion_tokens = int(usage.get("completion_tokens") or 0)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    stats.prefill_tokens = stats.prompt_tokens - int(cached or 0)
    spec = usage.get("speculative_decoding")
    if isinstance(spec, dict):
        stats.method = str(spec.get("method", stats.method))
        stats.prefill_tokens = int(spec.get("prefill_tokens", stats.prefill_tokens))
        stats.drafts = int(spec.get("drafts") or 0)
        stats.draft_tokens = int(spec.get("draft_tokens") or 0)
        stats.accepted_tokens = int(spec.get("accepted_tokens") or 0)
        stats.accepted_per_position = [int(n) for n in spec.get("accepted_per_position") or []]
        stats.k_chosen = [int(k) for k in spec.get("k_chosen") or []]


def _retry_after(value: str | None) -> float | None:
    """A Retry-After header in seconds (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    now = datetime.datetime.now(when.tzinfo or datetime.UTC)
    return max(0.0, (when - now).total_seconds())
