"""Phone calls over a provider's media WebSocket (docs/phone.md): messages.py, the frames and how
Twilio and Telnyx differ (Provider); wire.py, the protocol handler both share; twilio.py and
telnyx.py, each provider's webhook, stream URL and media route."""
