"""The honesty gate (pipeline/honesty.py) on a fake judge (it answers set chances of "yes" and "no"), and
in a session on fake engines: a reply to a request the agent cannot check begins with the opening."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from models.protocols import ChatMessage, SamplingParams
from pipeline import honesty
from pipeline.config import AsrStageConfig, ChunkerConfig, EndpointingConfig, HonestyConfig
from pipeline.events import ReplyText
from pipeline.facts import with_facts
from pipeline.session import Backends, PipelineConfig, Session
from tests.pipeline.fakes import DistantClock, FakeLLM, FakeRecognizer, FakeSynthesizer, FakeVad, RecordingOutbound
from tests.pipeline.test_session import done_events, speak, whole

DEFAULT = "Be kind."


class FakeJudge:
    """A fake judging model: the chance of "no" (the assistant could not answer) for words that
    contain a key of `no`, 0.05 otherwise; every question asked is kept."""

    def __init__(self, no: dict[str, float]) -> None:
        self.no = no
        self.asked: list[tuple[ChatMessage, ...]] = []

    async def next_word_probabilities(self, messages: Sequence[ChatMessage], words: Sequence[str]) -> list[float]:
        self.asked.append(tuple(messages))
        request = messages[-1].content
        chance = next((p for key, p in self.no.items() if key in request), 0.05)
        assert tuple(words) == (*honesty.YES, *honesty.NO)
        return [0.6 * (1 - chance), 0.2 * (1 - chance), 0.6 * chance, 0.2 * chance]  # sums to 0.8: others 0.2


class ToldJudge(FakeJudge):
    """A fake judge whose chance of "no" is `told` when its question tells it `text`, `alone` otherwise."""

    def __init__(self, text: str, alone: float, told: float) -> None:
        super().__init__({})
        self.text, self.alone, self.told = text, alone, told

    async def next_word_probabilities(self, messages: Sequence[ChatMessage], words: Sequence[str]) -> list[float]:
        self.asked.append(tuple(messages))
        chance = self.told if self.text in messages[-1].content else self.alone
        return [1 - chance, 0.0, chance, 0.0]


def prompt(system: str, *said: str) -> tuple[ChatMessage, ...]:
    return (ChatMessage("system", system), *(ChatMessage("user", s) for s in said))


async def test_a_request_judged_past_the_threshold_gets_the_opening_and_one_below_does_not() -> None:
    judge = FakeJudge({"pharmacy": 0.9, "capital": 0.2})
    config = HonestyConfig(threshold=0.7, opening="Sorry, I'm not able to")
    asked = prompt(DEFAULT, "When does the pharmacy close?")
    gated, chance = await honesty.checked(judge, config, asked, DEFAULT)
    assert abs(chance - 0.9) < 1e-9  # P(no) / (P(yes) + P(no)), whatever else the model might say
    assert gated[:-1] == asked and gated[-1] == ChatMessage("assistant", "Sorry, I'm not able to", unfinished=True)
    plain = prompt(DEFAULT, "What is the capital of France?")
    kept, chance = await honesty.checked(judge, config, plain, DEFAULT)
    assert kept is plain and abs(chance - 0.2) < 1e-9
    at = await honesty.checked(FakeJudge({"capital": 0.5}), HonestyConfig(threshold=0.5), plain, DEFAULT)
    assert at[0][-1].unfinished  # the threshold itself gates


async def test_the_earlier_words_can_show_the_agent_can_answer_but_never_that_it_cannot() -> None:
    """Asked alone first; with the caller's earlier words only where alone it reaches the threshold, and
    the lower chance counts."""
    judge = FakeJudge({"Earlier the caller said: My order": 0.1, "What was it again?": 0.9})
    config = HonestyConfig(threshold=0.6)
    asked = prompt(DEFAULT, "My order number is 4 5 2 1.", "What was it again?")
    kept, chance = await honesty.checked(judge, config, asked, DEFAULT)
    assert kept is asked and abs(chance - 0.1) < 1e-9
    assert [q[-1].content for q in judge.asked] == [
        "Request: What was it again?",
        "Earlier the caller said: My order number is 4 5 2 1.\nRequest: What was it again?"]
    condemning = FakeJudge({"Earlier": 0.95})  # unrelated earlier words do not make a request a look-up
    kept, chance = await honesty.checked(condemning, config, prompt(DEFAULT, "The invoice is 4 4 0 0.",
                                                                    "What do bees make?"), DEFAULT)
    assert not kept[-1].unfinished and abs(chance - 0.05) < 1e-9 and len(condemning.asked) == 1


async def test_the_judge_hears_what_the_agent_was_told() -> None:
    judge = FakeJudge({})
    config = HonestyConfig()
    await honesty.checked(judge, config, prompt(DEFAULT, "Hello."), DEFAULT)
    assert "What it was told" not in judge.asked[-1][0].content  # the server's own prompt, no facts: nothing told
    facts = "Open Monday to Friday, 7 am to 6 pm."
    await honesty.checked(judge, config, prompt(with_facts(DEFAULT, facts), "When do you open?"),
                          with_facts(DEFAULT, facts))
    assert judge.asked[-1][0].content.endswith(f"\n{facts}")
    assert DEFAULT not in judge.asked[-1][0].content  # the facts only, not the rest of the prompt
    own = "You answer for Rosa's Salon, open Tuesday to Saturday."  # a client's own instructions
    salon = ToldJudge(own, alone=0.9, told=0.2)
    kept, chance = await honesty.checked(salon, config, prompt(own, "Are you open on Monday?"), DEFAULT)
    assert not kept[-1].unfinished and abs(chance - 0.2) < 1e-9  # they can show that the agent can answer
    assert "What it was told" not in salon.asked[0][0].content + salon.asked[0][-1].content
    assert salon.asked[1][:-1] == salon.asked[0][:-1]  # after the examples: the cache keeps all before it
    assert salon.asked[1][-1].content.endswith(f":\n{own}\n\nRequest: Are you open on Monday?")
    condemned = ToldJudge(own, alone=0.1, told=0.9)
    kept, chance = await honesty.checked(condemned, config, prompt(own, "Hello there."), DEFAULT)
    assert not kept[-1].unfinished and abs(chance - 0.1) < 1e-9 and len(condemned.asked) == 1  # never that it cannot
    # the examples come before the question, the same for every request (the model's cache keeps them)
    assert judge.asked[0][1:-1] == judge.asked[1][1:-1] and len(judge.asked[0]) == 2 + 2 * len(honesty.EXAMPLES)
    both = await honesty.cannot_answer(FakeJudge({"Earlier": 0.3, "it again": 0.8}), "Say it again.", ["Hi."])
    assert abs(both - 0.3) < 1e-9  # `below` 0 (the benchmarks): both are asked


class JudgingLLM(FakeLLM):
    """The fake LLM, also a fake judge (FakeJudge's chances)."""

    def __init__(self, replies: list[str], no: dict[str, float]) -> None:
        super().__init__(replies)
        self.judge = FakeJudge(no)

    async def next_word_probabilities(self, messages: Sequence[ChatMessage], words: Sequence[str]) -> list[float]:
        return await self.judge.next_word_probabilities(messages, words)


def gated_session(llm: FakeLLM, finals: list[str], enabled: bool = True) -> tuple[Session, RecordingOutbound]:
    config = PipelineConfig(
        EndpointingConfig(min_speech_ms=64, end_silence_ms=256, prefix_padding_ms=100),
        AsrStageConfig(partials=False), ChunkerConfig(),
        whole(output_lead_ms=0, output_chunk_ms=20, honesty=HonestyConfig(enabled=enabled)), SamplingParams())
    out = RecordingOutbound()
    backends = Backends(FakeVad(), FakeRecognizer(finals), FakeSynthesizer(), llm)
    return Session(backends, config, DistantClock(), out, output_rate=8000, system_prompt=DEFAULT), out


async def one_turn(session: Session, out: RecordingOutbound) -> None:
    task = asyncio.create_task(session.run())
    await speak(session, 0.3, False)
    await speak(session, 0.5, True)
    await speak(session, 0.5, False)
    await out.wait(lambda: done_events(out))
    await session.audio_in.put(None)
    await task


async def test_a_reply_to_what_the_agent_cannot_check_begins_with_the_opening_and_keeps_it() -> None:
    llm = JudgingLLM(["check the pharmacy's hours from here."], {"pharmacy": 0.95})
    session, out = gated_session(llm, ["When does the pharmacy close?"])
    await one_turn(session, out)
    said = "Sorry, I'm not able to check the pharmacy's hours from here."
    done = done_events(out)[0]
    assert done.text == said and done.llm_steps[0]["honesty"] == 0.95  # response.done's "honesty" (app/call_log.py)
    assert "".join(e.text for e in out.events if isinstance(e, ReplyText)) == said
    asked = llm.requests[0][-1]
    assert asked == ChatMessage("assistant", "Sorry, I'm not able to", unfinished=True)
    assert session.history[-1] == ChatMessage("assistant", said)  # what was said, as one message


async def test_a_request_it_can_answer_and_a_gate_turned_off_leave_the_reply_alone() -> None:
    llm = JudgingLLM(["Paris."], {"pharmacy": 0.95})
    session, out = gated_session(llm, ["What is the capital of France?"])
    await one_turn(session, out)
    assert done_events(out)[0].text == "Paris." and llm.requests[0][-1].role == "user"
    off = JudgingLLM(["It closes at six."], {"pharmacy": 0.95})
    session, out = gated_session(off, ["When does the pharmacy close?"], enabled=False)
    await one_turn(session, out)
    assert done_events(out)[0].text == "It closes at six." and not off.judge.asked


async def test_keys_pressed_are_not_judged() -> None:
    """Keys answer the agent's own menu; the judge was never shown them ("The caller pressed 4 2 # on the
    phone keypad." was judged a look-up at 0.74 by the real 1.5B), so a keypad turn is not asked about."""
    llm = JudgingLLM(["You entered four two."], {"keypad": 0.95})
    session, out = gated_session(llm, [])
    task = asyncio.create_task(session.run())
    for key in "42#":
        await session.on_dtmf(key)
    await out.wait(lambda: done_events(out))
    await session.audio_in.put(None)
    await task
    assert done_events(out)[0].text == "You entered four two." and not llm.judge.asked
