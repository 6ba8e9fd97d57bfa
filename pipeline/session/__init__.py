"""One caller's session, in parts a reader can hold in their head:

- session.py: the input line (VAD, ASR) for the whole call, routing its events to a turn; turns a
  client asks for (a typed message, a reply, a cancel);
- barge_in.py: the caller's sound while the bot talks;
- keypad.py: keys pressed on a phone (DTMF);
- replies.py: one turn's reply line (LLM, chunker, TTS), preemptive replies, what the history keeps;
- playout.py: the reply audio's pacing, underruns, and the client's playback reports;
- tool_calls.py: a reply's tool calls and the follow-up from their results, end_call;
- parts.py and state.py: what they share.
"""

from pipeline.session.keypad import dtmf_text
from pipeline.session.parts import AudioTap, Backends, Outbound, PipelineConfig, Reply
from pipeline.session.session import Session

__all__ = ["AudioTap", "Backends", "Outbound", "PipelineConfig", "Reply", "Session", "dtmf_text"]
