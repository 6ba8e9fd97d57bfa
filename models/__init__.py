"""Model backends behind narrow protocols (protocols.py), grouped by what they are: llm/ (engines,
the memory guard), speech/ (VAD, ASR, end of turn, TTS), speculative/ (the speculative decoding
engine), packs/ (fetch, verify, convert, cache); registry.py picks an engine lazily, config.py
holds their settings, cpu.py the machine's facts that choose defaults."""
