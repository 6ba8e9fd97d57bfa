"""The operator's facts (agent.facts, agent.facts_file): what the agent may state about the business.

A small model asked when the pharmacy closes says a time; asked to book a table, it says "Sure, booked".
Nothing it says about a business is true unless the operator gave it, so the facts join the server's
default prompts (session.system_prompt and session.tools_prompt) as a block the model answers from, with
the rule that anything else about the business, the caller's account, orders or bookings is something it
cannot check. A client that brings its own instructions (session.start, a Realtime session) replaces
the prompt, facts included: it owns what its agent knows.
"""

from __future__ import annotations

from pathlib import Path

from core.errors import ConfigError
from pipeline.config import AgentConfig

HEADER = ("What you do know: facts about this business from its operator. Answer questions about the business "
          "from these facts, in your own words, even where you would otherwise say you can't check:")
FOOTER = ("Anything else about the business, or about the caller's account, orders or bookings, you cannot "
          "check: say so plainly.")


def load_facts(config: AgentConfig) -> str:
    """The facts' text (agent.facts, then agent.facts_file's), or "" for none. An unreadable or
    oversized file is a ConfigError that says which file and what to do."""
    parts = [config.facts.strip()] if config.facts.strip() else []
    if config.facts_file:
        path = Path(config.facts_file)
        try:
            text = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ConfigError(f"cannot read agent.facts_file {str(path)!r}: {reason}; give a UTF-8 text file, or "
                              "leave agent.facts_file empty") from exc
        if text:
            parts.append(text)
    facts = "\n".join(parts)
    if len(facts) > config.max_facts_chars:
        raise ConfigError(f"the agent's facts are {len(facts)} characters, over agent.max_facts_chars "
                          f"({config.max_facts_chars}): they go into every call's prompt, so keep them short, "
                          "or raise the limit (and llm.max_context_tokens)")
    return facts


def with_facts(prompt: str, facts: str) -> str:
    """`prompt` with the facts block after it (unchanged without facts)."""
    if not facts:
        return prompt
    return f"{prompt}\n\n{HEADER}\n{facts}\n{FOOTER}"


def facts_in(prompt: str) -> str | None:
    """The facts block of a prompt made by `with_facts`, or None where it has none."""
    start = prompt.find(f"\n\n{HEADER}\n")
    end = prompt.rfind(f"\n{FOOTER}")
    if start < 0 or end < start:
        return None
    return prompt[start + len(HEADER) + 3:end]
