"""Running tool calls: the tools of one call, who runs each, and what became of every call.

Three kinds of tool:
- the client's (declared in session.start or session.update): the server asks the client with a
  `response.function_call` event and waits for its `function_call.output`;
- the server's own HTTP tools (tools.file): called with httpx, their JSON answer given to the model;
- built in: `end_call` (the goodbye is said, then the call ends).

A call's outcome is always text for the model: the tool's output, or {"error": ...} when it failed
or took longer than tools.timeout_s; the caller then hears an honest sentence, never silence.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from core.clock import Clock
from core.errors import ConfigError
from core.private import Private, content, log_private
from models.llm.tool_calls import Tool, ToolCall, Tools, parse_tools
from pipeline.config import ToolsConfig

log = logging.getLogger(__name__)
END_CALL = Tool("end_call", "End the phone call. Use it only when the caller says goodbye or asks to hang up; say "
                "a short goodbye in the same reply.", {"type": "object", "properties": {}})
TRANSFER_CALL = "transfer_call"
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def transfer_tool(names: tuple[str, ...], warm: bool = False) -> Tool:
    """The built-in transfer_call, offered with the configured targets' names (tools.transfer_targets);
    with a `summary` for the person where some targets take the call warm (tools.warm_transfers)."""
    properties: dict[str, Any] = {"target": {"type": "string", "enum": list(names),
                                             "description": "who to transfer the call to"}}
    if warm:
        properties["summary"] = {"type": "string", "description": "for the person who takes the call: who is "
                                 "calling and what they need, in one short sentence"}
    return Tool(TRANSFER_CALL, "Transfer the phone call to a person. Use it when the caller asks for a person or "
                "for something only a person can do; say in the same reply that you are transferring them.",
                {"type": "object", "properties": properties, "required": ["target"]})


class Consult(Protocol):
    """A warm transfer's first step, by the line: call the person at `destination` and tell them
    `summary`; ToolFailed (with what happened) if they do not answer. The caller waits meanwhile."""

    async def __call__(self, name: str, destination: str, summary: str) -> None: ...


class ToolFailed(Exception):
    """A tool did not give an answer; the message is what the model is told. `answer` is what the
    tool said about it (an HTTP error's body), told to the model and kept out of the log."""

    def __init__(self, reason: str, answer: str = "") -> None:
        super().__init__(f"{reason}: {answer}" if answer else reason)
        self.reason, self.answer = reason, answer


@dataclass
class ToolRun:
    """One call and what became of it (kept with its turn, shown in QA)."""

    call: ToolCall
    runs_on: str  # "client", "server" or "builtin"
    dispatched_at: float
    finished_at: float | None = None
    output: str | None = None  # what the model is given
    error: str | None = None
    filler_heard: bool | None = None  # whether the caller heard the turn's filler while it ran
    repeat_of: str | None = None  # the call_id of the same call earlier in the turn, whose output this reuses

    def same_call(self, call: ToolCall) -> bool:
        """Whether `call` asks the same tool for the same arguments (as JSON values, not as text)."""
        if call.name != self.call.name:
            return False
        try:
            return bool(json.loads(call.arguments) == json.loads(self.call.arguments))
        except ValueError:
            return call.arguments == self.call.arguments

    def as_dict(self, since: float | None = None) -> dict[str, Any]:
        def ms(at: float | None) -> float | None:
            return None if at is None or since is None else round((at - since) * 1000, 1)

        return {"call_id": self.call.call_id, "name": self.call.name, "arguments": self.call.arguments,
                "runs_on": self.runs_on, "output": self.output, "error": self.error,
                "dispatched_ms": ms(self.dispatched_at), "finished_ms": ms(self.finished_at),
                "duration_ms": None if self.finished_at is None else
                round((self.finished_at - self.dispatched_at) * 1000, 1),
                "filler_heard": self.filler_heard, "repeat_of": self.repeat_of}


@dataclass(frozen=True)
class HttpTool:
    tool: Tool
    url: str
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)  # values may hold ${ENV_VAR}
    timeout_s: float | None = None

    async def run(self, client: httpx.AsyncClient, arguments: dict[str, Any], timeout: float) -> str:
        headers = {k: _ENV.sub(lambda m: os.environ.get(m.group(1), ""), v) for k, v in self.headers.items()}
        try:
            if self.method in ("GET", "DELETE"):
                response = await client.request(self.method, self.url, params=arguments, headers=headers,
                                                timeout=timeout)
            else:
                response = await client.request(self.method, self.url, json=arguments, headers=headers,
                                                timeout=timeout)
        except httpx.TimeoutException as exc:
            raise ToolFailed(f"the tool did not answer within {timeout:g} s") from exc
        except httpx.HTTPError as exc:  # the URL is the operator's; secrets sit in headers, never shown
            raise ToolFailed(f"the tool could not be reached ({type(exc).__name__})") from exc
        if response.is_error:
            raise ToolFailed(f"the tool answered HTTP {response.status_code}", response.text[:300])
        return response.text


def load_tools_file(path: str) -> list[HttpTool]:
    """The server's HTTP tools from a JSON or YAML file: a list, or {"tools": [...]}."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(f"tools.file {path!r} cannot be read ({exc}); fix the path or unset tools.file") from exc
    try:
        if file.suffix in (".yaml", ".yml"):
            import yaml

            raw = yaml.safe_load(text)
        else:
            raw = json.loads(text)
    except Exception as exc:  # json's ValueError, yaml's YAMLError
        raise ConfigError(f"tools.file {path!r} is not valid {'YAML' if file.suffix in ('.yaml', '.yml') else 'JSON'}: "
                          f"{exc}") from exc
    items = raw.get("tools") if isinstance(raw, dict) else raw
    if not isinstance(items, list):
        raise ConfigError(f"tools.file {path!r} must hold a list of tools (or {{\"tools\": [...]}})")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ConfigError(f"tools.file {path!r}: tools[{i}] is not an object")
        declared = parse_tools([{"type": "function", **{k: item[k] for k in ("name", "description", "parameters",
                                                                            "read_only", "annotations") if k in item}}])
        assert declared is not None
        url, method = item.get("url"), str(item.get("method", "POST")).upper()
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"tools.file {path!r}: tool {item.get('name')!r} needs an http(s) url")
        if method not in METHODS:
            raise ConfigError(f"tools.file {path!r}: tool {item.get('name')!r}: method must be one of {METHODS}")
        headers = item.get("headers", {})
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise ConfigError(f"tools.file {path!r}: tool {item.get('name')!r}: headers must map names to strings")
        timeout = item.get("timeout_s")
        out.append(HttpTool(declared.tools[0], url, method, dict(headers), float(timeout) if timeout else None))
    return out


class ToolBox:
    """One call's tools: the declarations the model sees and a runner for each."""

    def __init__(self, config: ToolsConfig, clock: Clock, server: list[HttpTool], http: httpx.AsyncClient | None,
                 ask_client: Callable[[ToolCall], Awaitable[str]] | None = None) -> None:
        self.config, self.clock, self.http = config, clock, http
        self.server = {t.tool.name: t for t in server}
        self.ask_client = ask_client
        self.client_tools: tuple[Tool, ...] = ()
        self.client_choice = "auto"
        self.end_call = config.end_call
        self.on_end_call: Callable[[], None] | None = None
        self.on_transfer: Callable[[str, str], None] | None = None  # (target's name, destination): the line can
        self.on_consult: Consult | None = None  # how the line reaches a warm transfer's person first (SIP)
        self.on_transfer_dropped: Callable[[], None] | None = None  # a warm transfer's person was not reached

    def declare(self, tools: Any, choice: Any = None, end_call: bool | None = None) -> None:
        """The client's own tools (session.start, session.update); a ConfigError says what is wrong."""
        declared = self._checked(tools)
        if end_call is not None:
            self.end_call = end_call
        self.client_choice = self._choice(self._all(declared), choice)
        self.client_tools = declared

    def for_response(self, tools: Any, choice: Any) -> Tools | None:
        """What one reply is offered when the client names its own tools or choice for it (the
        Realtime API's response.create): `tools` None keeps the declared ones, `choice` None the
        call's choice. The call's declarations are left as they were; a ConfigError says what is wrong."""
        declared = self.client_tools if tools is None else self._checked(tools)
        everything = self._all(declared)
        return self._offer(everything, self.client_choice if choice is None else self._choice(everything, choice), 1)

    def _checked(self, tools: Any) -> tuple[Tool, ...]:
        parsed = parse_tools(tools, "auto")
        declared = parsed.tools if parsed else ()
        if len(declared) > self.config.max_tools:
            raise ConfigError(f"{len(declared)} tools declared; at most tools.max_tools ({self.config.max_tools})")
        clash = {t.name for t in declared} & (set(self.server) | {END_CALL.name, TRANSFER_CALL})
        if clash:
            raise ConfigError(f"tool names {sorted(clash)} are the server's own; choose other names")
        return declared

    @staticmethod
    def _choice(everything: tuple[Tool, ...], choice: Any) -> str:
        listed = [{"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters}
                  for t in everything]
        parsed = parse_tools(listed or None, choice)
        return parsed.choice if parsed is not None else "auto"

    def _all(self, client: tuple[Tool, ...] | None = None) -> tuple[Tool, ...]:
        """Every tool of the call; end_call only where the transport can hang up, transfer_call where
        it can transfer and targets are configured."""
        ending = (END_CALL,) if self.end_call and self.on_end_call is not None else ()
        warm = bool(self.config.warm_transfers) and self.on_consult is not None
        transfer = (transfer_tool(tuple(self.config.transfer_targets), warm),) if self._transfers() else ()
        return (*(self.client_tools if client is None else client), *(t.tool for t in self.server.values()), *ending,
                *transfer)

    def _transfers(self) -> bool:
        return bool(self.config.transfer_targets) and self.on_transfer is not None

    def tools(self, step: int) -> Tools | None:
        """What the model is offered in a turn's reply `step` (1: the answer to the caller's words;
        then one per round of calls), None with no tools. A "required" or named tool_choice holds
        for the first step only (the reply to the results is the model's choice); after
        tools.max_steps rounds of calls the model may no longer call them."""
        return self._offer(self._all(), self.client_choice, step)

    def _offer(self, everything: tuple[Tool, ...], client_choice: str, step: int) -> Tools | None:
        if not everything:
            return None
        choice = client_choice if client_choice != "auto" else self.config.tool_choice
        if step > self.config.max_steps:
            choice = "none"
        elif step > 1 and choice != "none":
            choice = "auto"
        return Tools(everything, choice, call_threshold=self.config.call_threshold,
                     greedy_arguments=self.config.greedy_arguments)

    def acknowledgement(self, name: str) -> str:
        """What the caller hears when a reply begins a call to `name` before any word (none before
        end_call: its goodbye comes next)."""
        return "" if name in (END_CALL.name, TRANSFER_CALL) else self.config.acknowledgement

    def read_only(self, name: str) -> bool:
        """Whether the call's tool was declared read-only (it may run before the turn is confirmed)."""
        tool = self.server[name].tool if name in self.server else next(
            (t for t in self.client_tools if t.name == name), None)
        return tool is not None and tool.read_only

    def runs_on(self, name: str) -> str:
        if name in self.server:
            return "server"
        return "builtin" if name in (END_CALL.name, TRANSFER_CALL) else "client"

    async def _transfer(self, call: ToolCall) -> str:
        """transfer_call: the line is asked to transfer once this turn's last words were heard. A warm
        target (tools.warm_transfers) is called first and told the summary; the call is joined to
        them only if they answered (ToolFailed, which the model is told, if not)."""
        targets = self.config.transfer_targets
        arguments = call.parsed_arguments()
        name = str(arguments.get("target", "")).strip()
        chosen = next((t for t in targets if t.lower() == name.lower()), None)
        if chosen is None:
            raise ToolFailed(f"no transfer target is called {name!r}; the targets are: {', '.join(targets)}")
        assert self.on_transfer is not None
        if chosen in self.config.warm_transfers and self.on_consult is not None:
            summary = str(arguments.get("summary") or "").strip()[:300]
            self.on_transfer(chosen, targets[chosen])  # asked for in this turn, whatever comes meanwhile
            try:
                await self.on_consult(chosen, targets[chosen], summary)
            except BaseException:
                if self.on_transfer_dropped is not None:
                    self.on_transfer_dropped()
                raise
            return json.dumps({"ok": True, "connecting_to": chosen, "note": f"{chosen} answered and heard the "
                               "summary; the caller is connected to them after your reply"})
        self.on_transfer(chosen, targets[chosen])
        return json.dumps({"ok": True, "transferring_to": chosen})

    async def run(self, run: ToolRun) -> ToolRun:
        """Run one call to its end: its output, or the error the model is told. Never raises."""
        call, timeout = run.call, self.config.timeout_s
        failed: ToolFailed | None = None
        try:
            if call.name in self.server:
                tool = self.server[call.name]
                if self.http is None:
                    raise ToolFailed("the server's HTTP client is not running")
                wait = tool.timeout_s or timeout
                output = await asyncio.wait_for(tool.run(self.http, call.parsed_arguments(), wait), wait + 1)
            elif call.name == END_CALL.name:
                if self.on_end_call is not None:
                    self.on_end_call()
                output = json.dumps({"ok": True, "note": "the call ends after your goodbye"})
            elif call.name == TRANSFER_CALL and self._transfers():
                output = await self._transfer(call)
            elif self.ask_client is not None and any(t.name == call.name for t in self.client_tools):
                output = await asyncio.wait_for(self.ask_client(call), timeout)
            else:
                raise ToolFailed(f"no tool is called {call.name!r} on this call")
            run.output = output[: self.config.max_result_chars]
        except TimeoutError:
            run.error = f"the tool {call.name} did not answer within {timeout:g} s"
        except ToolFailed as exc:
            run.error, failed = f"the tool {call.name} failed: {exc}", exc
        except Exception as exc:  # a runner's own bug must not leave the call stuck "in progress"
            log.error("tool %s failed unexpectedly", call.name, exc_info=exc)
            run.error = f"the tool {call.name} failed: {type(exc).__name__}"
        if run.error is not None:
            run.output = json.dumps({"error": run.error + ". Tell the caller you could not do it, and do not "
                                                          "make up an answer."})
            shown: str | Private = run.error  # the tool's own answer, if any, summarized
            if failed is not None and failed.answer:
                shown = Private(run.error, f"the tool {call.name} failed: {failed.reason}: {content(failed.answer)}")
            log_private(log, logging.WARNING, "tool call %s %s: %s", call.call_id, call.name, shown)
        run.finished_at = self.clock.now()
        return run
