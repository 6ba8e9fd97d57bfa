"""Settings sections of the model backends (composed into app.settings.Settings). Each backend is
handed only its own section."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class VadConfig(BaseModel):
    engine: Literal["silero"] = "silero"


class TurnConfig(BaseModel):
    engine: Literal["smart-turn", "off"] = Field(
        "smart-turn", description="end-of-turn model asked at each pause; off: the turn ends after "
        "endpointing.end_silence_ms of silence")
    model: str = Field("smart-turn-v3.2-cpu", description="pack name, or a folder or file with the ONNX model")
    threads: int = Field(1, ge=1, description="CPU threads for the model (it runs once per pause)")


class AsrConfig(BaseModel):
    engine: Literal["faster-whisper"] = "faster-whisper"
    model: str = Field("whisper-tiny.en", description="pack name, local folder, or Hugging Face id")
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    compute_type: str = Field("int8", description="int8 on CPU; float16 on CUDA")
    threads: int = Field(0, ge=0, description="CPU threads for CTranslate2 (0: every core)")
    language: str | None = "en"
    beam_size: int = Field(5, ge=1, le=10, description="beam for final transcripts (asr_stage.interim_beam_size for "
                           "interim ones)")
    window_s: int = Field(
        10, ge=1, le=30,
        description="seconds of audio the Whisper encoder sees, the utterance padded up to a multiple of it; 30 is "
                    "Whisper's own window (on 2 CPU cores, 10 s encodes about 7x faster than 30 s)")
    end_confidence: bool = Field(
        False, description="also give the recognizer's confidence in a transcript's last word and final mark (one "
                           "more decoder pass, ~10 ms on 2 cores): for an end-of-turn decision file that weighs them")


class TtsConfig(BaseModel):
    engine: Literal["hibari", "espeak-ng", "coqui-xtts"] = "hibari"
    voice: str = Field("", description="engine-specific voice; empty for the engine's default")
    speed: float = Field(1.0, gt=0.25, le=4.0)
    threads: int = Field(1, ge=1)
    # coqui-xtts (GPU deployments): model name and the speaker reference clip it clones
    coqui_model: str = "tts_models/multilingual/multi-dataset/xtts_v2"
    coqui_speaker_wav: str = ""
    coqui_language: str = "en"
    coqui_device: str = "cuda"


class SpeculativeConfig(BaseModel):
    method: Literal["off", "ngram", "draft_model"] = Field(
        "ngram", description="the default for voice turns; API requests may choose their own")
    num_speculative_tokens: int | Literal["auto"] = "auto"
    max_speculative_tokens: int = Field(8, ge=0, le=8)
    draft_model: str = Field("qwen2.5-coder-0.5b-instruct-q4_k_m", description="for method draft_model")
    draft_quantize: Literal["none", "int8"] = Field(
        "int8", description="torch runtime: int8 makes the 0.5B draft ~2.5x cheaper per token on AVX-512 CPUs")
    draft_copy_min: int = Field(
        3, ge=0, description="draft_model copies earlier text instead of running the draft when the last "
        "this-many tokens occurred before (0: always run the draft model)")
    ngram_min: int = Field(1, ge=1)
    ngram_max: int = Field(4, ge=1)
    memory_budget_gb: float = Field(
        12.0, gt=0, description="refuse to load target + draft + KV caches beyond this many GiB"
    )


class LlmConfig(BaseModel):
    engine: Literal["embedded", "openai"] = "embedded"
    model: str = Field("qwen2.5-coder-0.5b-instruct-q4_k_m",
                       description="pack name, local folder or file, or Hugging Face id. The default was chosen "
                       "side by side with the 1.5B (docs/benchmarks.md, issue 32): the 1.5B knows more and repeats "
                       "back better, but on a 2-core CPU the caller hears it ~630 ms later; set the 1.5B where the "
                       "cores allow")
    tools_model: str = Field(
        "qwen2.5-coder-1.5b-instruct-q4_k_m",
        description="embedded engine: the pack that serves calls which have tools (and /v1 requests with tools), "
        "loaded beside llm.model; empty, or the same as llm.model: llm.model serves them too. The default was chosen "
        "with bench/tool_calls.py (docs/benchmarks.md): the 0.5B calls tools where none is needed and repeats its "
        "calls, the 1.5B picks the right tool and arguments")
    runtime: Literal["llama.cpp", "torch"] = Field(
        "llama.cpp", description="embedded engine: llama.cpp over the pack's own GGUF (Q4_K_M), fast on any CPU; "
        "or torch (PyTorch over the GGUF converted once to safetensors, or a Hugging Face id)")
    dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto", description="torch runtime: auto is bfloat16 where the CPU has AVX-512 BF16 or AMX, else float32")
    quantize: Literal["auto", "none", "int8"] = Field(
        "auto", description="torch runtime: int8 linear layers (exact int32 products), none, or auto: whichever of "
        "the two is faster on this CPU, measured at start-up (int8 is 2x slower per token on AVX2-only CPUs)")
    threads: int = Field(
        0, ge=0, description="LLM threads (0: every core; the LLM yields the cores to a caller's final "
        "transcript between steps, so no thread waits for another engine's)")
    max_context_tokens: int = Field(
        4096, ge=256, description="the most tokens a call's conversation holds (prompt and reply); the embedded "
        "engine's KV cache has room for server.max_sessions of them")
    api_context_tokens: int = Field(
        2048, ge=64, description="the most tokens one /v1 chat completion holds (prompt and reply; a longer prompt is "
        "a 400); the embedded engine's KV cache has room for server.max_api_requests of them besides the calls', "
        "so /v1 can never crowd out a call")
    temperature: float = Field(0.7, ge=0.0, le=2.0)
    top_p: float = Field(0.8, gt=0.0, le=1.0)
    top_k: int = Field(20, ge=0)
    max_tokens: int = Field(160, ge=1, le=4096)
    speculative: SpeculativeConfig = SpeculativeConfig()
    schedule: Literal["edf", "fifo"] = Field(
        "edf", description="embedded engine: the order in which the calls sharing the model get their next step; "
        "edf (earliest deadline first): the call whose caller runs out of reply audio soonest (or waits for its "
        "first) goes first, a call far ahead of its listener waits; fifo: first come, first served")
    api_deadline_s: float = Field(
        1.0, gt=0, description="embedded engine, schedule edf: each step of a /v1 chat completion is due this long "
        "after it is asked for (calls whose audio runs out sooner go first; a call far ahead of its listener waits)")
    # engine "openai": any OpenAI-compatible server (vLLM in production)
    base_url: str = "http://localhost:8000/v1"
    api_key: str = ""
    remote_model: str = Field("", description="model name the remote server serves (empty: ask /models)")
    connect_timeout_s: float = Field(1.0, gt=0)
    read_timeout_s: float = Field(
        1.5, gt=0, description="longest silence before the first token or between tokens: a caller is waiting, "
        "so a stalled server is given up on quickly and the caller hears an apology")
    retries_before_first_token: int = Field(
        default=1, ge=0, le=5, description="retries of a request that failed before any text arrived (never after)")
    retry_backoff_s: float = Field(
        default=0.1, ge=0, description="wait before the first retry, doubled for each next one; a server's "
        "Retry-After (on 429 and 503) replaces it")
    retry_max_wait_s: float = Field(
        default=1.0, ge=0, description="the longest wait before a retry: a caller is waiting, so a server that asks "
        "for longer is not retried and the caller hears the apology at once")
    send_priority: bool = Field(
        default=False, description="engine openai: send vLLM's `priority` request field (ms until the reply's first "
        "audio is due; lower goes first); needs vLLM started with --scheduling-policy priority")
    vllm_metrics_url: str = Field(
        default="", description="vLLM's Prometheus endpoint (e.g. http://vllm:8000/metrics): its speculative-decoding "
                        "acceptance is re-exported at /metrics; empty: not read")
    vllm_metrics_interval_s: float = Field(default=5.0, gt=0, description="how often vllm_metrics_url is read")
