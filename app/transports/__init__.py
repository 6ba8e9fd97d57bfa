"""The transports, one folder each: native/ (the /ws protocol), phone/ (Twilio's and Telnyx's media
streams), realtime/ (the OpenAI Realtime API). In each, "messages" is the wire's schemas and "wire"
the protocol handler that translates them for the one call runner (call.py), which owns the
session's life, the call's record and playback reports; admission is app/admission.py's."""
