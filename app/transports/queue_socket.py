"""A call runner's socket over a queue (app/transports/call.py reads it as it reads a WebSocket): the
transport queues what its peer sends (`put`), and `gone` ends it with a disconnect. A WebRTC data
channel (webrtc/channel.py) and a SIP dialog (sip/line.py) each add how they send and close."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.datastructures import Address
from starlette.websockets import WebSocketState

log = logging.getLogger(__name__)
DISCONNECT = {"type": "websocket.disconnect", "code": 1000}


class QueueSocket:
    """accept, receive and application_state of Starlette's WebSocket, over a bounded queue."""

    flooded = "a peer sent more than %d messages unread; ending the call"  # logged when the queue is full

    def __init__(self, scope: dict[str, Any], client: Address | None) -> None:
        self.scope = scope
        self.client = client
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=256)
        self.application_state = WebSocketState.CONNECTING

    def put(self, message: dict[str, Any]) -> None:
        if self.application_state == WebSocketState.DISCONNECTED:
            return
        try:
            self.inbox.put_nowait(message)
        except asyncio.QueueFull:  # a peer flooding the call: the call is ended, not the server's memory
            log.warning(self.flooded, self.inbox.maxsize)
            self.gone()

    def gone(self) -> None:
        """The peer hung up: the runner reads a disconnect next."""
        if self.application_state != WebSocketState.DISCONNECTED:
            self.application_state = WebSocketState.DISCONNECTED
            while not self.inbox.empty():
                self.inbox.get_nowait()
            self.inbox.put_nowait(DISCONNECT)

    async def accept(self, subprotocol: str | None = None) -> None:
        if self.application_state == WebSocketState.CONNECTING:
            self.application_state = WebSocketState.CONNECTED

    async def receive(self) -> dict[str, Any]:
        return await self.inbox.get()
