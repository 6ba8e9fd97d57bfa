"""WebRTC calls: the peer connection, its tracks and data channel, and POST /v1/realtime/calls."""
