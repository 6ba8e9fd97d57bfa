"""Where /metrics is served, by prometheus_client's own code in both places (docs/security.md):

- on the main port, `metrics_route`: prometheus_client's ASGI app as a route, so the guard in front
  of every route asks for a key when keys are set;
- without a key on server.metrics_port: prometheus_client's own HTTP server, for a private network
  (Prometheus in the same compose project), apart from the public port.

Both answer with the exposition in the format the scraper's Accept header asks for (OpenMetrics for
Prometheus), gzipped when the scraper takes gzip, only the series named by `?name[]=` when it names
some; a method other than GET (and HEAD) gets 405.

The private port's server:

It runs in a daemon thread of its own and reads the registry there (prometheus_client's metrics are
thread-safe). It answers GET on any path with the exposition, in the format the scraper's Accept
header asks for (OpenMetrics for Prometheus), gzipped when the scraper takes gzip; other methods get
405. Nothing else is served on this port.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, make_asgi_app, start_http_server
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger(__name__)
JOIN_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class MetricsServer:
    """The running server; `close()` stops it (blocking up to half a second, its poll interval)."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        """The port it listens on (the one chosen by the system when started with port 0)."""
        return int(self.server.server_port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(JOIN_TIMEOUT_S)


def start_metrics_server(host: str, port: int, registry: CollectorRegistry) -> MetricsServer:
    """Serve `registry` on host:port (port 0: any free port) until `close()`."""
    server, thread = start_http_server(port, addr=host, registry=registry)
    started = MetricsServer(server, thread)
    log.info("serving /metrics without a key on %s:%d (server.metrics_port)", host, started.port)
    return started


@dataclass(frozen=True)
class _AsgiEndpoint:
    """An ASGI app that Starlette's Route serves as it is (a plain function, which is what
    make_asgi_app returns, would be taken for a request handler)."""

    app: ASGIApp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def metrics_route(registry: CollectorRegistry) -> Route:
    """GET /metrics on the main port, served by prometheus_client's ASGI app. A route at the exact path
    rather than `app.mount`: a mount answers /metrics with a redirect to /metrics/."""
    return Route("/metrics", _AsgiEndpoint(make_asgi_app(registry)), methods=["GET"], include_in_schema=False)
