"""The transports: each translates one wire format (the native /ws protocol, Twilio's and Telnyx's
media streams, the OpenAI Realtime API) into the one call runner (call.py), which owns admission,
the session's life, the call's record and playback reports."""
