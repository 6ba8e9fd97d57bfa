"""A call placed out with answering-machine detection (docs/sip.md#answering-machines), over SIP or a
phone provider's stream: the callee's first seconds go to the detector
(app/transports/answering_machine.py), not to the session, so a machine's greeting is never
answered. Then:

- a person (or nobody speaking for `silence_s`): the first message, and the call goes on;
- a machine, `hang_up`: the call is hung up (`end_reason` "answering_machine");
- a machine, `leave_message`: once its greeting is over (the beep ended, or it fell silent; at most
  `MAX_GREETING_S`), the message is said as is, and the call is hung up once it has gone out
  (`end_reason` "voicemail_left").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from app.transports.answering_machine import MachineDetection, Screening, Verdict
from app.transports.call import Call

log = logging.getLogger(__name__)
MAX_GREETING_S = 30.0  # a machine's greeting (and beep) longer than this: the message begins anyway
NO_AUDIO_S = 10.0  # no audio at all from the callee this long: taken for a person


class Screen:
    def __init__(self, backends: object, config: MachineDetection, action: str, message: str | None,
                 on_verdict: Callable[[Verdict], None]) -> None:
        self.screening = Screening(backends, config)
        self.action = action  # "hang_up" or "leave_message"
        self.message = message
        self.on_verdict = on_verdict

    def lets_through(self) -> bool:
        """Whether the callee's audio goes to the session: once a person was heard."""
        verdict = self.screening.verdict
        return verdict is not None and verdict.kind == "human"

    async def open(self, call: Call, first_message: str | None, sent: Callable[[], Awaitable[None]]) -> None:
        """Wait for the verdict, then open the call as it says. `sent`: returns once the audio handed
        to the line has gone out to the callee (the voicemail message is not cut off by the hang-up)."""
        label = call.label
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.screening.decided.wait(), NO_AUDIO_S)
        verdict = self.screening.verdict
        if verdict is None:
            verdict = Verdict("human", NO_AUDIO_S, "no audio")
            self.screening.decide(verdict)
        log.info("%s: answered by a %s (%s, decided %.2f s after the answer)", label, verdict.kind, verdict.why,
                 verdict.at_s)
        self.on_verdict(verdict)
        session = call.session
        if session is None:
            return
        if verdict.kind == "human":
            if first_message:
                await session.say(first_message)
            return
        if self.action == "hang_up" or not self.message:
            call.hang_up("answering_machine")
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.screening.greeting_over.wait(), MAX_GREETING_S)
        log.info("%s: the machine's greeting is over; leaving the message", label)
        await session.say(self.message)
        if session.reply is not None:
            await session.reply.ended.wait()
        await sent()
        await asyncio.sleep(0.3)  # the last packet's way to the machine
        call.hang_up("voicemail_left")
