"""The service: FastAPI app factory, transports, wire messages, settings, and the CLI."""
