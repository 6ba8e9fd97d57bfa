"""The operator's facts (pipeline/facts.py) and how they join the default prompts (Settings.with_facts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.settings import Settings
from core.errors import ConfigError
from pipeline.config import AgentConfig, SessionConfig
from pipeline.facts import FOOTER, HEADER, load_facts, with_facts

DEMO = Path(__file__).resolve().parents[2] / "deploy" / "demo_facts.txt"


def test_no_facts_leaves_the_prompt_as_it_is() -> None:
    assert load_facts(AgentConfig()) == ""
    assert with_facts("Be kind.", "") == "Be kind."
    settings = Settings()
    assert settings.with_facts() is settings


def test_facts_from_settings_and_a_file_join_both_default_prompts(tmp_path: Path) -> None:
    path = tmp_path / "facts.txt"
    path.write_text("Open 9 to 5, Monday to Friday.\n", encoding="utf-8")
    agent = AgentConfig(facts="We are Juniper Lane Bakery.", facts_file=str(path))
    assert load_facts(agent) == "We are Juniper Lane Bakery.\nOpen 9 to 5, Monday to Friday."
    settings = Settings(agent=agent, session=SessionConfig(system_prompt="Be kind.", tools_prompt="Use tools."))
    composed = settings.with_facts().session
    assert composed.system_prompt == (f"Be kind.\n\n{HEADER}\nWe are Juniper Lane Bakery.\nOpen 9 to 5, Monday to "
                                      f"Friday.\n{FOOTER}")
    assert composed.tools_prompt.startswith("Use tools.\n\n" + HEADER) and composed.tools_prompt.endswith(FOOTER)
    assert settings.session.system_prompt == "Be kind."  # the settings given are not changed


def test_a_missing_file_says_which_and_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read agent.facts_file '.*nowhere.txt'.*leave agent.facts_file"):
        load_facts(AgentConfig(facts_file=str(tmp_path / "nowhere.txt")))
    binary = tmp_path / "facts.bin"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ConfigError, match="UTF-8"):
        load_facts(AgentConfig(facts_file=str(binary)))


def test_facts_over_the_limit_are_a_start_up_error() -> None:
    with pytest.raises(ConfigError, match=r"12 characters, over agent.max_facts_chars \(10\)"):
        load_facts(AgentConfig(facts="x" * 12, max_facts_chars=10))


def test_the_demo_profile_is_fictional_and_within_the_default_limit() -> None:
    text = load_facts(AgentConfig(facts_file=str(DEMO)))
    assert "fictional" in text and 0 < len(text) <= AgentConfig().max_facts_chars
