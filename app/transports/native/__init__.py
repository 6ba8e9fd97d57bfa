"""The native WebSocket transport at /ws (docs/websocket.md): messages.py, the message schemas;
wire.py, the protocol handler and its route."""
