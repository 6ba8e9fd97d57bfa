"""The speculation cap on the embedded engine itself (a tiny real model, not a fake's record of
calls): it reaches the running generation at its next step, and a barge-in lifts it."""

from __future__ import annotations

import asyncio

from core.clock import MonotonicClock
from models.llm.llm_embedded import EmbeddedConversation, EmbeddedLLM
from models.protocols import ChatMessage, GenerationDone, GenerationStats, SamplingParams, TextDelta
from models.speculative.decoder import SpecSession, SpeculativeStrategy
from pipeline.config import SessionConfig
from pipeline.events import ResponseDone
from pipeline.session import PipelineConfig
from tests.models.tiny import tiny_lm
from tests.pipeline.test_session import make_session, remade, speak

FLAT = [0.02] * 9  # verifying k tokens costs one step: drafting always pays


def speculative_llm() -> EmbeddedLLM:
    """A tiny target that drafts for itself (every draft accepted), with costs that make the
    controller draft: K > 0 unless capped."""
    target = tiny_lm(0, scale=3.0)
    target.stop_ids = frozenset()
    strategy = SpeculativeStrategy(target, MonotonicClock(), method="draft_model", draft=target,
                                   calibrate=False)
    for costs in strategy.costs.values():
        costs.verify = list(FLAT)
        costs.draft_step = 1e-5
        costs.smoothing = 0.0  # keep these costs whatever this machine measures
    return EmbeddedLLM(target, MonotonicClock(), strategy)


async def test_a_cap_reaches_the_running_generation_at_its_next_step() -> None:
    llm = speculative_llm()
    conversation = llm.conversation()
    stats = GenerationStats()
    deltas = 0
    async for out in conversation.stream([ChatMessage("user", "w3 w4 w5")],
                                         SamplingParams(temperature=0.0, max_tokens=80)):
        if isinstance(out, TextDelta):
            deltas += 1
            if deltas == 4:
                # four steps have run (the prefill, then three speculative steps); the generation
                # waits for us to ask for more
                conversation.set_speculation_cap(0)
        elif isinstance(out, GenerationDone):
            stats = out.stats
    await conversation.aclose()
    await llm.aclose()
    # k_chosen holds the steps after the prefill: three drafted freely, every later one capped
    assert all(k > 0 for k in stats.k_chosen[:3]), stats.k_chosen
    assert len(stats.k_chosen) > 3 and all(k == 0 for k in stats.k_chosen[3:]), stats.k_chosen
    assert stats.completion_tokens == 80


async def test_a_barge_in_lifts_the_cap_for_the_rest_of_the_call() -> None:
    llm = speculative_llm()
    session, out = make_session(llm, ["Tell me a story.", "Stop."])  # type: ignore[arg-type]
    endpointing = session.config.endpointing.model_copy(update={"text_signal": False})  # turns end on silence
    playout = SessionConfig(output_lead_ms=0, output_chunk_ms=20, speculation_relax_s=0.8, take_back_ms=0)
    session = remade(session, config=PipelineConfig(endpointing, session.config.asr, session.config.chunker, playout,
                                                    SamplingParams(temperature=0.7, max_tokens=120)))
    assert isinstance(session.conversation, EmbeddedConversation)
    decoding = session.conversation.decoding
    assert isinstance(decoding, SpecSession)

    def done() -> list[ResponseDone]:
        return [e for e in out.events if isinstance(e, ResponseDone)]

    task = asyncio.create_task(session.run())
    await speak(session, 0.5, True)
    await speak(session, 0.5, False)
    # 120 words of reply at 0.1 s each run far ahead of real-time playback: the engine is capped
    await out.wait(lambda: decoding.controllers.get("draft_model") is not None
                   and decoding.controllers["draft_model"].cap == 0, timeout=15)
    await speak(session, 0.3, True)  # the caller interrupts
    await out.wait(lambda: len(done()) == 1, timeout=10)
    assert done()[0].status == "interrupted"
    assert decoding.cap is None and decoding.controllers["draft_model"].cap is None

    await speak(session, 0.4, False)
    await out.wait(lambda: len(done()) == 2, timeout=30)
    second = done()[1].stats
    assert second is not None and max(second.k_chosen[:5]) > 0, second.k_chosen  # drafting again
    await session.audio_in.put(None)
    await task
    await llm.aclose()
