"""Steering a reply's tokens so that every tool call is well-formed: the grammar, at token level.

The reply is text until the model writes `<tool_call>`; from there the bytes must follow the call
automaton (models/llm/tool_calls.py: one offered tool's name, then arguments its JSON Schema allows),
then `</tool_call>`, then either the end of the message or, when parallel calls are allowed, a
newline and then the next `<tool_call>` or the end (see `_call_or_end`). Where the grammar leaves
one way on, those tokens are forced: the decoder emits them without asking the model (jump-forward).

Small models often mean a call without writing the tag: the 0.5B writes a bare JSON object, the
1.5B a markdown code block or "{{". A spoken reply has no use for "{" or "`", so in the text the
probability of every token that starts with one of them (after spaces) goes to `<tool_call>`: the
model's wish to write structure becomes a call, held to the grammar from its first byte. ("<" was
tried too, for the 1.5B's "<tools></tools>": on bench/tool_set.py's requests it made the 1.5B
narrate calls in prose instead, so it is not merged.) Tokens that start with "<" or ">" are ruled out
of spoken text instead (tag soup is never said), and a reply may not end before it has said a word.

With `Tools.call_threshold` set (voice calls: tools.call_threshold), whether to call is decided, not
sampled, at any temperature: a call where the probability of `<tool_call>` (with the structure merged
into it) against every word together is at least the threshold; otherwise the words (sampled or the
best one, as the request says). Without it (/v1 requests: the model's own behaviour), the merged
distribution is sampled, and greedy decoding compares the call with the best single word, which lets
a call win where the model gave it a third of its mass and spread the rest over ways of saying "sorry".

A GuideState is immutable, so the speculative decoder can walk a draft through it and drop what it
does not keep. The same `mask` serves plain decoding and verification, which keeps speculation
exact under the constraint: the target's distribution is the masked one in both.

Masking inside a call reads only the best candidates: the tokens in order of the model's logits,
up to `candidates` allowed ones among the 4 x `candidates` best (further down only where none of
those is allowed; `candidates` is the request's top_k, or CANDIDATES without one, and 1 at
temperature 0), and sets every other logit to -inf. The constrained distribution is so defined for
both decoders. With `Tools.greedy_arguments` (voice calls: tools.greedy_arguments) it is one, whatever the
temperature: the arguments are the model's most likely ones, so the same words make the same call.
"""

from __future__ import annotations

import functools
import json
import weakref
from dataclasses import dataclass

import numpy as np

from core.errors import EngineError
from models.llm.json_nfa import Nfa, State
from models.llm.lm import CausalLM, Logits
from models.llm.tool_calls import CALL_ARGUMENTS, CALL_OPEN, ToolCall, Tools, new_call_id
from models.protocols import ToolCallDelta

CANDIDATES = 64
CALL_OPEN_BYTES, CALL_ARGUMENTS_BYTES = CALL_OPEN.encode(), CALL_ARGUMENTS.encode()
_SCAN = 4096  # when none of the best candidates is allowed: how many more to try at a time
_NEG = np.float32(-np.inf)


@dataclass(frozen=True)
class ToolVocab:
    """What the guide needs of a model's vocabulary."""

    texts: tuple[bytes, ...]  # each token's bytes as plain text (special tokens: b"")
    open_id: int  # <tool_call>
    close_id: int  # </tool_call>
    newline_id: int
    end_id: int  # the end of the message (<|im_end|>)
    stop_ids: frozenset[int]
    structure_ids: np.ndarray  # tokens that start with "{" or "`" after spaces: a call meant
    brace_ids: np.ndarray  # those that start with "{"
    markup_ids: np.ndarray  # those that start with "<" or ">": tag soup ("<tools></tools>"), never spoken words


_vocabs: weakref.WeakKeyDictionary[object, ToolVocab] = weakref.WeakKeyDictionary()


def tool_vocab(lm: CausalLM) -> ToolVocab | None:
    """The model's tool-call tokens, or None when its vocabulary has no <tool_call> token."""
    known = _vocabs.get(lm)
    if known is None:
        open_id, close_id = lm.special_id("<tool_call>"), lm.special_id("</tool_call>")
        newline = lm.encode("\n")
        if open_id is None or close_id is None or len(newline) != 1:
            return None
        end = lm.special_id("<|im_end|>")
        texts = tuple(lm.token_bytes())
        structure = np.array([i for i, t in enumerate(texts) if t.lstrip()[:1] in (b"{", b"`")], dtype=np.int64)
        braces = np.array([i for i, t in enumerate(texts) if t.lstrip()[:1] == b"{"], dtype=np.int64)
        specials = {open_id, close_id, *lm.stop_ids}  # their texts may be spelt out ("<tool_call>")
        markup = np.array([i for i, t in enumerate(texts) if t.lstrip()[:1] in (b"<", b">") and i not in specials],
                          dtype=np.int64)
        known = ToolVocab(texts, open_id, close_id, newline[0], end if end in lm.stop_ids else min(lm.stop_ids),
                          lm.stop_ids, structure, braces, markup)
        _vocabs[lm] = known
    return known


@dataclass(frozen=True)
class GuideState:
    mode: str  # "text", "call", "after" (a call ended), "next" (after its newline: another call, or the end)
    nfa: State | None = None
    calls: int = 0
    began: bool = False  # text mode: the reply has said something (before that it may not end: never silence)


class ToolGuide:
    def __init__(self, lm: CausalLM, tools: Tools, candidates: int, jump_forward: bool = True) -> None:
        """`jump_forward` False: the plain decoder emits the same forced tokens one model step each
        (the baseline bench/tool_decoding.py measures against; the speculative decoder always jumps)."""
        vocab = tool_vocab(lm)
        if vocab is None:
            raise EngineError(f"{lm.name} has no <tool_call> token: its chat template cannot call tools")
        self.lm, self.vocab, self.tools = lm, vocab, tools
        self.callable = tools.callable
        self.nfa = tools.call_nfa() if tools.callable else Nfa.nothing()
        self.candidates = 1 if tools.greedy_arguments else max(1, candidates)
        self.jump_forward = jump_forward
        self._structure = set(vocab.structure_ids.tolist())
        self._markup = set(vocab.markup_ids.tolist())

    def start(self) -> GuideState:
        return GuideState("text")

    def opening(self) -> list[int]:
        """Tokens the reply must start with (a call, where tool_choice requires one)."""
        return [self.vocab.open_id] if self.tools.must_call() is not None else []

    # -- one token -------------------------------------------------------------------------------
    def advance(self, state: GuideState, token: int) -> GuideState | None:
        """The state after `token`, or None where the grammar does not allow it."""
        return self._advance(state, token)

    @functools.lru_cache(maxsize=65536)  # noqa: B019 - one guide per reply; states repeat inside strings
    def _advance(self, state: GuideState, token: int) -> GuideState | None:
        v = self.vocab
        if state.mode == "text":
            if (token == v.close_id or token in self._structure or token in self._markup
                    or (token == v.open_id and not self.callable)
                    or (token in v.stop_ids and not state.began)):
                return None
            if token == v.open_id:
                return GuideState("call", self.nfa.start(), state.calls)
            if state.began or not v.texts[token].strip():
                return state
            return GuideState("text", None, state.calls, began=True)
        if state.mode == "call":
            assert state.nfa is not None
            if token == v.close_id:
                return GuideState("after", None, state.calls + 1) if self.nfa.accepts(state.nfa) else None
            data = v.texts[token]
            if not data or token == v.open_id:
                return None
            nxt = self.nfa.walk(state.nfa, data)
            return GuideState("call", nxt, state.calls) if nxt else None
        if state.mode == "after":
            if token in v.stop_ids:
                return state
            return GuideState("next", None, state.calls) if token == v.newline_id and self._more(state) else None
        if token in v.stop_ids:  # "next": no other call after all
            return GuideState("after", None, state.calls)
        return GuideState("call", self.nfa.start(), state.calls) if token == v.open_id else None

    def _more(self, state: GuideState) -> bool:
        """Whether another call may follow this one."""
        return self.tools.parallel and state.calls < self.tools.max_calls

    def forced(self, state: GuideState) -> tuple[list[int], GuideState]:
        """The tokens that must come next, and the state after them."""
        out: list[int] = []
        while True:
            if state.mode == "call" and state.nfa is not None and self.nfa.finished(state.nfa):
                token = self.vocab.close_id
            elif state.mode == "call" and state.nfa is not None:
                data = self.nfa.forced(state.nfa)
                text = data.decode("utf-8", "ignore")  # up to the last whole character
                if not text:
                    return out, state
                for token in self.lm.encode(text):
                    nxt = self.advance(state, token)
                    if nxt is None:  # the tokenizer split it another way than the bytes allow: stop
                        return out, state
                    out.append(token)
                    state = nxt
                continue
            elif state.mode == "after" and not self._more(state):
                token = self.vocab.end_id
            else:
                return out, state
            nxt = self.advance(state, token)
            assert nxt is not None
            out.append(token)
            state = nxt
            if token in self.vocab.stop_ids:
                return out, state

    # -- the distribution ------------------------------------------------------------------------
    def _call_or_end(self, logits: Logits) -> Logits:
        """After a call and a newline: another call (<tool_call>, or a token that opens a JSON
        object) or the end of the message (every other token's mass: a closing fence or brace, text)."""
        v = self.vocab
        opening = np.zeros(len(logits), dtype=bool)
        opening[v.brace_ids] = True
        opening[v.open_id] = True
        top = float(logits.max())
        mass = np.exp(logits.astype(np.float64) - top)
        out = np.full_like(logits, _NEG)
        out[v.open_id] = top + np.log(mass[opening].sum())
        out[v.end_id] = top + np.log(mass[~opening].sum())
        return out

    def _speak_or_call(self, out: Logits, threshold: float) -> Logits:
        """The choice in spoken text, decided: a call where the model's probability of one (against
        all its words together) is at least `threshold`, else the words."""
        v = self.vocab
        call = float(out[v.open_id])
        words = out.copy()
        words[v.open_id] = _NEG
        top = float(max(call, words.max()))
        call_mass = np.exp(call - top)
        if call_mass >= threshold * (call_mass + np.exp(words.astype(np.float64) - top).sum()):
            only = np.full_like(out, _NEG)
            only[v.open_id] = out[v.open_id]
            return only
        return words

    def mask(self, state: GuideState, logits: Logits) -> Logits:
        """`logits` [V] with -inf wherever the grammar (or the candidate bound) rules a token out."""
        if state.mode == "text":
            v = self.vocab
            out = logits.copy()
            out[v.close_id] = _NEG
            out[v.markup_ids] = _NEG  # a model that imitates its tools prompt's tags speaks words instead
            if not state.began:  # ... and does not end the reply in silence where its tags were
                out[list(v.stop_ids)] = _NEG
            if not self.callable:  # tool_choice "none": no call, and no structure in a spoken reply
                out[v.structure_ids] = _NEG
                out[v.open_id] = _NEG
                return out
            structure = out[v.structure_ids]
            top = float(max(structure.max(), out[v.open_id]))
            # log(exp(open) + sum(exp(structure))): the tag gets the mass of every token that meant it
            out[v.open_id] = top + np.log(np.exp(out[v.open_id] - top) + np.exp(structure - top).sum())
            out[v.structure_ids] = _NEG
            if self.tools.call_threshold is not None:
                return self._speak_or_call(out, self.tools.call_threshold)
            return out
        if state.mode == "next":
            return self._call_or_end(logits)
        allowed: list[int] = []
        checked, width = 0, min(len(logits), self.candidates * 4)
        while not allowed and checked < len(logits):
            # the `width` best, best first (a partition, then a sort of those only)
            best = np.argpartition(-logits, width - 1)[:width] if width < len(logits) else np.arange(len(logits))
            best = best[np.argsort(-logits[best], kind="stable")]
            for token in best[checked:].tolist():
                if self.advance(state, token) is not None:
                    allowed.append(token)
                    if len(allowed) >= self.candidates:
                        break
            checked, width = width, min(len(logits), width + _SCAN)
        if not allowed:
            raise EngineError("the tool-call grammar allows no token here; this is a bug in the guide")
        out = np.full_like(logits, _NEG)
        out[allowed] = logits[allowed]
        return out


class ReplyReader:
    """Splits a reply's tokens into its text and its tool calls, following the guide's states; a
    call's arguments are also given in pieces as they are written (`deltas`)."""

    def __init__(self, guide: ToolGuide) -> None:
        self.guide = guide
        self.state = guide.start()
        self.text_ids: list[int] = []
        self.emitted = ""
        self.call_bytes = bytearray()
        self.calls = 0
        self.call_id = ""  # the call being written
        self.call_name: str | None = None  # its name, once written whole
        self.shown = 0  # bytes of its arguments given as deltas
        self.deltas: list[ToolCallDelta] = []  # pieces written since the last push, for the caller to take

    def push(self, tokens: list[int]) -> tuple[str, list[ToolCall]]:
        calls: list[ToolCall] = []
        self.deltas = []
        before = len(self.text_ids)
        for token in tokens:
            nxt = self.guide.advance(self.state, token)
            if nxt is None:
                raise EngineError(f"the reply's token {token} does not follow the tool-call grammar; this is a bug")
            if nxt.mode == "text":
                self.text_ids.append(token)
            elif nxt.mode == "call" and token == self.guide.vocab.open_id:
                self.call_id, self.call_name, self.shown = new_call_id(), None, 0
            elif nxt.mode == "call":
                self.call_bytes += self.guide.vocab.texts[token]
                self._arguments(final=False)
            elif nxt.mode == "after" and self.state.mode == "call":
                calls.append(self._call())
            self.state = nxt
        return self._text(before), calls

    def _arguments(self, final: bool) -> str | None:
        """The call's arguments written so far: what is new becomes a delta. Held back until sure:
        a last `}` (it may close the call rather than its arguments) and a cut UTF-8 character.
        Returns the whole arguments when `final`."""
        raw = bytes(self.call_bytes)
        head = raw.find(CALL_ARGUMENTS_BYTES)
        if head < 0:
            return None
        if self.call_name is None:
            opened = raw.find(CALL_OPEN_BYTES)
            self.call_name = raw[opened + len(CALL_OPEN_BYTES):head].decode("utf-8", "replace") if opened >= 0 else ""
        written = raw[head + len(CALL_ARGUMENTS_BYTES):].rstrip(b"\n")
        if final or written.endswith(b"}"):
            written = written[:-1]  # the call's own close (final: it is)
        if not final:
            for cut in range(4):  # a UTF-8 character is at most 4 bytes
                try:
                    written[:len(written) - cut].decode("utf-8")
                    written = written[:len(written) - cut]
                    break
                except UnicodeDecodeError:
                    continue
        if len(written) > self.shown:
            self.deltas.append(ToolCallDelta(self.call_id, self.call_name,
                                             written[self.shown:].decode("utf-8", "replace")))
            self.shown = len(written)
        return written.decode("utf-8", "replace")

    def _text(self, before: int) -> str:
        if len(self.text_ids) == before:
            return ""
        text = self.guide.lm.decode(self.text_ids)
        if text.endswith("\ufffd"):
            return ""
        delta = text[len(self.emitted):] if text.startswith(self.emitted) else ""
        self.emitted = text
        return delta

    def _call(self) -> ToolCall:
        self.calls += 1
        raw = bytes(self.call_bytes).decode("utf-8", "replace")
        arguments_text = self._arguments(final=True)
        self.call_bytes = bytearray()
        try:
            body = json.loads(raw)
            name, arguments = body["name"], body["arguments"]
            if not isinstance(name, str) or not isinstance(arguments, dict) or arguments_text is None:
                raise ValueError("name or arguments of the wrong type")
            if json.loads(arguments_text) != arguments:
                raise ValueError("the arguments' text is not the call's arguments")
        except (ValueError, KeyError, TypeError) as exc:
            raise EngineError(f"the model wrote a tool call that is not {{\"name\", \"arguments\"}} JSON "
                              f"({exc}): {raw[:200]!r}") from exc
        # the arguments as written (the grammar's canonical layout): the deltas given, joined
        return ToolCall(self.call_id or new_call_id(), name, arguments_text)
