"""Realtime conversation items as the language model's messages: for a `response.create` whose
`input` gives the model its own context (items, or references to the conversation's), rather
than the conversation."""

from __future__ import annotations

from typing import Any

from app.transports.realtime.messages import RealtimeError
from models.llm.tool_calls import ToolCall
from models.protocols import ChatMessage

TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text",
              "input_audio": "transcript", "output_audio": "transcript", "audio": "transcript"}


def item_message(item: dict[str, Any], param: str) -> ChatMessage:
    """One item as a message: a user, assistant or system message's words (its text parts, and
    the transcripts of its audio parts: audio to transcribe is turned into a transcript first), a
    function call, or a function call's output. A RealtimeError names what cannot be one."""
    kind = item.get("type")
    if kind == "function_call":
        call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "")
        if not (isinstance(call_id, str) and isinstance(name, str) and isinstance(arguments, str)):
            raise RealtimeError("invalid_value", "a function_call needs `call_id`, `name` and `arguments` strings",
                                param)
        return ChatMessage("assistant", "", (ToolCall(call_id, name, arguments),))
    if kind == "function_call_output":
        call_id, output = item.get("call_id"), item.get("output")
        if not (isinstance(call_id, str) and isinstance(output, str)):
            raise RealtimeError("invalid_value", "a function_call_output needs `call_id` and `output` strings", param)
        return ChatMessage("tool", output, tool_call_id=call_id)
    role = item.get("role")
    if kind != "message" or role not in ("user", "assistant", "system"):
        raise RealtimeError("invalid_value", f"an input item is a message (user, assistant or system), a "
                            f"function_call, a function_call_output or an item_reference, not {kind!r}", param)
    content = item.get("content")
    if not isinstance(content, list):
        raise RealtimeError("invalid_value", "a message needs `content`: a list of parts", f"{param}.content")
    words = []
    for part in content:
        field = TEXT_PARTS.get(str(part.get("type"))) if isinstance(part, dict) else None
        if field is None:
            raise RealtimeError("unsupported", "a message's parts must be text or audio (images are not served: the "
                                "model reads words)", f"{param}.content")
        value = part.get(field)
        if value is not None and not isinstance(value, str):
            raise RealtimeError("invalid_value", f"a part's `{field}` must be a string", f"{param}.content")
        if value:
            words.append(value)
    return ChatMessage(role, " ".join(words).strip())
