"""A WebRTC call's data channel as the call runner's socket (app/transports/call.py): the runner and a
transport's wire read and write it as they do a WebSocket, so a WebRTC call has the same admission,
limits, loop and record as every other. Text messages are events; the audio is on the tracks
(app/transports/webrtc/media.py), not here.

The "socket" is connected once the channel opens, and disconnects when the channel closes, the peer
connection fails or closes, or the server closes it (which ends the peer connection)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiortc import RTCDataChannel
from starlette.datastructures import Address
from starlette.websockets import WebSocketDisconnect, WebSocketState

from app.transports.queue_socket import QueueSocket

log = logging.getLogger(__name__)


class ChannelSocket(QueueSocket):
    """The subset of Starlette's WebSocket the call runner uses, over a data channel."""

    flooded = "a WebRTC data channel sent more than %d messages unread; closing the call"

    def __init__(self, scope: dict[str, Any], client: Address | None, on_close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(scope, client)
        self.on_close = on_close  # ends the peer connection
        self.channel: RTCDataChannel | None = None
        self.opened = asyncio.Event()

    def attach(self, channel: RTCDataChannel) -> None:
        """The peer's channel: its messages come in from now on."""
        self.channel = channel

        @channel.on("message")
        def on_message(message: str | bytes) -> None:
            self.put({"type": "websocket.receive", "text": message} if isinstance(message, str)
                     else {"type": "websocket.receive", "bytes": message})

        @channel.on("close")
        def on_close() -> None:
            self.gone()

        if channel.readyState == "open":
            self.opened.set()
        else:
            channel.on("open", self.opened.set)

    # -- the runner's side (accept: connected at once; sending waits for the channel to open) ----------
    async def send_text(self, data: str) -> None:
        await self._send(data)

    async def send_bytes(self, data: bytes) -> None:
        await self._send(data)

    async def _send(self, data: str | bytes) -> None:
        if self.application_state == WebSocketState.DISCONNECTED:
            raise WebSocketDisconnect(1000)
        await self.opened.wait()
        if self.channel is None or self.channel.readyState != "open":
            raise WebSocketDisconnect(1000)
        self.channel.send(data)

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        if self.application_state == WebSocketState.DISCONNECTED:
            return
        if reason:
            log.info("closing a WebRTC call (%d): %s", code, reason)
        self.gone()
        await self.on_close()
