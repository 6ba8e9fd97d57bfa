"""The FastAPI app factory. The lifespan starts loading the backends once, in the background;
/healthz says 503 until they are ready and 200 after."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from app import health, openai_api, qa_api, qa_pages
from app.metrics_server import metrics_route, start_metrics_server
from app.redact import hold_value_loggers, install_log_redaction
from app.runtime import Runtime
from app.security import access
from app.security.guard import Guard
from app.security.limits import parse_networks
from app.settings import Settings
from app.transports import outbound
from app.transports.native import wire as native
from app.transports.phone import telnyx, twilio
from app.transports.phone.dial import PhoneDialer
from app.transports.realtime import secrets as realtime_secrets
from app.transports.realtime import wire as realtime
from app.transports.sip.calls import SipCalls
from app.transports.webrtc import native as webrtc_native
from app.transports.webrtc import realtime as webrtc_realtime
from core.clock import Clock, MonotonicClock
from core.private import set_caller_content
from pipeline.session import Backends
from pipeline.turn_policy import check_decision

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"


def create_app(settings: Settings | None = None, *, clock: Clock | None = None,
               backends: Backends | None = None) -> FastAPI:
    runtime = Runtime((settings or Settings()).with_facts(), clock or MonotonicClock(), backends=backends)
    check_decision(runtime.settings.endpointing, runtime.settings.asr.end_confidence)
    install_log_redaction()
    set_caller_content(runtime.settings.server.log_caller_content)
    hold_value_loggers(runtime.settings.server.log_caller_content)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loading = asyncio.create_task(runtime.load())
        twilio.log_setup(runtime.settings)
        telnyx.log_setup(runtime.settings)
        runtime.start_vllm_metrics()
        await runtime.open_store()
        server = runtime.settings.server
        metrics_server = (start_metrics_server(server.metrics_host, server.metrics_port, runtime.metrics.registry)
                          if server.metrics_port else None)
        sip = None
        if runtime.settings.sip.enabled:
            sip = app.state.sip = SipCalls(runtime)
            await sip.start()
        try:
            yield
        finally:
            loading.cancel()
            await app.state.phone_dialer.close()
            if sip is not None:
                await sip.stop()
            if metrics_server is not None:
                await asyncio.to_thread(metrics_server.close)
            await runtime.aclose()

    app = FastAPI(title="voice-agent", version="0.1.0", lifespan=lifespan)
    app.state.runtime = runtime
    app.state.placed_calls = outbound.PlacedCalls()
    app.state.phone_dialer = PhoneDialer(runtime)
    settings = runtime.settings
    runtime.metrics.call_slots.set(settings.server.max_sessions)
    app.state.access = access.Access(settings.server, runtime.clock,
                                     public_urls=[settings.twilio.public_url, settings.telnyx.public_url],
                                     shared=runtime.shared)
    app.add_middleware(Guard, access=app.state.access, settings=settings, clock=runtime.clock)
    trusted = [str(n) for n in parse_networks(settings.server.trusted_proxies, "server.trusted_proxies")]
    if trusted:  # outside the guard: the guard sees the client a trusted proxy names, and its scheme
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=trusted)
    app.include_router(health.router)
    app.include_router(access.router)
    app.include_router(native.router)
    app.include_router(realtime.router)
    app.include_router(realtime_secrets.router)
    app.include_router(webrtc_realtime.router)
    app.include_router(webrtc_native.router)
    app.include_router(openai_api.router)
    app.include_router(qa_api.router)
    app.include_router(qa_pages.router)
    app.include_router(outbound.router)
    app.include_router(twilio.router)
    app.include_router(telnyx.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.router.routes.append(metrics_route(runtime.metrics.registry))  # behind the guard, as every route
    return app
