"""The embedded LLM backend: a model in this process (llama.cpp by default, or PyTorch), one worker
thread, a KV cache per conversation kept across turns, and a pluggable decoding strategy (plain, or
speculative)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from core.clock import Clock
from core.errors import ContextLengthError, EngineError
from core.worker import Lane, ModelWorker, Schedule
from models.llm.generation import Decoder, Detokenizer, GenerationLoop, PlainDecoder, StepResult
from models.llm.lm import CausalLM, LMState, common_prefix
from models.llm.tool_calls import ToolCall, Tools
from models.llm.tool_guide import CANDIDATES, ReplyReader, ToolGuide
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


class SessionDecoding(Protocol):
    """Per-conversation decoding state (a draft model's cache, a K controller...)."""

    cap: int | None  # most tokens to draft per step (None: no limit)

    def decoder(self, state: LMState, params: SamplingParams, stats: GenerationStats,
                guide: ToolGuide | None = None) -> Decoder: ...

    def close(self) -> None: ...


class DecodingStrategy(Protocol):
    method: str

    def new_session(self) -> SessionDecoding: ...


class PlainStrategy:
    method = "off"

    def __init__(self, lm: CausalLM) -> None:
        self.lm = lm

    def new_session(self) -> SessionDecoding:
        return PlainSession(self.lm)


class PlainSession:
    def __init__(self, lm: CausalLM) -> None:
        self.lm = lm
        self.cap: int | None = None

    def decoder(self, state: LMState, params: SamplingParams, stats: GenerationStats,
                guide: ToolGuide | None = None) -> Decoder:
        return PlainDecoder(self.lm, state, params, stats, guide)

    def close(self) -> None:
        pass


class EmbeddedLLM:
    """LanguageModel on the embedded engine."""

    def __init__(self, lm: CausalLM, clock: Clock, strategy: DecodingStrategy | None = None,
                 worker: ModelWorker | None = None, max_context_tokens: int = 4096,
                 schedule: Schedule = "edf", api_deadline_s: float = 1.0) -> None:
        """`schedule`: the order of the calls' steps on the one worker thread (see core/worker.py).
        `api_deadline_s`: a generation whose conversation has no deadline (a /v1 request) has each
        step due this long after it is asked for."""
        self.lm = lm
        self.max_context_tokens = max_context_tokens
        self.clock = clock
        self.strategy: DecodingStrategy = strategy or PlainStrategy(lm)
        self.worker = worker or ModelWorker("llm", priority="background", schedule=schedule)
        self.api_deadline_s = api_deadline_s
        self.name = lm.name
        self._asked: LMState | None = None  # the sequence `next_word_probabilities` runs in, made on first use

    def conversation(self, context_tokens: int | None = None) -> EmbeddedConversation:
        limit = min(context_tokens or self.max_context_tokens, self.max_context_tokens)
        return EmbeddedConversation(self, self.strategy.new_session(), limit)

    def warm_up(self, system_prompt: str | None = None, tools: Tools | None = None,
                tools_prompt: str | None = None) -> None:
        """Blocking: compute the default system prompt once for the whole process (each new call
        copies its cache instead of computing it), and with the server's own tools the system
        prompt of a call that has them (the tools are rendered in it: ~700 tokens for four); then
        one short prefill so the first caller does not pay for lazy initialisation."""
        if system_prompt:
            # pinned: callers' own instructions are remembered too, and must not push it out
            self.lm.remember_prefix(self.lm.chat_tokens([{"role": "system", "content": system_prompt}],
                                                        add_generation_prompt=False), pinned=True)
        if tools is not None and tools_prompt:
            message = [{"role": "system", "content": tools_prompt}]
            self.lm.remember_prefix(self.lm.chat_tokens(message, False, [t.as_openai() for t in tools.tools]),
                                    pinned=True)
        state = self.lm.new_state()
        try:
            self.lm.prefill(state, self.lm.chat_tokens([{"role": "user", "content": "Hi"}]))
        finally:
            self.lm.release(state)

    async def aclose(self) -> None:
        self.worker.shutdown()

    async def next_word_probabilities(self, messages: Sequence[ChatMessage], words: Sequence[str]) -> list[float]:
        """The chance that the reply to `messages` begins with each of `words` (of its first token), from
        one prefill, due at once. All calls share one sequence for it, on the one worker thread: a
        question asked with the same instructions (a classifier's examples) computes only its new tokens."""
        return await self.worker.run_by(self.clock.now(), self._next_word_probabilities, messages, words)

    def _next_word_probabilities(self, messages: Sequence[ChatMessage], words: Sequence[str]) -> list[float]:
        if self._asked is None:
            self._asked = self.lm.new_state()
        logits, _ = self.lm.prefill(self._asked, self.lm.chat_tokens(_for_template(messages), True))
        p = _softmax(logits)
        return [float(p[self.lm.encode(word)[0]]) for word in words]

    @property
    def weighs_words(self) -> bool:
        return self.end_of_message is not None

    @functools.cached_property
    def end_of_message(self) -> tuple[int, ...] | None:
        """The tokens the chat template puts after a message's text (Qwen's `<|im_end|>` and a
        newline): its first is the token whose probability says the caller's message ends there.
        None when the template's rendering of a message does not end so."""
        text = "Zq"
        rendered = self.lm.chat_tokens([{"role": "user", "content": text}], add_generation_prompt=False)
        content = self.lm.encode(text)
        for end in range(len(rendered) - 1, len(content) - 1, -1):
            if rendered[end - len(content):end] == content:
                return tuple(rendered[end:]) or None
        return None

    @functools.cached_property
    def sentence_marks(self) -> tuple[int, ...]:
        """The tokens of ".", "?" and "!" (those that are one token each)."""
        ids = [self.lm.encode(mark) for mark in (".", "?", "!")]
        return tuple(i[0] for i in ids if len(i) == 1)


def _for_template(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """The messages as the chat template reads them, each tool result said with the tool that gave
    it: "order_status returned:\n{...}\nAnswer the caller from this result." The bare result in Qwen's
    <tool_response> block is not enough for the small models: asked to follow up, Qwen2.5-Coder 1.5B
    said "I cannot check that here" and the 0.5B repeated its call; with the instruction before the
    result only, the 1.5B called order_status again for 3 of 3 order requests (tune half). The call's
    arguments are not repeated (they are in the call just above): all of it up to the result is
    prefilled while the tool runs (`prepare(..., open_last=True)`), so that only the result's own
    tokens and a dozen closing ones are left for the follow-up."""
    calls = {c.call_id: c for m in messages for c in m.tool_calls}
    out = []
    for m in messages:
        message = m.as_template()
        call = calls.get(m.tool_call_id or "")
        if m.role == "tool" and call is not None:
            message["content"] = f"{call.name} returned:\n{m.content}\nAnswer the caller from this result."
        out.append(message)
    return out


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - float(logits.max())
    exp = np.exp(shifted)
    return exp / exp.sum()


class EmbeddedConversation:
    def __init__(self, llm: EmbeddedLLM, decoding: SessionDecoding, context_tokens: int) -> None:
        self.llm = llm
        self.decoding = decoding
        self.context_tokens = context_tokens  # the most tokens it may hold: prompt and reply
        self.state: LMState | None = None
        self.last_stats: GenerationStats | None = None  # the latest generation's, even one stopped early
        # Its jobs on the shared worker, due when the reply's next tokens are (set_deadline).
        self.lane = Lane()
        self.generating = False  # a reply's generation owns the cache: nothing else may move it

    def _state(self) -> LMState:
        """The conversation's sequence, made on first use (on the worker thread)."""
        if self.state is None:
            self.state = self.llm.lm.new_state()
        return self.state

    def _prompt(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True,
                tools: Tools | None = None) -> list[int]:
        """The prompt's tokens. An unfinished last message (the words a reply must begin with) is rendered
        as a whole message less the template's end of message, so the reply goes on from its words."""
        offered = [t.as_openai() for t in tools.tools] if tools else []
        if not (messages and messages[-1].unfinished):
            return self.llm.lm.chat_tokens(_for_template(messages), add_generation_prompt, offered)
        tokens = self.llm.lm.chat_tokens(_for_template(messages), False, offered)
        end = self.llm.end_of_message
        if end is None or tuple(tokens[-len(end):]) != end:
            raise EngineError(f"{self.llm.name}: its chat template does not end a message with a known mark, so a "
                              "reply cannot be made to begin with given words (session.honesty.enabled = false)")
        return tokens[: -len(end)]

    def _prepare(self, messages: Sequence[ChatMessage], tools: Tools | None = None, open_last: bool = False) -> None:
        if self.generating:  # a reply began meanwhile: its cache is not this prompt's to change
            return
        if open_last and messages:
            prompt = self._open_head(messages, tools)
        else:
            prompt = self._prompt(messages, add_generation_prompt=False, tools=tools)
        if prompt:
            if [m.role for m in messages] == ["system"]:
                self.llm.lm.remember_prefix(prompt)
            self.llm.lm.prefill(self._state(), prompt)

    def _open_head(self, messages: Sequence[ChatMessage], tools: Tools | None) -> list[int]:
        """The prompt's tokens up to where the last message's content begins: the tokens two
        renderings with different contents share, less the last one (which could merge with the
        content's first bytes)."""
        last = messages[-1]
        one, two = ([*messages[:-1], replace(last, content=content)] for content in ("0", "1"))
        first = self._prompt(one, False, tools)
        return first[: max(0, common_prefix(first, self._prompt(two, False, tools)) - 1)]

    async def prepare(self, messages: Sequence[ChatMessage], tools: Tools | None = None,
                      open_last: bool = False) -> None:
        """Prefill the conversation so far (e.g. the system prompt at session start: a copy of the
        process's cache of it when it is the one computed before). `open_last`: only up to where
        the last message's content begins (a tool's result, prefilled while the tool runs)."""
        # No deadline of its own: it runs after every job that has one, unless a reply begins
        # while it waits (then it is due when the reply is).
        self.lane.more, self.lane.fallback = False, None
        await self.llm.worker.run_by(self.lane, self._prepare, messages, tools, open_last)

    async def stream(self, messages: Sequence[ChatMessage], params: SamplingParams,
                     tools: Tools | None = None) -> AsyncGenerator[LLMOutput, None]:
        clock = self.llm.clock
        stats = GenerationStats()
        guide = None
        if tools is not None:
            candidates = 1 if params.temperature <= 0 else (params.top_k or CANDIDATES)
            guide = ToolGuide(self.llm.lm, tools, candidates)
        self.generating = True
        try:
            self._asking()
            prompt = await self.llm.worker.run_by(self.lane, self._prompt, messages, True, tools)
            limit = self.context_tokens
            if len(prompt) + 1 > limit:
                raise ContextLengthError(f"the prompt has {len(prompt)} tokens; this conversation holds {limit} "
                                         "(llm.max_context_tokens for a call, llm.api_context_tokens for /v1): "
                                         "shorten the messages")
            params = replace(params, max_tokens=min(params.max_tokens, limit - len(prompt)))
            self._asking()
            state = await self.llm.worker.run_by(self.lane, self._state)
        except BaseException:
            self.generating = False
            raise
        decoder = self.decoding.decoder(state, params, stats, guide)
        loop = GenerationLoop(self.llm.lm, decoder, prompt, params, stats)
        detok = Detokenizer(self.llm.lm)
        reader = ReplyReader(guide) if guide is not None else None
        started = clock.now()
        first = True
        self.last_stats = stats
        try:
            while not loop.done:
                self._asking()
                result = await self.llm.worker.run_by(self.lane, self._step, loop)
                if first:
                    stats.time_to_first_token_ms = (clock.now() - started) * 1000
                    first = False
                calls: list[ToolCall] = []
                if reader is None:
                    text = detok.push(result.tokens)
                else:
                    text, calls = reader.push(result.tokens)
                if text:
                    yield TextDelta(text)
                for delta in reader.deltas if reader is not None else ():
                    yield delta
                for call in calls:
                    yield ToolCallOutput(call)
        finally:  # also when the caller stops early (a stop string, a barge-in): the stats are real
            self.generating = False
            self.lane.more, self.lane.fallback = False, None
            stats.duration_ms = (clock.now() - started) * 1000
            if not loop.done:
                stats.finish_reason = "cancelled"
            elif reader is not None and reader.calls and stats.finish_reason == "stop":
                stats.finish_reason = "tool_calls"
        yield GenerationDone(stats)

    async def end_of_turn(self, messages: Sequence[ChatMessage], tools: Tools | None = None) -> float | None:
        """The chance that the caller's sentence ends after the last message's text (see
        `_end_of_turn`), from the logits of a prefill of the conversation up to there: a head start
        for the reply, due at once."""
        if self.llm.end_of_message is None:
            return None
        return await self.llm.worker.run_by(self.llm.clock.now(), self._end_of_turn, messages, tools)

    def _end_of_turn(self, messages: Sequence[ChatMessage], tools: Tools | None = None) -> float | None:
        """P(the message ends) + P(a sentence mark: ".", "?", "!") after the last message's words,
        from one prefill. The words come without their final punctuation (pipeline.turn_policy.
        bare_words): Whisper puts a "?" even after "Can you book me a table for", and the model
        trusts it; asked whether a mark would come there, it knows better. A sentence's end, not the
        message's: a chat user often goes on after "Thank you for your help." (0.02), a caller who
        said it is done (0.9 for the mark). On the turn-detection set it tells complete turns from
        cut ones better than the message's end read after Whisper's transcript as written (ROC AUC
        0.93 against 0.91), and costs no more."""
        marker = self.llm.end_of_message
        assert marker is not None
        if self.generating:  # a reply began meanwhile: its cache is not this prompt's to change
            return None
        prompt = self._prompt(messages, add_generation_prompt=False, tools=tools)
        if tuple(prompt[-len(marker):]) != marker or len(prompt) + 1 > self.context_tokens:
            return None
        logits, _ = self.llm.lm.prefill(self._state(), prompt[:-len(marker)])
        p = _softmax(logits)
        return min(1.0, float(p[marker[0]] + sum(p[m] for m in self.llm.sentence_marks)))

    def set_speculation_cap(self, cap: int | None) -> None:
        self.decoding.cap = cap

    def set_deadline(self, at: float | None) -> None:
        self.lane.deadline = at

    def _asking(self) -> None:
        """Before each job of a generation: more follow it, and with no deadline set (a /v1
        request) it is due api_deadline_s from now."""
        self.lane.more = True
        self.lane.fallback = self.llm.clock.now() + self.llm.api_deadline_s

    def _step(self, loop: GenerationLoop) -> StepResult:
        result = loop.step()
        self.lane.more = not loop.done  # read by the worker right after: is another step coming?
        return result

    def _close(self) -> None:
        self.decoding.close()
        if self.state is not None:
            self.llm.lm.release(self.state)
            self.state = None

    async def aclose(self) -> None:
        """Give the conversation's sequence back: due now, ahead of every live call's steps (a
        hung-up call's close once waited seconds behind them, holding its sequence while a
        redialled call needed one), and done even if the caller is cancelled meanwhile (a job
        dropped with its caller leaked the sequence for the life of the process)."""
        # RuntimeError: the worker has shut down with the whole engine, and nothing is left to free.
        # The lane itself is made due now, so a job of this conversation queued before (a weigher's
        # step its cancelled caller left behind) still runs before the close, never on a freed sequence.
        self.lane.deadline = self.llm.clock.now()
        with contextlib.suppress(RuntimeError):
            job = self.llm.worker.submit(self.lane, self._close)
            await asyncio.shield(asyncio.wrap_future(job))
