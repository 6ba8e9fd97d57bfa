"""Each injected fault (tests/app/fault_scenarios.py): the caller hears an apology or gets a clean
error, the server stays up, the next turn is answered right, and the call's records are intact."""

from __future__ import annotations

import asyncio

import pytest

from tests.app.fault_scenarios import FAULTS, GOOD_REPLY, READ_TIMEOUT_S, Fault, run_fault


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
async def test_a_fault_gets_an_apology_or_a_clean_error_and_the_call_goes_on(fault: Fault) -> None:
    out = await asyncio.wait_for(run_fault(fault), 60)
    assert out.server_up
    assert out.next_reply == GOOD_REPLY  # the next turn (or the next caller) is answered right
    assert not out.notes, out.notes
    if fault.expect == "apology":  # an error event, and the apology's audio right after it
        assert out.error_code == "llm_unavailable" and out.first_status == "failed"
        assert out.first_audio_s is not None and out.error_s is not None
        assert out.first_audio_s - out.error_s < 0.5
        assert out.error_s < 2 * READ_TIMEOUT_S + 1.0  # a stall: timed out, retried once, then apologized
    elif fault.expect == "error":
        assert out.error_code in ("llm_unavailable", "engine_error")
        assert out.error_s is not None and out.error_s < READ_TIMEOUT_S + 1.0
    elif fault.expect == "slow_reply":
        assert out.error_code is None and out.first_status == "completed"
    else:  # the caller left: their call ended, its slot was freed, and the turn they heard part of is kept
        assert out.ended_s is not None and out.ended_s < 3.0
        assert out.end_reason in ("client_closed", "caller_stopped_reading")
        assert out.kept_turns == 1
    if not fault.caller:
        assert out.kept_turns == out.sent_turns  # every turn the caller was told of is in the store
