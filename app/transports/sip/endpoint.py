"""SIP signalling (docs/sip.md): INVITEs from a trunk or a PBX answered, calls placed through the
trunk, BYE and CANCEL both ways, a transfer by REFER. The SIP stack is sippy's (messages,
transactions, dialogs, digest authentication; app/transports/sip/reactor.py runs it); this module
decides who may call, and hands each answered call to app/transports/sip/calls.py.

Who may call in: a source address in `sip.trusted_addresses`, or a caller that authenticates as
`sip.username` (digest, RFC 3261 22). Anything else is answered 403 (no credentials configured) or
challenged 401.

Everything named `_on_*` runs on the reactor's thread; it hands work to the asyncio loop with
`call_soon_threadsafe` and never blocks.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.redact import mask_number
from app.settings import SipConfig
from app.transports.sip.reactor import Reactor, SipLog, transaction_manager

log = logging.getLogger(__name__)


def local_address(config: SipConfig) -> str:
    """The address peers reach this server at: sip.public_address, else sip.host, else (sip.host is
    0.0.0.0) the address of the interface the default route goes out of."""
    if config.public_address:
        return config.public_address
    if config.host not in ("0.0.0.0", "::", ""):
        return config.host
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent, only the route is looked up
        return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()


def trusted(config: SipConfig, address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    for entry in config.trusted_addresses:
        try:
            if ip in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False


@dataclass(frozen=True)
class Progress:
    """What became of a call placed out: ringing, answered (with the callee's SDP), or failed."""

    dialog: Any
    state: str  # "ringing", "answered", "failed"
    code: int
    reason: str
    sdp: str = ""


@dataclass(frozen=True)
class Invite:
    """An INVITE let in: what the asyncio side needs to answer it."""

    dialog: Any  # sippy's UA
    source: tuple[str, int]
    caller: str  # the From user (a number, usually)
    called: str  # the Request-URI user
    sdp: str


class Signalling:
    """Sippy's transaction manager bound to sip.host:sip.port, and the dialogs on it."""

    def __init__(self, config: SipConfig, loop: asyncio.AbstractEventLoop, on_invite: Callable[[Invite], None],
                 on_hangup: Callable[[Any, str], None], on_progress: Callable[[Progress], None]) -> None:
        self.config = config
        self.loop = loop
        self.on_invite = on_invite  # called on the loop: a new call to answer (or refuse)
        self.on_hangup = on_hangup  # called on the loop: a dialog ended by the far end (BYE, CANCEL, failure)
        self.on_progress = on_progress  # called on the loop: a call placed out rings, is answered, fails
        self.address = local_address(config)
        self.reactor: Reactor | None = None
        self.global_config: dict[str, Any] = {}
        self.manager: Any = None

    # -- the asyncio side ----------------------------------------------------------------------------
    async def start(self) -> None:
        self.reactor = await asyncio.to_thread(Reactor.get)
        await asyncio.to_thread(self.reactor.call_sync, self._bind)
        log.info("SIP: listening on %s:%d (UDP), reached as %s; trunks trusted by address: %s; digest "
                 "authentication: %s", self.config.host, self.config.port, self.address,
                 ", ".join(self.config.trusted_addresses) or "none",
                 "as " + self.config.username if self.config.username else "off")

    async def stop(self) -> None:
        if self.reactor is not None and self.manager is not None:
            await asyncio.to_thread(self.reactor.call_sync, self.manager.shutdown)
            self.manager = None

    def run(self, fn: Callable[..., Any], *args: Any) -> None:
        """`fn(*args)` on the reactor's thread."""
        assert self.reactor is not None
        self.reactor.call(fn, *args)

    # -- the reactor's side --------------------------------------------------------------------------
    def _bind(self) -> None:
        from sippy.SipConf import SipConf

        SipConf.my_uaname = "voice-agent"
        SipConf.my_address = self.address
        SipConf.my_port = self.config.port
        SipConf.allow_formats = (0, 8, 101)
        self.global_config = {"_sip_address": self.config.host, "_sip_port": self.config.port,
                              "_sip_logger": SipLog()}
        self.manager = transaction_manager(self.global_config, self._on_request)
        self.global_config["_sip_tm"] = self.manager

    def _on_request(self, request: Any, transaction: Any) -> Any:
        method = request.getMethod()
        if request.getHFBody("to").getTag() is not None:
            return (request.genResponse(481, "Call Leg/Transaction Does Not Exist"), None, None)
        if method == "OPTIONS":  # a trunk's keep-alive
            return (request.genResponse(200, "OK"), None, None)
        if method != "INVITE":
            return (request.genResponse(501, "Not Implemented"), None, None)
        source = request.getSource()
        host, port = str(source[0]), int(source[1])
        refusal = self._refusal(request, host)
        if refusal is not None:
            return refusal
        from sippy.UA import UA

        dialog = UA(self.global_config, event_cb=self._on_event, disc_cbs=(self._on_ended,),
                    fail_cbs=(self._on_ended,), dead_cbs=(self._on_dead,))
        dialog.source = (host, port)
        return dialog.recvRequest(request, transaction)

    def _refusal(self, request: Any, host: str) -> Any:
        """None if the INVITE may come in, else the response refusing it (403, or a 401 challenge)."""
        from sippy.SipHeader import SipHeader

        if trusted(self.config, host):
            return None
        if not self.config.username:
            log.warning("SIP: refused an INVITE from %s: not in sip.trusted_addresses, and no sip.username is set "
                        "for digest authentication", host)
            return (request.genResponse(403, "Forbidden"), None, None)
        if request.countHFs("authorization") and self._authenticated(request.getHFBody("authorization")):
            return None
        challenge = SipHeader(name="www-authenticate")
        challenge.getBody().realm = self.config.realm
        response = request.genResponse(401, "Unauthorized")
        response.appendHeader(challenge)
        if request.countHFs("authorization"):
            log.warning("SIP: an INVITE from %s failed digest authentication; challenged again", host)
        return (response, None, None)

    def _authenticated(self, authorization: Any) -> bool:
        from sippy.SipAuthorization import NameList2AlgMask
        from sippy.SipWWWAuthenticate import SipWWWAuthenticate

        if not authorization.parsed:
            authorization.parse()
        if authorization.username != self.config.username or authorization.realm != self.config.realm:
            return False
        if not SipWWWAuthenticate.ho.validate_challenge(authorization.nonce,
                                                       NameList2AlgMask((authorization.algorithm,))):
            return False  # a nonce this server did not give, or a stale one (sippy's HashOracle: 32 s)
        return bool(authorization.verify(self.config.password.get_secret_value(), "INVITE"))

    def _on_event(self, event: Any, dialog: Any) -> None:
        from sippy.CCEvents import CCEventConnect, CCEventFail, CCEventPreConnect, CCEventRing, CCEventTry

        if getattr(dialog, "placed", False):
            data = event.getData() if isinstance(event, (CCEventRing, CCEventConnect, CCEventFail)) else None
            code, reason = (int(data[0]), str(data[1])) if data else (0, "")
            body = data[2] if data and len(data) > 2 else None
            if isinstance(event, CCEventRing):
                state = "ringing"
            elif isinstance(event, (CCEventConnect, CCEventPreConnect)):
                state = "answered"
            elif isinstance(event, CCEventFail):
                state = "failed"
            else:
                return
            progress = Progress(dialog, state, code, reason, str(body) if body is not None else "")
            self.loop.call_soon_threadsafe(self.on_progress, progress)
        elif isinstance(event, CCEventTry):
            _, caller, called, body, _, _ = event.getData()
            sdp = str(body) if body is not None else ""
            invite = Invite(dialog, getattr(dialog, "source", ("", 0)), str(caller or ""), str(called or ""), sdp)
            log.info("SIP: INVITE from %s (%s:%d) to %s", mask_number(invite.caller), *invite.source, invite.called)
            self.loop.call_soon_threadsafe(self.on_invite, invite)

    def _on_ended(self, dialog: Any, rtime: Any, origin: str, *rest: Any) -> None:
        self.loop.call_soon_threadsafe(self.on_hangup, dialog, str(origin))

    def _on_dead(self, dialog: Any, *rest: Any) -> None:
        self.loop.call_soon_threadsafe(self.on_hangup, dialog, "dead")

    # -- answers and hang-ups (called with `run`) ----------------------------------------------------
    @staticmethod
    def answer(dialog: Any, sdp: str) -> None:
        from sippy.CCEvents import CCEventConnect
        from sippy.MsgBody import MsgBody

        dialog.recvEvent(CCEventConnect((200, "OK", MsgBody(sdp))))

    @staticmethod
    def refuse(dialog: Any, code: int, reason: str) -> None:
        from sippy.CCEvents import CCEventFail

        dialog.recvEvent(CCEventFail((code, reason)))

    def dial(self, target: tuple[str, int], called: str, sdp: str) -> Any:
        """Place a call (INVITE) to `called` through `target` (host, port) with the offer `sdp`,
        answering the trunk's digest challenge with sip.trunk's credentials. Returns the dialog."""
        from sippy.CCEvents import CCEventTry
        from sippy.MsgBody import MsgBody
        from sippy.SipCallId import SipCallId
        from sippy.UA import UA

        trunk = self.config.trunk
        dialog = UA(self.global_config, event_cb=self._on_event, username=trunk.username or None,
                    password=trunk.password.get_secret_value() or None, nh_address=target,
                    disc_cbs=(self._on_ended,), dead_cbs=(self._on_dead,))
        dialog.placed = True
        dialog.useRefer = True
        dialog.recvEvent(CCEventTry((SipCallId(), trunk.caller_id, called, MsgBody(sdp), None, "voice-agent")))
        return dialog

    @staticmethod
    def transfer(dialog: Any, target: str) -> None:
        """A cold transfer: REFER the far end to `target` (a SIP URI), then the dialog ends."""
        from sippy.CCEvents import CCEventDisconnect
        from sippy.SipAddress import SipAddress
        from sippy.SipURL import SipURL

        dialog.useRefer = True
        dialog.recvEvent(CCEventDisconnect(SipAddress(url=SipURL(target))))

    @staticmethod
    def hang_up(dialog: Any) -> None:
        from sippy.CCEvents import CCEventDisconnect

        if not dialog.isDead():
            dialog.recvEvent(CCEventDisconnect())
