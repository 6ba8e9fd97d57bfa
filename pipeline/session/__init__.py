"""One caller's session, made of parts a reader can hold in their head, each owning its own state
and given only the collaborators it needs; `Session` (session.py) is the façade that wires them and
runs the input line:

- session.py: the input line (VAD, ASR) for the whole call, routing its events to a turn; the two
  ports (audio in: `Inbound`; control in: its methods) and `configure`, the one way a transport
  sets how the call behaves;
- turn_book.py: the call's turns (ids, the open ones, the latest, the one answered);
- history.py: the conversation the replies are written from, by turn;
- barge_in.py: the caller's sound while the bot talks;
- keypad.py: keys pressed on a phone (DTMF);
- replies.py: one turn's reply line (LLM, chunker, TTS), preemptive replies, what the history keeps;
- playout.py: the reply audio's pacing and underruns;
- tool_calls.py: a reply's tool calls and the follow-up from their results, end_call;
- parts.py: the engines, the settings, the ports, and the reply in flight (`Reply`).
"""

from pipeline.session.keypad import dtmf_text
from pipeline.session.parts import AudioTap, Backends, Inbound, Outbound, PipelineConfig, Reply
from pipeline.session.session import Session

__all__ = ["AudioTap", "Backends", "Inbound", "Outbound", "PipelineConfig", "Reply", "Session", "dtmf_text"]
