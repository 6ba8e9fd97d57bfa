"""Warm transfers on SIP (docs/sip.md#warm-transfers): the person a call is handed to is called
first, on a second dialog of the server's (a leg), and hears who is calling and why before the two
calls are joined. The server stays in the media path: each side's audio is relayed to the other's
RTP track until one side hangs up or its RTP stops. That works with every trunk and phone (no
REFER with Replaces, no re-INVITE), at the cost of one relay per joined call on this server.

The steps, from the transfer_call tool (pipeline/tools.py) to the end of the call:
1. `SipCall.consult`: dial the person (tools.transfer_ring_timeout_s); on their answer, say
   tools.warm_transfer_message with the model's summary to them. The caller waits on the line;
   if the person does not answer, the model is told so and the call goes on.
2. The agent's reply after the tool is heard by the caller; then `SipCall.transfer` joins the calls
   (`bridge`) instead of sending a REFER.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.transports.sip.rtp import SAMPLE_RATE, RtpSession
from models.protocols import Audio
from pipeline.audio import float_to_pcm16, resample
from pipeline.config import TrimConfig
from pipeline.session import Backends
from pipeline.tools import ToolFailed
from pipeline.trim import trim_phrase

log = logging.getLogger(__name__)
PREFILL_S = 0.04  # the relay's jitter buffer: each side's audio starts this far behind
# what the caller hears while the person is called and told: a ringback tone (440 + 480 Hz, 2 s on, 4 s off,
# the North American cadence), quiet (-24 dBFS), 100 ms at a time
RINGBACK_HZ, RINGBACK_ON_S, RINGBACK_OFF_S, RINGBACK_LEVEL = (440, 480), 2.0, 4.0, 0.063
RINGBACK_CHUNK_S = 0.1
RINGBACK_AFTER_S = 0.4  # the agent quiet this long first (longer than the pauses between its phrases)
RINGBACK_TURN = -1  # the track counts it as no turn's: no reply's "heard" moves with it
MAX_BEHIND_S = 0.3  # a relay further behind than this (a peer's clock runs fast) drops its backlog


@dataclass
class Leg:
    """A warm transfer's call to the person: from their answer until the calls are joined (or it ends)."""

    name: str  # the transfer target's name
    destination: str  # as tools.transfer_targets has it
    dialog: Any
    media: RtpSession
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # the person hung up


async def ignore(*_: Any) -> None:
    """What a leg's person says or keys before the join, and keys on a joined call: nothing."""


async def first_of(*waits: Coroutine[Any, Any, Any]) -> int:
    """Which of `waits` ends first (its index); the others are cancelled."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        return next(i for i, task in enumerate(tasks) if task in done)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def announce(leg: Leg, backends: Backends, trim: TrimConfig, text: str) -> None:
    """Say `text` to the person (the synthesizer's padding trimmed as in replies) and wait until it
    has all gone out as RTP. ToolFailed if they hang up meanwhile."""
    tts = backends.tts
    chunks = await backends.tts_worker.run(lambda: list(tts.synthesize(text)))
    resampled = (resample(np.asarray(chunk, dtype=np.float32), tts.sample_rate, SAMPLE_RATE) for chunk in chunks)
    for audio in trim_phrase(resampled, SAMPLE_RATE, text, trim):
        leg.media.track.push(float_to_pcm16(audio), 0)
    track = leg.media.track
    await first_of(track.drained.wait(), leg.ended.wait(), track.clock.sleep(track.queued / SAMPLE_RATE + 5))
    if leg.ended.is_set():
        raise ToolFailed(f"{leg.name} answered but hung up before the call could be put through")


def ringback_cycle() -> bytes:
    """One cadence of the ringback tone, 16-bit PCM at the line's rate."""
    on = np.arange(int(RINGBACK_ON_S * SAMPLE_RATE)) / SAMPLE_RATE
    tone = sum(np.sin(2 * np.pi * hz * on) for hz in RINGBACK_HZ) * (RINGBACK_LEVEL / len(RINGBACK_HZ))
    return float_to_pcm16(np.concatenate([tone, np.zeros(int(RINGBACK_OFF_S * SAMPLE_RATE))]).astype(np.float32))


def _agent_sent(track: Any) -> int:
    """The samples of every turn but the ringback's that the track has sent."""
    return sum(count for turn, count in track.sent.items() if turn != RINGBACK_TURN)


async def ringback(track: Any, stop: asyncio.Event) -> None:
    """The caller's ringback until `stop`: it starts, and starts again, only once the agent has been
    quiet for RINGBACK_AFTER_S (no tone between two of its phrases), and a chunk goes out only when
    nothing else waits to be sent, so the agent's next words are held back 100 ms at most."""
    cycle, chunk = ringback_cycle(), int(RINGBACK_CHUNK_S * SAMPLE_RATE) * 2
    at, heard = 0, -1
    while True:
        if await first_of(stop.wait(), track.drained.wait()) == 0 or track.readyState != "live":
            return
        spoken = _agent_sent(track)
        if spoken != heard:  # the agent spoke since (or it is the start): ring after a pause of its own
            heard = spoken
            if await first_of(stop.wait(), track.clock.sleep(RINGBACK_AFTER_S)) == 0:
                return
            continue
        track.push(cycle[at:at + chunk], RINGBACK_TURN)
        at = (at + chunk) % len(cycle)


def relay(track: Any) -> Any:
    """The audio of one side, onto the other side's reply track, a jitter buffer's worth behind."""
    started = False
    silence = float_to_pcm16(np.zeros(int(PREFILL_S * SAMPLE_RATE), dtype=np.float32))

    async def to_track(samples: Audio) -> None:
        nonlocal started
        if not started:
            track.push(silence, 0)
            started = True
        elif track.queued > MAX_BEHIND_S * SAMPLE_RATE:
            track.clear()
            track.push(silence, 0)
        track.push(float_to_pcm16(samples), 0)

    return to_track


async def bridge(caller: RtpSession, caller_gone: asyncio.Event, leg: Leg, rtp_timeout_s: float, label: str) -> str:
    """Join the caller and the person until one of them hangs up or sends no RTP for
    `rtp_timeout_s`: which side ended it ("caller", "person", "caller's media", "person's media")."""
    caller.on_audio, caller.on_key = relay(leg.media.track), ignore
    leg.media.on_audio, leg.media.on_key = relay(caller.track), ignore
    log.info("%s: joined to %s: relaying the audio both ways", label, leg.name)
    clock = caller.clock
    while True:
        ended = await first_of(caller_gone.wait(), leg.ended.wait(), clock.sleep(1.0))
        if ended < 2:
            return ("caller", "person")[ended]
        now = clock.now()
        for side, media in (("caller's media", caller), ("person's media", leg.media)):
            if now - media.last_packet_at >= rtp_timeout_s:
                return side
