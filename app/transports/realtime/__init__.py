"""The OpenAI Realtime API (docs/realtime.md): settings, event shapes, the session's output as
server events, and the client events to the call runner."""
