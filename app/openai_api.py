"""An OpenAI-compatible chat completions API over the service's language model, streaming
(server-sent events) and not, with tools (`tools`, `tool_choice`, `parallel_tool_calls`; calls come
back as `tool_calls`, with `finish_reason` "tool_calls"; on the embedded engine each call's
arguments are held to its JSON Schema while they are written). With the embedded engine, a request
may choose its speculative decoding with an extra field:

    "speculative": {"method": "off" | "ngram" | "draft_model", "num_speculative_tokens": 4 | "auto"}

and the final chunk's (or the response's) `usage.speculative_decoding` carries the generation's
stats. This is the same API vLLM serves, so the voice pipeline runs against either.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.admission import request_refusal
from app.runtime import Runtime
from core.errors import ConfigError, ContextLengthError, VoiceAgentError, plain_message
from models.llm.tool_calls import ToolCall, parse_tools
from models.protocols import (
    ChatMessage,
    GenerationDone,
    GenerationStats,
    SamplingParams,
    Speculation,
    TextDelta,
    ToolCallOutput,
)

log = logging.getLogger(__name__)
router = APIRouter()


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class FunctionIn(BaseModel):
    name: str
    arguments: str


class ToolCallIn(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionIn


class MessageIn(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def message(self, index: int) -> ChatMessage:
        """Ours; a ValueError says what is wrong with it."""
        calls = tuple(ToolCall(c.id, c.function.name, c.function.arguments) for c in self.tool_calls or [])
        for call in calls:
            try:
                call.parsed_arguments()
            except ValueError as exc:
                raise ValueError(f"messages.{index}.tool_calls: the arguments of {call.name!r} are not a JSON "
                                 f"object ({exc})") from exc
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError(f"messages.{index}: a tool message needs the tool_call_id it answers")
        role = "system" if self.role == "developer" else self.role
        return ChatMessage(role, self.text(), calls, self.tool_call_id)


class SpeculativeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    method: Literal["off", "ngram", "draft_model"] = "ngram"
    num_speculative_tokens: Annotated[int, Field(ge=0, le=8)] | Literal["auto"] = "auto"


class StreamOptions(BaseModel):
    include_usage: bool = True


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    messages: list[MessageIn] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    seed: int | None = None
    n: int = 1
    stop: str | list[str] | None = None
    speculative: SpeculativeIn | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True


def _error(status: int, message: str, kind: str, code: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": code, "param": None}}, status_code=status)


def usage(stats: GenerationStats) -> dict[str, Any]:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
        "speculative_decoding": stats.as_dict(),
    }


T = TypeVar("T")


async def _prepend(first: T, rest: AsyncIterator[T]) -> AsyncIterator[T]:
    yield first
    async for item in rest:
        yield item


class StopMatcher:
    """Cuts the stream at the first stop string, holding back text that may be the start of one."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.stopped = False

    def push(self, text: str) -> str:
        if not self.stops:
            return text
        self.pending += text
        hits = [(self.pending.find(s), s) for s in self.stops if s in self.pending]
        if hits:
            self.stopped = True
            out = self.pending[: min(i for i, _ in hits)]
            self.pending = ""
            return out
        keep = max((len(s) - 1 for s in self.stops), default=0)
        for cut in range(min(keep, len(self.pending)), 0, -1):
            if any(s.startswith(self.pending[-cut:]) for s in self.stops):
                out, self.pending = self.pending[:-cut], self.pending[-cut:]
                return out
        out, self.pending = self.pending, ""
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


def _call_out(call: ToolCall) -> dict[str, Any]:
    return {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    runtime: Runtime = request.app.state.runtime
    return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "voice-agent"}
                                       for name in _served(runtime)]}


def _served(runtime: Runtime) -> list[str]:
    """The models this server answers with: llm.model, and llm.tools_model where it is loaded apart."""
    llm = runtime.settings.llm
    apart = runtime.backends is not None and runtime.backends.tools_llm is not None
    return [llm.model, llm.tools_model] if apart else [llm.model]


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(request: Request) -> JSONResponse | StreamingResponse:
    runtime: Runtime = request.app.state.runtime
    try:
        body = ChatRequest.model_validate(await request.json())
    except ValidationError as exc:
        details = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        return _error(400, details, "invalid_request_error", "invalid_request")
    except ValueError as exc:  # not JSON (JSONDecodeError), or not UTF-8 (UnicodeDecodeError)
        return _error(400, f"the body is not JSON: {exc}", "invalid_request_error", "invalid_json")
    refused = request_refusal(runtime)
    if refused is not None:
        response = _error(refused.http_status, refused.message,
                          "rate_limit_error" if refused.http_status == 429 else "server_error", refused.code)
        if refused.http_status == 429:
            response.headers["Retry-After"] = "1"
        return response
    assert runtime.backends is not None  # (request_refusal: loaded)
    served = _served(runtime)
    if body.model not in (None, "", *served):
        return _error(404, f"model {body.model!r} is not served here; this server serves "
                           f"{' and '.join(repr(m) for m in served)}", "invalid_request_error", "model_not_found")
    if body.n != 1:
        return _error(400, "only n=1 is supported", "invalid_request_error", "unsupported_n")
    try:
        messages = [m.message(i) for i, m in enumerate(body.messages)]
        tools = parse_tools(body.tools, body.tool_choice, body.parallel_tool_calls)
    except (ValueError, ConfigError) as exc:
        return _error(400, str(exc), "invalid_request_error", "invalid_tools" if isinstance(exc, ConfigError)
                      else "invalid_request")
    # a request that names a model gets it; one that does not gets the model of its kind (with tools or not)
    with_tools = body.model == runtime.settings.llm.tools_model or (not body.model and tools is not None)
    engine = runtime.backends.llm_for(with_tools)
    answering = served[-1] if with_tools else served[0]
    methods = getattr(getattr(engine, "strategy", None), "methods", ("off",))
    if body.speculative and body.speculative.method not in methods:
        return _error(400, f"speculative method {body.speculative.method!r} is not available here "
                           f"(available: {', '.join(methods)}); the draft_model method needs "
                           "llm.speculative.method=draft_model at start-up", "invalid_request_error",
                      "speculation_unavailable")

    llm_cfg = runtime.settings.llm
    k = body.speculative.num_speculative_tokens if body.speculative else None
    params = SamplingParams(
        temperature=llm_cfg.temperature if body.temperature is None else body.temperature,
        top_p=llm_cfg.top_p if body.top_p is None else body.top_p,
        top_k=llm_cfg.top_k if body.top_k is None else body.top_k,
        max_tokens=min(body.max_completion_tokens or body.max_tokens or llm_cfg.max_tokens, 4096),
        seed=body.seed,
        speculation=Speculation(body.speculative.method, None if k == "auto" else k) if body.speculative else None,
    )
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    completion_id = "chatcmpl-" + uuid.uuid4().hex[:24]
    created = int(time.time())
    metrics = runtime.metrics

    async def events() -> AsyncGenerator[tuple[str | ToolCall, GenerationStats | None], None]:
        # Counted from here to this generator's end, however it ends: finished, closed by the
        # response, or finalized by the event loop when a client vanished before the body started.
        runtime.api_requests += 1
        # bounded apart from the calls': a /v1 prompt never takes the cache a call needs
        conversation = engine.conversation(llm_cfg.api_context_tokens)
        matcher = StopMatcher(stops)
        try:
            stream = conversation.stream(messages, params, tools)
            async with contextlib.aclosing(stream):  # a stop string ends the generation here and now
                async for out in stream:
                    if isinstance(out, ToolCallOutput):
                        yield out.call, None
                    elif isinstance(out, TextDelta):
                        text = matcher.push(out.text)
                        if text:
                            yield text, None
                        if matcher.stopped:
                            break
                    elif isinstance(out, GenerationDone):
                        tail = matcher.flush()
                        if tail:
                            yield tail, None
                        metrics.observe_generation(out.stats)
                        yield "", out.stats
            if matcher.stopped:
                # What the generation did up to the stop string: its real token counts and
                # speculative statistics, where the backend keeps them.
                stopped: GenerationStats = getattr(conversation, "last_stats", None) or GenerationStats()
                stopped.finish_reason = "stop"
                metrics.observe_generation(stopped)
                yield "", stopped
        finally:
            runtime.api_requests -= 1
            await conversation.aclose()

    def failure(exc: VoiceAgentError) -> JSONResponse:
        metrics.api_requests.labels("error").inc()
        if isinstance(exc, ContextLengthError):  # the client's own prompt: said as it is, so it can be cut
            return _error(400, str(exc), "invalid_request_error", exc.code)
        return _error(502 if exc.retryable else 500, server_failure(exc), "server_error", exc.code)

    def server_failure(exc: VoiceAgentError) -> str:
        """The plain message a client gets; the error's own text (URLs, the engine's exception) is logged."""
        log.warning("%s: the generation failed: %s: %s", completion_id, exc.code, exc)
        return f"{plain_message(exc.code)} (request {completion_id})"

    if not body.stream:
        text, calls, stats = [], [], GenerationStats()
        try:
            async for piece, final in events():
                if isinstance(piece, ToolCall):
                    calls.append(_call_out(piece))
                else:
                    text.append(piece)
                if final is not None:
                    stats = final
        except VoiceAgentError as exc:
            return failure(exc)
        metrics.api_requests.labels("completed").inc()
        message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or (None if calls else "")}
        if calls:
            message["tool_calls"] = calls
        return JSONResponse({
            "id": completion_id, "object": "chat.completion", "created": created, "model": answering,
            "choices": [{"index": 0, "message": message, "finish_reason": stats.finish_reason}],
            "usage": usage(stats),
        })

    include_usage = body.stream_options.include_usage if body.stream_options else True

    def chunk(delta: dict[str, Any], finish: str | None = None, stats: GenerationStats | None = None) -> str:
        data: dict[str, Any] = {
            "id": completion_id, "object": "chat.completion.chunk", "created": created, "model": answering,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        if stats is not None and include_usage:
            data["usage"] = usage(stats)
        return f"data: {json.dumps(data)}\n\n"

    # The first piece is awaited before the response starts, so that a request the model refuses
    # (a prompt over the context) gets its 4xx status rather than an error inside a 200 stream.
    pieces = events()
    try:
        first: tuple[str | ToolCall, GenerationStats | None] | None = await anext(pieces)
    except StopAsyncIteration:
        first = None
    except VoiceAgentError as exc:
        return failure(exc)

    async def sse() -> AsyncIterator[str]:
        finished = False
        try:
            yield chunk({"role": "assistant", "content": ""})
            if first is not None:
                calls = 0
                async for piece, final in _prepend(first, pieces):
                    if isinstance(piece, ToolCall):  # whole: the grammar made it in one piece of work
                        yield chunk({"tool_calls": [{"index": calls, **_call_out(piece)}]})
                        calls += 1
                    elif piece:
                        yield chunk({"content": piece})
                    if final is not None:
                        yield chunk({}, final.finish_reason, final)
            yield "data: [DONE]\n\n"
            finished = True
            metrics.api_requests.labels("completed").inc()
        except VoiceAgentError as exc:
            metrics.api_requests.labels("error").inc()
            message = str(exc) if isinstance(exc, ContextLengthError) else server_failure(exc)
            error = {"error": {"message": message, "type": "server_error", "code": exc.code}}
            yield f"data: {json.dumps(error)}\n\n"
            finished = True
        finally:
            await pieces.aclose()
            if not finished:  # the client went away mid-stream: the generation was cancelled
                metrics.api_requests.labels("aborted").inc()
                log.info("%s: client disconnected; generation aborted", completion_id)

    return StreamingResponse(sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
