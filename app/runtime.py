"""What the app holds while it runs: settings, the clock, the loaded backends, the live sessions.
Models load in a background thread at start-up so /healthz can answer (503) while they load."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from app.metrics import Metrics
from app.security.phone_tokens import StreamTokens
from app.security.shared import RedisUsedTokens
from app.security.shared_store import SharedStore
from app.security.tokens import Tokens, token_secret
from app.settings import Settings
from app.store import CallStore
from app.store.traces import TurnTracer, make_tracer
from app.vllm_metrics import VllmMetricsPoller
from core.clock import Clock
from core.errors import VoiceAgentError, error_code
from models import registry
from models.protocols import TurnDetector
from pipeline import denoise, echo, honesty
from pipeline.events import ResponseDone
from pipeline.facts import facts_in
from pipeline.session import Backends, PipelineConfig
from pipeline.tools import HttpTool, ToolBox, load_tools_file
from pipeline.turn_policy import TurnPolicy

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    settings: Settings
    clock: Clock
    backends: Backends | None = None
    load_error: str | None = None
    status: str = "starting"
    sessions: dict[str, str] = field(default_factory=dict)  # live calls: id -> transport (ws, twilio, telnyx)
    # the tasks of calls still running, clean-up included (a call's slot is free before its clean-up
    # ends): shutdown waits for them before it closes the store and the models
    calls: set[asyncio.Task[Any]] = field(default_factory=set)
    api_requests: int = 0  # generations in progress through /v1
    metrics: Metrics = field(default_factory=Metrics)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    draining: asyncio.Event = field(default_factory=asyncio.Event)  # set on SIGTERM: no new calls (drain)
    drain_deadline: float = 0.0  # the clock's time by which calls in progress must have said goodbye
    vllm_metrics: VllmMetricsPoller | None = None
    store: CallStore | None = None  # every call and turn, for QA (storage.enabled); see app/store/store.py
    store_error: str | None = None  # why the store is off, when it failed to open
    tracer: TurnTracer | None = None  # each turn as an OTLP trace (otel.endpoint)
    shared: SharedStore | None = field(init=False)  # server.redis_url: what replicas share (app/security/shared.py)
    stream_nonces: Tokens = field(init=False)  # Twilio: each TwiML's one-use nonce, handed back in `start`
    telnyx_tokens: StreamTokens = field(init=False)  # Telnyx: one-use stream tokens, and the used ones
    server_tools: list[HttpTool] = field(default_factory=list)  # tools.file: the HTTP tools the server runs
    http: httpx.AsyncClient | None = None  # calls them (made with the first call that has some)
    _released: asyncio.Event | None = field(default=None, init=False, repr=False)  # set when a call slot comes free

    def __post_init__(self) -> None:
        server = self.settings.server
        self.shared = (SharedStore.from_url(server.redis_url, server.shared_state_failure, self.metrics.shared_state)
                       if server.redis_url else None)
        self.stream_nonces = Tokens(self.settings.twilio.stream_nonce_ttl_s, self.clock,
                                    token_secret(self.settings.server), "stream nonce",
                                    RedisUsedTokens(self.shared, "stream nonce") if self.shared is not None else None)
        self.telnyx_tokens = StreamTokens(self.settings.telnyx)

    def open_session(self, session_id: str, transport: str) -> None:
        self.sessions[session_id] = transport
        self._count_active(transport)

    def keep_call_task(self, task: asyncio.Task[Any] | None) -> None:
        """A task of a call (its handler, its session): shutdown waits for it (end_calls)."""
        if task is not None:
            self.calls.add(task)
            task.add_done_callback(self.calls.discard)

    async def end_calls(self, grace_s: float) -> None:
        """Wait up to `grace_s` for the calls' tasks to finish, cancel those left, and wait (as long
        again) for them to unwind: each writes its call's end and hands over its recording."""
        if not self.calls:
            return
        _, pending = await asyncio.wait(set(self.calls), timeout=grace_s)
        if pending:
            log.warning("shutdown: %d call tasks still running after %g s; cancelling them", len(pending), grace_s)
            for task in pending:
                task.cancel()
            await asyncio.wait(pending, timeout=grace_s)

    def close_session(self, session_id: str) -> None:
        transport = self.sessions.pop(session_id, None)
        if transport is not None:
            self._count_active(transport)
            released, self._released = self._released, None
            if released is not None:
                released.set()  # a call waiting for a slot (app/admission.py) looks again

    async def slot_released(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for a call slot to be given back; False when none was."""
        if self._released is None:
            self._released = asyncio.Event()
        released = self._released
        try:
            async with asyncio.timeout(timeout_s):
                await released.wait()
        except TimeoutError:
            return False
        return True

    def _count_active(self, transport: str) -> None:
        self.metrics.active_sessions.labels(transport).set(sum(t == transport for t in self.sessions.values()))

    async def on_turn(self, done: ResponseDone, call_id: str | None = None) -> None:
        self.metrics.observe_turn(done, call_id)
        if done.stats is not None:
            self.metrics.observe_generation(done.stats)

    def pipeline_config(self) -> PipelineConfig:
        s = self.settings
        return PipelineConfig(s.endpointing, s.asr_stage, s.chunker, s.session, s.sampling())

    @property
    def load_error_code(self) -> str | None:
        """load_error's code alone ("model_fetch_failed"): what anyone may be shown of it."""
        return None if self.load_error is None else error_code(self.load_error)

    def toolbox(self) -> ToolBox:
        """A call's tools: the server's own (tools.file), to which a client adds its own."""
        if self.http is None:
            self.http = httpx.AsyncClient(follow_redirects=False)
        return ToolBox(self.settings.tools, self.clock, self.server_tools, self.http)

    async def load(self) -> None:
        """Load and warm up every backend (off the event loop); sets `ready` or `load_error`."""
        if self.backends is not None:
            self.status = "ready"
            self.ready.set()
            return
        if self.settings.tools.file:
            try:
                self.server_tools = load_tools_file(self.settings.tools.file)
            except VoiceAgentError as exc:
                self.load_error, self.status = f"{exc.code}: {exc}", "failed"
                log.error("the tools file cannot be used: %s", exc)
                return
            log.info("tools.file: %d HTTP tools (%s)", len(self.server_tools),
                     ", ".join(t.tool.name for t in self.server_tools))
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Backends] = loop.create_future()

        def work() -> None:
            try:
                backends = load_backends(self.settings, self.clock, self._say, self.server_tools)
            except BaseException as exc:  # reported through the future, never lost
                loop.call_soon_threadsafe(_set_exception, done, exc)
            else:
                loop.call_soon_threadsafe(_set_result, done, backends)

        threading.Thread(target=work, name="model-loader", daemon=True).start()
        try:
            self.backends = await done
        except VoiceAgentError as exc:
            self.load_error = f"{exc.code}: {exc}"
            self.status = "failed"
            log.error("models failed to load: %s", exc)
            return
        except Exception as exc:  # not one of ours: its text stays in the log, clients see its kind
            self.load_error = f"{type(exc).__name__} (the server log says more)"
            self.status = "failed"
            log.exception("models failed to load")
            return
        self.status = "ready"
        self.ready.set()
        log.info("models loaded; ready for calls")

    def start_vllm_metrics(self) -> None:
        """With the vLLM backend and llm.vllm_metrics_url set, republish vLLM's speculative-decoding
        acceptance in this service's /metrics (stopped by aclose)."""
        llm = self.settings.llm
        if llm.engine == "openai" and llm.vllm_metrics_url and self.vllm_metrics is None:
            self.vllm_metrics = VllmMetricsPoller(llm.vllm_metrics_url, self.metrics.registry, self.clock,
                                                  interval_s=llm.vllm_metrics_interval_s)
            self.vllm_metrics.start()

    async def open_store(self) -> None:
        """Open the call store (its migrations run here) and the trace exporter. A store that cannot
        open is logged and left off: calls go on without it, and /api/calls says why."""
        if self.settings.storage.enabled and self.store is None:
            store = CallStore(self.settings.storage, clock=self.clock,
                              on_drop=lambda reason: self.metrics.store_dropped.labels(reason).inc())
            try:
                await store.open()
            except Exception as exc:
                await store.close()
                self.store_error = f"it failed to open: {type(exc).__name__} (the server log says more)"
                log.exception("the call store failed to open; calls are not kept")
            else:
                self.store = store
        if self.tracer is None:
            self.tracer = make_tracer(self.settings.otel)

    def begin_drain(self) -> None:
        """Stop taking calls; each call in progress finishes the reply it is giving (up to
        server.drain_timeout_s from the first call of this), says goodbye and closes itself
        (Connection.run). Calling it again (SIGTERM after POST /api/drain) keeps the first deadline."""
        if self.draining.is_set():
            return
        timeout = self.settings.server.drain_timeout_s
        self.drain_deadline = self.clock.now() + timeout
        self.status = "draining"
        self.draining.set()
        log.info("draining: %d calls and %d /v1 generations in progress; up to %g s (server.drain_timeout_s)",
                 len(self.sessions), self.api_requests, timeout)

    async def drain(self, grace_s: float = 5.0) -> bool:
        """begin_drain, then wait: /v1 generations in progress finish too. Returns True when none is
        left, False `grace_s` after the deadline with calls still open."""
        self.begin_drain()
        while self.sessions or self.api_requests:
            if self.clock.now() > self.drain_deadline + grace_s:
                log.warning("drain: %d calls still open past the deadline; they are cut", len(self.sessions))
                return False
            await asyncio.sleep(0.05)
        log.info("drained: no calls in progress")
        return True

    def _say(self, status: str) -> None:
        self.status = status
        log.info("%s", status)

    async def aclose(self, grace_s: float = 5.0) -> None:
        """Shut down in the order that keeps every record: the calls end first (their ends and
        recordings go to the store), then the store is flushed and closed, then the models."""
        await self.end_calls(grace_s)
        if self.http is not None:
            await self.http.aclose()
            self.http = None
        if self.store is not None:
            await self.store.close()
            self.store = None
        if self.shared is not None:
            await self.shared.aclose()
        if self.vllm_metrics is not None:
            await self.vllm_metrics.stop()
        if self.backends is not None:
            await self.backends.llm.aclose()
            if self.backends.tools_llm is not None:
                await self.backends.tools_llm.aclose()
            for worker in (self.backends.vad_worker, self.backends.turn_worker, self.backends.asr_worker,
                           self.backends.tts_worker):
                worker.shutdown()
        if self.tracer is not None:
            await asyncio.to_thread(self.tracer.shutdown)
            self.tracer = None


def _set_result(fut: asyncio.Future[Backends], value: Backends) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future[Backends], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


def load_backends(settings: Settings, clock: Clock, say: object = print,
                  server_tools: list[HttpTool] | None = None) -> Backends:
    """Blocking: load the four engines and warm each one up so the first caller does not wait. The LLM's
    warm-up pins the prompt of the server's tools (`server_tools`, as read from tools.file)."""
    report = say if callable(say) else print
    if settings.session.echo.enabled:
        echo.EchoCanceller()  # libspeexdsp is here and works: a missing library stops the start, saying what to do
    for line_rate in (8000, 16000):  # each line's suppressor can be made: a missing library or package stops the start
        denoise.make(settings.session.noise.for_line(line_rate))
    report("loading VAD")
    vad = registry.load_vad(settings.vad)
    report(f"loading ASR ({settings.asr.engine}, {settings.asr.model})")
    asr = registry.load_asr(settings.asr)
    asr.transcribe(np.zeros(asr.sample_rate, dtype=np.float32))
    report(f"loading TTS ({settings.tts.engine})")
    tts = registry.load_tts(settings.tts)
    for _ in tts.synthesize("Hello there."):
        pass
    llm_cfg = settings.llm
    remote = f"{llm_cfg.remote_model or 'the served model'} at {llm_cfg.base_url}"
    where = llm_cfg.model if llm_cfg.engine == "embedded" else remote
    report(f"loading LLM ({llm_cfg.engine}, {where})")
    llm = registry.load_llm(llm_cfg, clock, sequences=settings.server.max_sessions,
                            api_sequences=settings.server.max_api_requests)
    tools_llm = None
    if llm_cfg.engine == "embedded" and llm_cfg.tools_model and llm_cfg.tools_model != llm_cfg.model:
        report(f"loading the LLM of calls with tools ({llm_cfg.tools_model}; llm.tools_model)")
        # on the default model's thread: one model computes at a time, the most urgent job first (a
        # call with tools weighs its caller's words on the default model while the tools model answers)
        tools_llm = registry.load_llm(llm_cfg.model_copy(update={"model": llm_cfg.tools_model}), clock,
                                      sequences=settings.server.max_sessions,
                                      api_sequences=settings.server.max_api_requests,
                                      worker=getattr(llm, "worker", None))
    box = ToolBox(settings.tools, clock, server_tools or [], None)
    if settings.sip.enabled:  # a SIP call can transfer: its tools end with transfer_call (tools.transfer_targets)
        box.on_transfer = lambda name, destination: None
    offered = box.tools(1)
    for engine, tools in ((llm, offered if tools_llm is None else None), (tools_llm, offered)):
        warm_up = getattr(engine, "warm_up", None)
        if callable(warm_up):
            warm_up(settings.session.system_prompt, tools, settings.session.tools_prompt)
    judge = tools_llm or llm
    if settings.session.honesty.enabled and isinstance(judge, honesty.Asks):
        # The honesty gate's question (its instructions, examples and the operator's facts: over a
        # thousand tokens) computed now, once: else the first caller's reply waited for it (14 s on 2 cores).
        report("warming the honesty gate's question")
        facts = facts_in(settings.session.system_prompt) or ""
        asyncio.run(honesty.cannot_answer(judge, "Hello there.", [], facts))
    return Backends(vad=vad, asr=asr, tts=tts, llm=llm, turn=_load_turn(settings, llm.weighs_words, report),
                    tools_llm=tools_llm)


def _load_turn(settings: Settings, llm_weighs_words: bool, report: Callable[[str], object]) -> TurnDetector | None:
    """The end-of-turn model, if the end-of-turn decision weighs its answer at these settings (at the
    defaults, with the embedded LLM, the words alone decide); None when turn.engine is off."""
    words = settings.endpointing.text_signal and llm_weighs_words
    if not TurnPolicy(settings.endpointing, words).hears:
        report("the end-of-turn model is not loaded: the words decide (endpointing.audio_weight is 0)")
        return None
    turn = registry.load_turn(settings.turn)
    if turn is not None:
        report(f"loaded the end-of-turn model ({settings.turn.model})")
        turn.probability(np.zeros(turn.sample_rate, dtype=np.float32))
    return turn

