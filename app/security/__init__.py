"""Who may call: API keys and session tokens (access.py), the ASGI guard in front of every route
(guard.py), and per-client limits (limits.py)."""
