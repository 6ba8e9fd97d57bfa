"""The conversation a call's replies are written from: the system prompt, then every message the
call keeps, in order, each filed under the turn it belongs to; and the last replies sent whole,
whose words a client may still cut to what it played (the Realtime API's truncate)."""

from __future__ import annotations

from dataclasses import replace

from models.protocols import ChatMessage
from pipeline.config import SessionConfig
from pipeline.history import prompt_window
from pipeline.session.parts import Reply

FINISHED_KEPT = 4  # finished replies whose heard words a client may still correct (History.cut)


class History:
    def __init__(self, system_prompt: str, config: SessionConfig) -> None:
        self.config = config
        # read by the session's users (a transport's tests, a Realtime client's items): changed only here
        self.messages: list[ChatMessage] = [ChatMessage("system", system_prompt)]
        self._by_turn: dict[int, list[ChatMessage]] = {}  # turn id -> the messages kept for it
        self._finished: dict[int, tuple[Reply, ChatMessage]] = {}  # turn id -> a reply sent whole, its message

    def set_system(self, text: str) -> None:
        self.messages[0] = ChatMessage("system", text)

    def prompt(self) -> tuple[ChatMessage, ...]:
        """What the LLM is asked: the system prompt and the latest messages that fit the window."""
        cfg = self.config
        return prompt_window(self.messages, cfg.max_history_messages,
                             min(cfg.history_drop_block, cfg.max_history_messages))

    def __len__(self) -> int:
        return len(self.messages)

    def keep(self, turn_id: int, message: ChatMessage, at: int | None = None) -> None:
        """`message` joins the history (at the end, or at `at`), as turn `turn_id`'s."""
        if at is None:
            self.messages.append(message)
        else:
            self.messages.insert(at, message)
        self._by_turn.setdefault(turn_id, []).append(message)

    def keep_finished(self, turn_id: int, reply: Reply, message: ChatMessage) -> None:
        """A spoken reply sent whole, kept as `message`: a client may yet say it stopped short (cut)."""
        self._finished[turn_id] = (reply, message)
        while len(self._finished) > FINISHED_KEPT:
            del self._finished[next(iter(self._finished))]

    def replace(self, old: ChatMessage, new: ChatMessage | None) -> bool:
        """`old` (this very message) is replaced by `new`, or removed (None)."""
        for i in range(len(self.messages) - 1, 0, -1):
            if self.messages[i] is old:
                if new is None:
                    del self.messages[i]
                else:
                    self.messages[i] = new
                break
        else:
            return False
        for turn_messages in self._by_turn.values():
            for j, message in enumerate(turn_messages):
                if message is old:
                    if new is None:
                        del turn_messages[j]
                    else:
                        turn_messages[j] = new
                    return True
        return True

    def forget(self, turn_id: int, role: str, text: str | None = None) -> bool:
        """Turn `turn_id`'s message of `role` whose words are `text` (None: its first of that role)
        leaves the history; an assistant message that made calls keeps them and loses its words.
        False when there is no such message."""
        for message in self._by_turn.get(turn_id, []):
            if message.role == role and (text is None or message.content == text):
                kept = replace(message, content="") if message.tool_calls else None
                return self.replace(message, kept)
        return False

    def forget_call(self, call_id: str) -> bool:
        """A function call or its output is deleted: both leave the history (a chat template takes
        neither without the other), and the message that made the call loses it."""
        found = False
        for turn_messages in list(self._by_turn.values()):
            for message in list(turn_messages):
                if message.role == "tool" and message.tool_call_id == call_id:
                    found = self.replace(message, None) or found
                elif any(c.call_id == call_id for c in message.tool_calls):
                    calls = tuple(c for c in message.tool_calls if c.call_id != call_id)
                    kept = replace(message, tool_calls=calls) if calls or message.content else None
                    found = self.replace(message, kept) or found
        return found

    def take_back(self, turn_id: int) -> list[str]:
        """Every message of the turn leaves the history; returns the caller's words among them."""
        said = [m.content for m in self._by_turn.get(turn_id, []) if m.role == "user" and m.content]
        for message in self._by_turn.pop(turn_id, []):
            self.replace(message, None)
        self._finished.pop(turn_id, None)
        return said

    def cut(self, turn_id: int, played: int) -> str | None:
        """The client played only `played` samples of turn `turn_id`'s audio of a reply sent whole:
        its message keeps the words heard (none: it leaves). The words, or None when the turn's reply
        is not among the last ones finished."""
        kept = self._finished.get(turn_id)
        if kept is None:
            return None
        done, message = kept
        heard = done.ledger.text_until(max(0, played - done.offset_samples))
        kept_message = replace(message, content=heard) if heard else None
        if self.replace(message, kept_message):
            if kept_message is not None:
                self._finished[turn_id] = (done, kept_message)
            else:
                del self._finished[turn_id]
        return heard
