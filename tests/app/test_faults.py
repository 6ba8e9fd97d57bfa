"""Each injected fault (tests/app/fault_scenarios.py): the caller hears an apology or gets a clean
error, the server stays up, the next turn is answered right, and the call's records are intact."""

from __future__ import annotations

import asyncio
import logging

import pytest

from core.errors import plain_message
from tests.app.fault_scenarios import FAULTS, GOOD_REPLY, Fault, run_fault


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
async def test_a_fault_gets_an_apology_or_a_clean_error_and_the_call_goes_on(fault: Fault) -> None:
    out = await asyncio.wait_for(run_fault(fault), 60)
    assert out.server_up
    assert out.next_reply == GOOD_REPLY  # the next turn (or the next caller) is answered right
    assert not out.notes, out.notes
    if fault.expect == "apology":  # an error event, then the apology's audio, then the failed turn's end
        assert out.error_code == "llm_unavailable" and out.first_status == "failed"
        order = [kind for kind in out.order if kind in ("error", "audio", "response.done")]
        assert order[0] == "error" and order[1] == "audio" and "response.done" in order, order
        assert out.attempts == 2  # tried, retried once before the first token, then apologized
    elif fault.expect == "error":
        assert out.error_code in ("llm_unavailable", "engine_error")
        assert out.attempts <= 1  # after words were sent nothing is retried
    elif fault.expect == "slow_reply":
        assert out.error_code is None and out.first_status == "completed"
    else:  # the caller left: their call ended (wait_for above), its slot was freed, and the heard turn is kept
        assert out.end_reason in ("client_closed", "caller_stopped_reading")
        assert out.kept_turns == 1
    if not fault.caller:
        assert out.kept_turns == out.sent_turns  # every turn the caller was told of is in the store


INSIDES = ["llm_refuses", "llm_stalls_before_first_token", "llm_stalls_mid_reply", "llm_500", "tts_raises"]


@pytest.mark.parametrize("fault", [f for f in FAULTS if f.name in INSIDES], ids=INSIDES)
async def test_the_caller_is_told_a_code_and_a_plain_message_the_detail_goes_to_the_log_and_the_record(
        fault: Fault, caplog: pytest.LogCaptureFixture) -> None:
    """The engine's error names the LLM server's URL, or carries its exception's text: the caller's
    error event says the code and what to do; the log and the call's record keep the detail."""
    caplog.set_level(logging.INFO)
    out = await asyncio.wait_for(run_fault(fault), 60)
    detail = "(injected)" if fault.name in ("llm_500", "tts_raises") else out.llm_url
    assert out.error_code is not None and out.error_message, out
    assert detail not in out.error_message and "http://" not in out.error_message, out.error_message
    assert out.error_message == f"the reply failed: {plain_message(out.error_code)}"
    assert any(detail in error for error in out.stored_errors), out.stored_errors
    assert detail in caplog.text
