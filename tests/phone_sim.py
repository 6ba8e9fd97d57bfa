"""A phone line, for the tests and the benchmarks: it speaks Twilio's Media Streams protocol (or
Telnyx's, `provider="telnyx"`) to the server over a real WebSocket, as the provider would.

The caller's mouth: `connect()` sends `connected` and `start`; from then on one 20 ms mu-law
`media` frame leaves every 20 ms in real time, speech queued by `say()` or silence (a phone line
never stops sending). `dtmf()` presses a key; `hangup()` sends `stop` and closes; `drop()` closes
without `stop`.

The caller's ear: reply `media` is played by a playback clock at 8 kHz, in real time. A `mark` is
echoed once all audio received before it has played; a `clear` drops the audio not yet played and
echoes the pending marks at once (what Twilio does).

It records every frame received with its arrival time (`received`), the audio actually played
(`played_audio()`, and `playback_starts`: when playback began after silence), the marks echoed
(`marks`) and when each `clear` came (`clears`). Times are time.monotonic(). A phone line carries no
text: what the server made of the call (transcripts, replies, latency marks) is in its log,
`call_records()`.

    sim = await dial(server.base_url, server.ws_base, PUBLIC_URL, TOKEN)   # webhook, TwiML, signed socket
    spoke_until = await sim.say(speech_samples("What is the capital of France?", tmp, 8000))
    first = await sim.wait_for(lambda r: r.event["event"] == "media", 60)
    voice_to_voice = first.at - spoke_until
"""

from __future__ import annotations

import ast
import asyncio
import base64
import contextlib
import itertools
import json
import time
import uuid
import xml.etree.ElementTree as ET
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
import numpy as np
from twilio.request_validator import RequestValidator
from websockets.exceptions import ConnectionClosed

from pipeline.audio import float_to_mulaw, mulaw_to_pcm16, resample

RATE = 8000
FRAME = RATE // 50  # 20 ms
SILENCE = b"\xff" * FRAME  # mu-law zero


@dataclass
class Received:
    at: float
    event: dict[str, Any]


@dataclass
class EchoedMark:
    at: float
    name: str
    played: bool  # False: returned at once by a clear, its audio never played


def twilio_signature(auth_token: str, url: str, params: dict[str, str] | None = None) -> str:
    """X-Twilio-Signature as Twilio computes it, with its own package."""
    signature: str = RequestValidator(auth_token).compute_signature(url, params or {})
    return signature


def call_records(server_log: str, call_id: str, kind: Literal["response.done", "caller"] = "response.done",
                 ) -> list[dict[str, Any]]:
    """What the server logged of a phone call, in order: each turn's `response.done` (the native wire
    form: status, the text kept in the history, latency marks), or each turn of the caller's
    ({"turn_id", "text"}: the final transcript, or the keys pressed)."""
    found = []
    for line in server_log.splitlines():
        head, _, rest = line.partition(f"{call_id}: ")
        if not head or not rest:
            continue
        if kind == "response.done" and rest.startswith("response.done "):
            found.append(json.loads(rest.removeprefix("response.done ")))
        elif kind == "caller" and rest.startswith("turn ") and ": caller: " in rest:
            turn, _, text = rest.removeprefix("turn ").partition(": caller: ")
            found.append({"turn_id": int(turn), "text": ast.literal_eval(text)})
    return found


def parse_twiml(text: str) -> tuple[str, dict[str, str]]:
    """(the Stream url, its Parameters) from a <Connect><Stream> TwiML answer."""
    stream = ET.fromstring(text).find("./Connect/Stream")
    if stream is None:
        raise ValueError(f"no <Connect><Stream> in {text!r}")
    return stream.attrib["url"], {p.attrib["name"]: p.attrib["value"] for p in stream.findall("Parameter")}


async def twilio_webhook(base_url: str, public_url: str, auth_token: str | None, params: dict[str, str],
                         signature: str | None = None) -> httpx.Response:
    """POST the voice webhook as Twilio does, signed over the public URL (unless `signature` is given)."""
    headers = {}
    if signature is not None:
        headers["X-Twilio-Signature"] = signature
    elif auth_token is not None:
        headers["X-Twilio-Signature"] = twilio_signature(auth_token, public_url.rstrip("/") + "/twilio/voice", params)
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(base_url + "/twilio/voice", data=params, headers=headers)


async def dial(base_url: str, ws_base: str, public_url: str, auth_token: str, caller: str = "+15550001111",
               callee: str = "+15550002222", start: bool = True) -> PhoneSim:
    """A Twilio call from the start: the signed webhook, its TwiML, then the media socket it names,
    reached at `ws_base` (as through a proxy) and signed over the public URL Twilio would call. Its
    `start` hands back the TwiML's <Parameter>s (the one-use nonce among them); `start` False opens
    the socket only (`begin()` starts the call)."""
    call_sid = "CA" + uuid.uuid4().hex
    response = await twilio_webhook(base_url, public_url, auth_token, {"CallSid": call_sid, "From": caller,
                                                                       "To": callee, "AccountSid": "AC" + "0" * 32})
    response.raise_for_status()
    url, parameters = parse_twiml(response.text)
    sim = PhoneSim(ws_base + urlsplit(url).path, auth_token=auth_token, signed_url=url, parameters=parameters,
                   call_sid=call_sid)
    await sim.connect(start=start)
    return sim


@dataclass
class PhoneSim:
    url: str  # the socket to open
    provider: Literal["twilio", "telnyx"] = "twilio"
    auth_token: str | None = None  # Twilio: sign the upgrade with it ...
    signed_url: str | None = None  # ... over this URL (the public wss URL; default: `url`)
    stream_token: str | None = None  # Telnyx: put it in the URL's query
    parameters: dict[str, str] = field(default_factory=dict)  # customParameters in `start`
    call_sid: str = field(default_factory=lambda: "CA" + uuid.uuid4().hex)
    stream_sid: str = field(default_factory=lambda: "MZ" + uuid.uuid4().hex)
    received: list[Received] = field(default_factory=list)
    marks: list[EchoedMark] = field(default_factory=list)
    clears: list[float] = field(default_factory=list)
    playback_starts: list[float] = field(default_factory=list)
    closed: bool = False
    closed_at: float | None = None  # time.monotonic() when the socket closed
    malformed: Exception | None = None  # what went wrong reading a frame the server sent (raised by wait_until)

    def __post_init__(self) -> None:
        self._ws: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._send_lock = asyncio.Lock()
        self._sequence = itertools.count(1)
        self._speech: deque[bytes] = deque()  # mu-law frames to say
        self._spoken = asyncio.Event()  # set when the queued speech has gone out
        self._spoken_at = 0.0
        self._playout: deque[np.ndarray | str] = deque()  # received audio (int16) and marks, in order
        self._played: list[tuple[float, np.ndarray]] = []  # (when, samples) per 20 ms of playback
        self._playing = False
        self._changed = asyncio.Event()

    # -- the line ---------------------------------------------------------------------------------
    async def connect(self, headers: dict[str, str] | None = None, start: bool = True) -> None:
        """Open the socket (a refused upgrade raises websockets' InvalidStatus) and, unless `start` is
        False, start the call (`begin`)."""
        import websockets

        url = self.url
        extra = dict(headers or {})
        if self.provider == "twilio" and self.auth_token is not None:
            extra.setdefault("X-Twilio-Signature", twilio_signature(self.auth_token, self.signed_url or url))
        if self.provider == "telnyx" and self.stream_token is not None:
            url += ("&" if "?" in url else "?") + "token=" + self.stream_token
        self._ws = await websockets.connect(url, additional_headers=extra, max_size=None)
        self._tasks = [asyncio.create_task(self._read())]
        if start:
            await self.begin()

    async def begin(self) -> None:
        """`connected` and `start`; then the line sends audio and the ear plays what comes back."""
        await self.send(self._connected())
        await self.send(self._start())
        self._tasks += [asyncio.create_task(self._line()), asyncio.create_task(self._playback())]

    async def send(self, frame: dict[str, Any] | str | bytes) -> None:
        """Send a frame as is (dicts as JSON): also for the tests' malformed ones."""
        data = json.dumps(frame) if isinstance(frame, dict) else frame
        async with self._send_lock:
            await self._ws.send(data)

    async def say(self, samples: np.ndarray, rate: int = RATE) -> float:
        """Speak int16 (or float) samples into the line in real time; returns the time the last of
        them went out (the true end of the caller's speech)."""
        audio = samples.astype(np.float32) / (32768.0 if samples.dtype == np.int16 else 1.0)
        mulaw = float_to_mulaw(resample(audio, rate, RATE))
        self._speech.extend(mulaw[i:i + FRAME] for i in range(0, len(mulaw), FRAME))
        self._spoken.clear()
        await self._spoken.wait()
        return self._spoken_at

    async def dtmf(self, digit: str) -> None:
        body = {"track": "inbound_track", "digit": digit} if self.provider == "twilio" else {"digit": digit}
        await self.send(self._frame("dtmf", dtmf=body))

    async def hangup(self) -> None:
        """`stop`, then close, as the provider does when the caller hangs up."""
        with contextlib.suppress(Exception):
            await self.send(self._frame("stop", stop=self._call_ids()))
        await self.drop()

    async def drop(self) -> None:
        """Close the socket without `stop` (a dropped connection)."""
        for task in self._tasks[1:]:
            task.cancel()
        with contextlib.suppress(Exception):
            await self._ws.close()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(self._tasks[0], 5)
        self.closed = True

    @property
    def close_code(self) -> int | None:
        code: int | None = getattr(self._ws, "close_code", None)
        return code

    async def _line(self) -> None:
        """One media frame every 20 ms: speech if queued, else silence."""
        chunk = itertools.count(1)
        start = time.monotonic()
        for n in itertools.count():
            start = await _tick(start, n)
            speaking = bool(self._speech)
            payload = self._speech.popleft() if speaking else SILENCE
            k = next(chunk)
            media = {"track": "inbound", "chunk": str(k), "timestamp": str(k * 20),
                     "payload": _b64(payload)}
            try:
                await self.send(self._frame("media", media=media))
            except Exception:
                return
            if speaking and not self._speech:
                self._spoken_at = time.monotonic()
                self._spoken.set()

    # -- the ear ----------------------------------------------------------------------------------
    async def _read(self) -> None:
        try:
            async for message in self._ws:
                now = time.monotonic()
                if isinstance(message, bytes):
                    self.received.append(Received(now, {"event": "<binary>", "bytes": len(message)}))
                    continue
                event = json.loads(message)
                self.received.append(Received(now, event))
                kind = event.get("event")
                if kind == "media":
                    pcm = mulaw_to_pcm16(_unb64(event["media"]["payload"]))
                    self._playout.append(np.frombuffer(pcm, dtype="<i2").copy())
                elif kind == "mark":
                    self._playout.append(event["mark"]["name"])
                elif kind == "clear":
                    self.clears.append(now)
                    pending = [item for item in self._playout if isinstance(item, str)]
                    self._playout.clear()
                    for name in pending:
                        await self._echo(name, played=False)
                self._changed.set()
        except ConnectionClosed:  # callers see it through `closed`
            pass
        except Exception as exc:  # a frame a Twilio or Telnyx client could not read: the server's bug
            self.malformed = exc
        finally:
            self.closed = True
            self.closed_at = time.monotonic()
            self._changed.set()
            for task in self._tasks[1:]:  # the line and the ear stop with the socket
                task.cancel()

    async def _playback(self) -> None:
        """The playback clock: every 20 ms, first echo the marks whose audio has played, then play the
        next 20 ms of received audio."""
        start = time.monotonic()
        for n in itertools.count():
            start = await _tick(start, n)
            now = time.monotonic()
            while self._playout and isinstance(self._playout[0], str):
                await self._echo(str(self._playout.popleft()), played=True)
            need, pieces = FRAME, []
            while need and self._playout and not isinstance(self._playout[0], str):
                head = self._playout[0]
                assert isinstance(head, np.ndarray)
                pieces.append(head[:need])
                need -= len(pieces[-1])
                if len(head) > len(pieces[-1]):
                    self._playout[0] = head[len(pieces[-1]):]
                else:
                    self._playout.popleft()
            if pieces:
                if not self._playing:
                    self.playback_starts.append(now)
                self._played.append((now, np.concatenate(pieces)))
                self._changed.set()
            self._playing = bool(pieces)

    async def _echo(self, name: str, played: bool) -> None:
        self.marks.append(EchoedMark(time.monotonic(), name, played))
        self._changed.set()
        with contextlib.suppress(Exception):
            await self.send(self._frame("mark", mark={"name": name}))

    # -- what happened ----------------------------------------------------------------------------
    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [r.event for r in self.received if kind is None or r.event.get("event") == kind]

    def played_audio(self, since: float = 0.0, until: float = float("inf")) -> np.ndarray:
        """The int16 audio played between two times."""
        pieces = [samples for at, samples in self._played if since <= at < until]
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int16)

    def received_audio(self, since: float = 0.0, until: float = float("inf")) -> np.ndarray:
        """The int16 audio that arrived between two times (played or not)."""
        pieces = [np.frombuffer(mulaw_to_pcm16(_unb64(r.event["media"]["payload"])), dtype="<i2")
                  for r in self.received if r.event.get("event") == "media" and since <= r.at < until]
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int16)

    def heard_everything(self) -> bool:
        """Whether all reply audio received so far has played and every mark has been echoed."""
        return not self._playout and len(self.marks) == len(self.events("mark"))

    def first_media_after(self, at: float) -> float | None:
        """When the first reply audio arrived after `at` (voice to voice: this minus the end of speech)."""
        return next((r.at for r in self.received if r.at > at and r.event.get("event") == "media"), None)

    async def wait_for(self, predicate: Callable[[Received], bool], timeout: float, after: int = 0) -> Received:
        """The first frame received (from index `after`) that matches; TimeoutError if none comes."""
        found: list[Received] = []

        def matched() -> bool:
            found[:] = [r for r in self.received[after:] if predicate(r)][:1]
            return bool(found)

        await self.wait_until(matched, timeout)
        return found[0]

    async def wait_until(self, condition: Callable[[], bool], timeout: float) -> None:
        """Wait until `condition()` holds (checked whenever anything is received or played)."""
        deadline = time.monotonic() + timeout
        while not condition():
            if self.malformed is not None:
                raise AssertionError(f"the server sent a frame the phone could not read: {self.malformed!r}")
            if self.closed and not condition():
                raise ConnectionError(f"the server closed the call (code {self.close_code})")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the condition did not come true in time")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 0.5))

    # -- frames -----------------------------------------------------------------------------------
    def _frame(self, event: str, **body: Any) -> dict[str, Any]:
        if self.provider == "twilio":
            return {"event": event, "sequenceNumber": str(next(self._sequence)), "streamSid": self.stream_sid, **body}
        return {"event": event, "sequence_number": str(next(self._sequence)), "stream_id": self.stream_sid, **body}

    def _connected(self) -> dict[str, Any]:
        if self.provider == "twilio":
            return {"event": "connected", "protocol": "Call", "version": "1.0.0"}
        return {"event": "connected", "version": "1.0.0"}

    def _start(self) -> dict[str, Any]:
        if self.provider == "twilio":
            return self._frame("start", start={
                "streamSid": self.stream_sid, "accountSid": "AC" + "0" * 32, "callSid": self.call_sid,
                "tracks": ["inbound"], "customParameters": self.parameters,
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": RATE, "channels": 1}})
        return self._frame("start", start={
            "user_id": str(uuid.uuid4()), "call_control_id": self.call_sid, "call_session_id": str(uuid.uuid4()),
            "from": "+15550001111", "to": "+15550002222", "custom_parameters": self.parameters,
            "media_format": {"encoding": "PCMU", "sample_rate": RATE, "channels": 1}})

    def _call_ids(self) -> dict[str, str]:
        if self.provider == "twilio":
            return {"accountSid": "AC" + "0" * 32, "callSid": self.call_sid}
        return {"call_control_id": self.call_sid}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


async def _tick(start: float, n: int) -> float:
    """Sleep until 20 ms tick `n` of a clock started at `start`; returns the clock's start, moved
    forward if the process stalled more than 100 ms (real time goes on from now, no burst)."""
    delay = start + n * 0.02 - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    elif delay < -0.1:
        start = time.monotonic() - n * 0.02
    return start
