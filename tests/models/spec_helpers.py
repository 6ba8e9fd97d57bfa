"""Running the embedded decoding loop directly (no server) for the speculative-decoding tests."""

from __future__ import annotations

from models.llm.generation import GenerationLoop
from models.llm.lm import CausalLM, LMState
from models.protocols import GenerationStats, SamplingParams, Speculation
from models.speculative.decoder import SpecSession, SpeculativeStrategy


def generate(strategy: SpeculativeStrategy, prompt: list[int], params: SamplingParams,
             session: SpecSession | None = None,
             state: LMState | None = None) -> tuple[list[int], GenerationStats, LMState]:
    session = session or strategy.new_session()
    state = state or strategy.lm.new_state()
    stats = GenerationStats()
    loop = GenerationLoop(strategy.lm, session.decoder(state, params, stats), prompt, params, stats)
    while not loop.done:
        loop.step()
    return loop.produced, stats, state


def params(method: str, temperature: float = 0.0, k: int | None = None, max_tokens: int = 32,
           seed: int | None = 0, top_p: float = 1.0, top_k: int = 0) -> SamplingParams:
    return SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens, seed=seed,
                          speculation=Speculation(method, k))


def prompt_of(lm: CausalLM, text: str) -> list[int]:
    return lm.chat_tokens([{"role": "user", "content": text}])
