"""Tools the model may call, in OpenAI's function shape, and the calls it makes.

A tool is declared as `{"type": "function", "name": ..., "description": ..., "parameters": {JSON
Schema}}` (the Realtime API's flat shape), or with the same fields under `"function"` (Chat
Completions). `"read_only": true` (or MCP's `"annotations": {"readOnlyHint": true}`) says that calling
it changes nothing: such a call may run before the caller's turn is known to be over. `tool_choice`
is "auto", "none", "required", or one function by name (`{"type": "function", "name": ...}`, or
`{"type": "function", "function": {"name": ...}}`).
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from core.errors import ConfigError
from models.llm.json_nfa import Builder, Nfa, compile_value

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CHOICES = ("auto", "none", "required")
# What the Qwen2.5 (Hermes-style) template shows the model between <tool_call> and </tool_call>
# ("\n" before and after are optional: small models write the object bare, without the tags).
CALL_OPEN = '{"name": "'
CALL_ARGUMENTS = '", "arguments": '
CALL_CLOSE = "}"


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    read_only: bool = False  # calling it changes nothing (a look-up): it may run before the turn is confirmed

    def as_openai(self) -> dict[str, Any]:
        """The Chat Completions shape, which chat templates expect."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolCall:
    call_id: str
    name: str
    arguments: str  # a JSON object as text, as OpenAI sends it

    def parsed_arguments(self) -> dict[str, Any]:
        value = json.loads(self.arguments)
        if not isinstance(value, dict):
            raise ValueError("the arguments are not a JSON object")
        return value


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True)
class Tools:
    """The tools of one request and how the model may use them."""

    tools: tuple[Tool, ...]
    choice: str = "auto"  # "auto", "none", "required", or a tool's name
    parallel: bool = True  # several calls in one reply
    max_calls: int = 8  # calls in one reply, at most
    # Where set, whether to call is decided, not sampled: a call where the model's probability of one
    # (at temperature 1, against all its words together) is at least this (tools.call_threshold).
    call_threshold: float | None = None
    # Where set, a call's arguments are the model's most likely ones at any temperature (tools.greedy_arguments).
    greedy_arguments: bool = False
    _nfa: dict[str, Nfa] = field(default_factory=dict, compare=False, repr=False)

    @property
    def callable(self) -> bool:
        """Whether the reply may call them (not with tool_choice "none": the model still sees them,
        as OpenAI's models do, to read the calls and results in the history)."""
        return self.choice != "none"

    def must_call(self) -> str | None:
        """What the reply must start with a call to: a tool's name, "" for any, None for no call."""
        if self.choice == "required":
            return ""
        if self.choice in CHOICES:
            return None
        return self.choice

    def call_nfa(self) -> Nfa:
        """The bytes between <tool_call> and </tool_call>: one of the offered tools (the chosen one
        only, where tool_choice names one) with arguments its schema allows."""
        key = self.choice if self.choice not in CHOICES else ""
        known = self._nfa.get(key)
        if known is None:
            b = Builder()
            allowed = [t for t in self.tools if not key or t.name == key]
            calls = [b.seq(b.literal(t.name.encode() + CALL_ARGUMENTS.encode()),
                           compile_value(b, t.parameters, f"tool {t.name!r} parameters"))
                     for t in allowed]
            known = b.finish(b.seq(b.optional(b.literal(b"\n")), b.literal(CALL_OPEN.encode()), b.alt(*calls),
                                   b.literal(CALL_CLOSE.encode()), b.optional(b.literal(b"\n"))))
            self._nfa[key] = known
        return known


def parse_tools(raw: Any, choice: Any = "auto", parallel: Any = True) -> Tools | None:
    """Declarations from a client (a list of tools, or None) checked, with the choice; a
    ConfigError says what is wrong. None when there are no tools."""
    if raw is None or raw == []:
        if choice not in (None, "auto", "none"):
            raise ConfigError(f"tool_choice {choice!r} needs tools, and none were given")
        return None
    if not isinstance(raw, list):
        raise ConfigError("tools must be a list of {\"type\": \"function\", \"name\": ..., \"parameters\": ...}")
    tools: list[Tool] = []
    for i, item in enumerate(raw):
        tools.append(_parse_tool(item, i))
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise ConfigError(f"tool names must be unique: {names}")
    picked = _parse_choice(choice, names)
    if not isinstance(parallel, bool):
        raise ConfigError("parallel_tool_calls must be true or false")
    result = Tools(tuple(tools), picked, parallel)
    if result.callable:
        result.call_nfa()  # refuse a schema it cannot follow now, not at the first call
    return result


def _parse_tool(item: Any, i: int) -> Tool:
    if not isinstance(item, dict) or item.get("type", "function") != "function":
        raise ConfigError(f"tools[{i}]: only {{\"type\": \"function\", ...}} tools are supported")
    body = item.get("function", item)
    if not isinstance(body, dict):
        raise ConfigError(f"tools[{i}].function must be an object")
    name = body.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise ConfigError(f"tools[{i}]: name must be 1-64 letters, digits, '_' or '-', not {name!r}")
    description = body.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(f"tool {name!r}: description must be a string")
    parameters = body.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise ConfigError(f"tool {name!r}: parameters must be a JSON Schema of type object")
    annotations = body.get("annotations")
    annotations = {} if annotations is None else annotations
    if not isinstance(annotations, dict):
        raise ConfigError(f"tool {name!r}: annotations must be an object")
    read_only = body.get("read_only")
    if read_only is None:
        read_only = annotations.get("readOnlyHint") or False
    if not isinstance(read_only, bool):
        raise ConfigError(f"tool {name!r}: read_only must be true or false, not {read_only!r}")
    return Tool(name, description, parameters, read_only)


def _parse_choice(choice: Any, names: list[str]) -> str:
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise ConfigError(f"tool_choice must be one of {CHOICES} or a function, not {choice!r}")
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = choice.get("name") or (choice.get("function") or {}).get("name")
        if name not in names:
            raise ConfigError(f"tool_choice names {name!r}, which is not among the tools {names}")
        return str(name)
    raise ConfigError(f"tool_choice must be one of {CHOICES} or {{\"type\": \"function\", \"name\": ...}}")
