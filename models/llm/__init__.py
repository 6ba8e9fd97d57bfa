"""Language models: the embedded engine (llama.cpp or PyTorch under the project's plain and
speculative decoders), the OpenAI-compatible client (vLLM), sampling, tool-call grammars, and the
load-time memory guard that keeps a target and its draft from exhausting memory."""
