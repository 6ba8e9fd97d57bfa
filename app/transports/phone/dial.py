"""Calls placed out through Twilio's and Telnyx's REST APIs (docs/phone.md#calls-out), and phone
calls handed on through them (docs/phone.md#transfers).

Twilio: `POST {twilio.api_url}/2010-04-01/Accounts/{twilio.account_sid}/Calls.json`, form-encoded,
HTTP Basic with the account SID and auth token: `To`, `From` (twilio.caller_id), `Twiml` (a
<Connect><Stream> to this server's /twilio/media), `Timeout` (the ring timeout) and a signed
`StatusCallback` (POST /twilio/status) for `initiated ringing answered completed`.

Telnyx: `POST {telnyx.api_url}/v2/calls`, JSON, `Authorization: Bearer {telnyx.api_key}`:
`connection_id`, `to`, `from` (telnyx.caller_id), `timeout_secs`, and `stream_url` (this server's
/telnyx/media) with `stream_track` `inbound_track` and bidirectional RTP in PCMU.

The Dial command's `client_state` carries the call's id, and where `telnyx.public_key` is set its
`webhook_url` is this server's POST /telnyx/events (app/transports/phone/telnyx.py): a callee who is
busy or does not answer ends the call there, as Twilio's status callback does.

Either way the provider rings the callee and, once answered, opens the media stream the call runs
on (app/transports/phone/wire.py). The stream names the call it is for by a credential made for it
(`placed` = "<id>.<secret>": a TwiML <Parameter>, or the Telnyx stream URL's query), good for one
stream while the call rings: it stands for the one-use nonce or token of a call that came in,
which could expire during a long ring. The call's slot (server.max_sessions) is taken when it is
placed, so a callee who answers is never refused for a full server. A call whose stream has not
started `phone.answer_grace_s` after its ring timeout, or that still rings when the server drains,
is given up, its slot given back and the provider's call cancelled. A Telnyx call placed here is
hung up through the API when its stream ends (Twilio's ends with its <Connect>).

This replica keeps what it placed: with several replicas behind a balancer, the stream must reach
the replica that placed the call (docs/phone.md says how), or it is refused.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import logging
import secrets
import uuid
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import httpx

from app.admission import admit_call
from app.redact import mask_number
from app.runtime import Runtime
from app.transports.phone import telnyx, twilio
from app.transports.phone.errors import DialError
from app.transports.phone.wire import PLACED
from app.transports.screen import Screen

log = logging.getLogger(__name__)
ENDED_KEPT = 1000  # ended calls remembered, so that a late status callback is known for one
TWILIO_EVENTS = ("initiated", "ringing", "answered", "completed")
# Twilio's CallStatus values that end a call before it was answered (`completed` too: answered and
# hung up before the stream started)
TWILIO_ENDED = {"busy", "no-answer", "failed", "canceled", "completed"}


@dataclass
class PlacedLine:
    """A call placed out, from its placing until its stream ends."""

    id: str  # out_...
    secret: str  # with the id, the stream's one credential
    transport: str  # "twilio", "telnyx"
    session_id: str  # the call's record; its slot is taken from the moment it is placed
    first_message: str | None
    instructions: str | None
    placed: dict[str, Any]  # the record's `settings.placed`
    on_state: Callable[[str, str], None]
    screen: Screen | None = None  # answering-machine detection before the first word (None: off)
    provider_id: str = ""  # Twilio's CallSid, Telnyx's call_control_id
    answered: bool = False
    done: bool = False
    watch: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def credential(self) -> str:
        return f"{self.id}.{self.secret}"


class PhoneDialer:
    """The calls this replica placed through Twilio or Telnyx, while they ring or run."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.lines: dict[str, PlacedLine] = {}  # by id, from placing until the call ends
        self.http: httpx.AsyncClient | None = None  # the providers' APIs (made with the first call placed)
        self.ended: OrderedDict[str, None] = OrderedDict()  # the ids of the last calls that ended
        self.tasks: set[asyncio.Task[None]] = set()  # watches and hang-ups in progress

    def unready(self, transport: str) -> str | None:
        """What is missing for calls out over `transport`, or None."""
        if transport == "twilio":
            config = self.runtime.settings.twilio
            missing = [name for name, value in (("account_sid", config.account_sid), ("caller_id", config.caller_id),
                                                ("auth_token", config.auth_token.get_secret_value()),
                                                ("public_url", config.public_url)) if not value]
        else:
            tel = self.runtime.settings.telnyx
            missing = [name for name, value in (("api_key", tel.api_key.get_secret_value()),
                                                ("connection_id", tel.connection_id), ("caller_id", tel.caller_id),
                                                ("public_url", tel.public_url)) if not value]
        if not missing:
            return None
        return f"calls out over {transport} need {', '.join(f'{transport}.{name}' for name in missing)} set"

    async def place(self, transport: str, to: str, *, first_message: str | None, instructions: str | None,
                    placed: dict[str, Any], on_state: Callable[[str, str], None], ring_timeout_s: float,
                    screen: Screen | None = None) -> PlacedLine:
        """Take a call slot, ask the provider to ring `to`, and wait for the stream (a task). DialError
        when the server is full, or the provider refuses or cannot be reached (the slot is given back)."""
        runtime = self.runtime
        refused = await admit_call(runtime, runtime.settings.server.admission_wait_s)
        if refused is not None:
            raise DialError(503, refused.code, refused.message)
        line = PlacedLine(str(placed["id"]), secrets.token_urlsafe(24), transport,
                          f"{transport}_{uuid.uuid4().hex[:16]}", first_message, instructions, placed, on_state,
                          screen)
        runtime.open_session(line.session_id, transport)
        self.lines[line.id] = line
        try:
            if transport == "twilio":
                line.provider_id = await self._twilio(line, to, ring_timeout_s)
            else:
                line.provider_id = await self._telnyx(line, to, ring_timeout_s)
        except BaseException as exc:
            if not line.answered:
                self._drop(line)
                raise
            if not isinstance(exc, DialError):
                raise
            # its stream started while the request was out: the provider placed it after all
            log.warning("%s: the call was answered, though %s's API answered: %s", line.id, transport, exc)
            return line
        log.info("%s: %s placed the call to %s (%s)", line.id, transport, mask_number(to), line.provider_id)
        if not (line.answered or line.done):
            line.watch = self._spawn(self._watch(line, ring_timeout_s + runtime.settings.phone.answer_grace_s))
        return line

    def _spawn(self, job: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A task of a call placed out (its watch, a hang-up), kept until done: close() waits for them."""
        task = asyncio.create_task(job)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def _twilio(self, line: PlacedLine, to: str, ring_timeout_s: float) -> str:
        config = self.runtime.settings.twilio
        form: list[tuple[str, str]] = [
            ("To", to), ("From", config.caller_id),
            ("Twiml", twilio.twiml(twilio.stream_url(config.public_url), {PLACED: line.credential})),
            ("Timeout", str(round(ring_timeout_s))),
            ("StatusCallback", f"{config.public_url}{twilio.STATUS_PATH}?{PLACED}={line.id}"),
            ("StatusCallbackMethod", "POST"),
            *(("StatusCallbackEvent", event) for event in TWILIO_EVENTS),  # the one field that repeats
        ]
        body = await self._to_twilio("Calls.json", form)
        sid = body.get("sid")
        if not isinstance(sid, str) or not sid:
            raise DialError(502, "provider_error", f"twilio answered without a call sid: {str(body)[:200]}")
        return sid

    async def _telnyx(self, line: PlacedLine, to: str, ring_timeout_s: float) -> str:
        config = self.runtime.settings.telnyx
        stream = telnyx.stream_url(config.public_url, "").partition("?")[0] + f"?{PLACED}={line.credential}"
        command = {
            "connection_id": config.connection_id, "to": to, "from": config.caller_id,
            "timeout_secs": round(ring_timeout_s), "stream_url": stream, "stream_track": "inbound_track",
            "stream_bidirectional_mode": "rtp", "stream_bidirectional_codec": "PCMU",
            "client_state": base64.b64encode(line.id.encode()).decode()}  # names the call in its webhooks
        if config.public_key or not config.check_signatures:  # its webhooks come here, where they can be checked
            command |= {"webhook_url": f"{config.public_url}{telnyx.EVENTS_PATH}", "webhook_url_method": "POST"}
        body = await self._to_telnyx("calls", command)
        data = body.get("data")
        call_id = data.get("call_control_id") if isinstance(data, dict) else None
        if not isinstance(call_id, str) or not call_id:
            raise DialError(502, "provider_error", f"telnyx answered without a call_control_id: {str(body)[:200]}")
        return call_id

    async def _to_twilio(self, path: str, form: list[tuple[str, str]]) -> dict[str, Any]:
        """POST to the account's resource `path`: form-encoded, HTTP Basic with the SID and auth token."""
        config = self.runtime.settings.twilio
        return await self._post("twilio", f"{config.api_url}/2010-04-01/Accounts/{config.account_sid}/{path}",
                                content=urlencode(form), headers={"Content-Type": "application/x-www-form-urlencoded"},
                                auth=(config.account_sid, config.auth_token.get_secret_value()))

    async def _to_telnyx(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST JSON to /v2/`path` with the API key."""
        config = self.runtime.settings.telnyx
        return await self._post("telnyx", f"{config.api_url}/v2/{path}", json=payload,
                                headers={"Authorization": f"Bearer {config.api_key.get_secret_value()}"})

    async def _post(self, provider: str, url: str, **request: Any) -> dict[str, Any]:
        self.http = self.http or httpx.AsyncClient(follow_redirects=False)
        timeout = self.runtime.settings.phone.api_timeout_s
        try:
            response = await self.http.post(url, timeout=timeout, **request)
        except httpx.HTTPError as exc:
            raise DialError(502, "provider_unreachable",
                            f"{provider}'s API at {url.split('/')[2]} did not answer ({type(exc).__name__}: {exc}); "
                            f"check {provider}.api_url and the network") from None
        try:
            body = response.json()
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        if response.status_code >= 400:
            raise DialError(502, "provider_refused", f"{provider} refused the request: HTTP {response.status_code}: "
                            f"{_provider_error(body) or response.text[:200]}")
        return body

    # -- transfers ----------------------------------------------------------------------------------
    def can_transfer(self, provider: str) -> bool:
        """Whether calls on `provider` can be handed on (its REST API's credentials are set)."""
        if provider == "twilio":
            config = self.runtime.settings.twilio
            return bool(config.account_sid and config.auth_token.get_secret_value())
        return bool(self.runtime.settings.telnyx.api_key.get_secret_value())

    async def transfer(self, provider: str, call_id: str, destination: str) -> None:
        """Hand a call on (a cold transfer): Twilio's call is given new TwiML that dials `destination`
        (its media stream ends with that); Telnyx's `transfer` command. DialError if refused."""
        if provider == "twilio":
            await self._to_twilio(f"Calls/{quote(call_id, safe='')}.json", [("Twiml", twilio.dial_twiml(destination))])
        else:
            await self._to_telnyx(f"calls/{quote(call_id, safe='')}/actions/transfer", {"to": destination})

    # -- the stream ---------------------------------------------------------------------------------
    def waiting(self, credential: str | None) -> PlacedLine | None:
        """The ringing call this stream credential was made for (it stays waiting), or None."""
        ident, _, secret = (credential or "").partition(".")
        line = self.lines.get(ident)
        if line is None or line.answered or line.done or not hmac.compare_digest(secret.encode(), line.secret.encode()):
            return None
        return line

    def claim(self, credential: str | None, transport: str) -> PlacedLine | None:
        """The stream's `start`: the call it was placed as, once (a second stream gets None)."""
        line = self.waiting(credential)
        if line is None or line.transport != transport:
            return None
        line.answered = True
        if line.watch is not None:
            line.watch.cancel()
        line.on_state("answered", "")
        return line

    async def finish(self, line: PlacedLine, reason: str) -> None:
        """The call's stream has ended (its slot went back with the call): the provider's leg is
        hung up (unless the call was handed on), and the call is reported ended."""
        if line.done:
            return
        line.done = True
        self.lines.pop(line.id, None)
        self._ended(line.id)
        line.on_state("ended", reason)
        if reason not in ("transferred", "hangup"):
            await self._hang_up(line)

    def _ended(self, ident: str) -> None:
        self.ended[ident] = None
        while len(self.ended) > ENDED_KEPT:
            self.ended.popitem(last=False)

    def status(self, ident: str, call_status: str, detail: str) -> bool:
        """Twilio's status callback; False for a call this replica does not know."""
        line = self.lines.get(ident)
        if line is None:
            return ident in self.ended  # Twilio's `completed` comes after the stream's end
        if line.answered or line.done:
            return True  # the stream tells the rest
        if call_status == "ringing":
            line.on_state("ringing", detail)
        elif call_status in TWILIO_ENDED:
            self._fail(line, f"{call_status}{f' ({detail})' if detail else ''}")
        return True

    def telnyx_event(self, ident: str, call_id: str, event_type: str, payload: dict[str, Any]) -> bool:
        """A Telnyx webhook (its signature checked) about the call placed as `ident` (from its
        client_state), or failing that the one Telnyx calls `call_id`; False for a call this replica
        does not know. Before the stream starts, `call.hangup` (busy, no answer, rejected) ends the
        call with Telnyx's cause, and `streaming.failed` (Telnyx could not open the media stream)
        ends it and hangs it up; after, the stream tells the rest."""
        line = self.lines.get(ident) or next(
            (found for found in self.lines.values() if call_id and found.provider_id == call_id), None)
        if line is None:
            return ident in self.ended
        if line.answered or line.done or line.transport != "telnyx":
            return True
        if event_type == "call.hangup":
            cause, sip = payload.get("hangup_cause") or "hangup", payload.get("sip_hangup_cause")
            self._fail(line, f"{cause}{f' (SIP {sip})' if sip else ''}")
        elif event_type == "streaming.failed":
            log.warning("%s: telnyx could not open the media stream (%s): check telnyx.public_url", line.id,
                        payload.get("failure_reason") or "no reason given")
            self._fail(line, f"media stream failed: {payload.get('failure_reason') or 'no reason given'}")
            self._spawn(self._hang_up(line))
        return True

    async def _watch(self, line: PlacedLine, wait_s: float) -> None:
        """Give the call up when its stream has not started in `wait_s`, or the server drains (a
        draining server refuses the stream: the callee would answer into a closed line)."""
        draining = asyncio.ensure_future(self.runtime.draining.wait())
        try:
            await asyncio.wait_for(asyncio.shield(draining), wait_s)
        except TimeoutError:
            pass
        finally:
            draining.cancel()
        if line.answered or line.done:
            return
        if self.runtime.draining.is_set():
            log.info("%s: the server drains; the call placed out is cancelled", line.id)
            self._fail(line, "server_shutdown")
        else:
            log.warning("%s: no media stream from %s %.0f s after the call was placed: given up (not answered, or "
                        "%s could not reach %s.public_url)", line.id, line.transport, wait_s, line.transport,
                        line.transport)
            self._fail(line, f"no media stream within {wait_s:g} s")
        await self._hang_up(line)

    async def _hang_up(self, line: PlacedLine) -> None:
        """Best effort: the provider ends its leg of a call given up (still ringing) or whose stream
        ended. Twilio ends a call whose <Connect><Stream> ends by itself; a Telnyx call streams
        beside its call control, which must hang it up."""
        if not line.provider_id or (line.transport == "twilio" and line.answered):
            return
        ident = quote(line.provider_id, safe="")
        try:
            if line.transport == "twilio":  # "completed" ends it whatever its state ("canceled": ringing only)
                await self._to_twilio(f"Calls/{ident}.json", [("Status", "completed")])
            else:
                await self._to_telnyx(f"calls/{ident}/actions/hangup", {})
        except Exception as exc:  # best effort: logged, never raised into a call
            log.warning("%s: could not hang up its %s leg: %s", line.id, line.transport, exc)

    def _fail(self, line: PlacedLine, detail: str) -> None:
        self._drop(line)
        self._ended(line.id)
        line.done = True
        line.on_state("failed", detail)

    def _drop(self, line: PlacedLine) -> None:
        self.lines.pop(line.id, None)
        self.runtime.close_session(line.session_id)
        if line.watch is not None and line.watch is not asyncio.current_task():
            line.watch.cancel()

    async def close(self) -> None:
        """At shutdown: the calls still ringing are given up and cancelled, and every hang-up under
        way is waited for (up to phone.api_timeout_s) before the API client closes."""
        for line in list(self.lines.values()):
            if not line.answered and not line.done:
                self._fail(line, "server_shutdown")
                self._spawn(self._hang_up(line))
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=self.runtime.settings.phone.api_timeout_s + 1)
        for task in list(self.tasks):
            task.cancel()
        if self.http is not None:
            await self.http.aclose()


def _provider_error(body: dict[str, Any]) -> str:
    """Twilio's {"code", "message"} or Telnyx's {"errors": [{"code", "title", "detail"}]} as one line."""
    if "message" in body:
        return f"{body.get('code', '')} {body['message']}".strip()
    errors = body.get("errors")
    if isinstance(errors, list) and errors and isinstance(errors[0], dict):
        first = errors[0]
        return f"{first.get('code', '')} {first.get('title', '')}: {first.get('detail', '')}".strip()
    return ""
