"""SIP messages leave the server's socket in the order the stack sends them (app/transports/sip/reactor.py).

With sippy's three sending threads a 100 Trying could leave after the 200 OK queued a few ms later, and
SIPp aborted such a call (one in ten in a CI run of tests/e2e/test_sip.py). A real socket and sippy's
real UDP server, no models."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from app.transports.sip.reactor import Reactor, SipLog, transaction_manager
from tests.sip_phone import free_udp_port

MESSAGES = 150  # small datagrams: well inside a default receive buffer, so none is dropped


@pytest.fixture
def peer() -> Iterator[socket.socket]:
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(10)
    yield receiver
    receiver.close()


def test_messages_leave_the_sip_socket_in_the_order_they_were_sent(peer: socket.socket) -> None:
    reactor = Reactor.get()
    port = free_udp_port()
    config = {"_sip_address": "127.0.0.1", "_sip_port": port, "_sip_logger": SipLog()}
    manager = reactor.call_sync(transaction_manager, config, lambda *args: None)
    try:
        server = manager.l4r.getServer(peer.getsockname())
        assert server.getSIPaddr()[0][1] == port

        def burst() -> None:
            for number in range(MESSAGES):
                server.send_to(b"%d" % number, peer.getsockname())

        reactor.call_sync(burst)
        received = [int(peer.recv(64)) for _ in range(MESSAGES)]
        assert received == list(range(MESSAGES))
        assert len(server.areceivers) == 3  # still three threads reading the socket
    finally:
        reactor.call_sync(manager.shutdown)
