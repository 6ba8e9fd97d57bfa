"""Benchmark: the GPU stage budget (docs/deployment.md, "The 250 ms budget on a GPU"), measured where a
CUDA GPU is present.

What it times, each as medians over repeated runs, synchronizing the GPU around every sample:

- ASR. Real faster-whisper in float16 (CTranslate2 on CUDA) transcribing a ~3 s utterance, when
  `--asr-model` names a faster-whisper model folder and CTranslate2 sees a CUDA device. Beside it,
  always, the Whisper architectures (tiny.en, small.en, distil-large-v3) built from their configs in
  PyTorch (transformers, float16, random weights): the encoder over the 30 s window Whisper always
  pads to, then 4 prompt tokens and 16 decoded tokens (a ~3 s utterance), at batch 1 (greedy) and
  batch 5 (the decoder width of beam 5, without the beam bookkeeping); eager, and one decoder step
  replayed as a CUDA graph.
- LLM. The Qwen2.5 architectures (0.5B, 1.5B, 7B) built from their configs in bfloat16 with random
  weights (compute time does not depend on the weights' values), in PyTorch eager (transformers):
  a cold prefill of the conversation (`--context` tokens: no prefix cache), the prefill of a new
  turn's `--new-tokens` after that context is cached (what vLLM's prefix caching leaves to compute
  before the first token), one decoding step, and one pass over 5 tokens (verifying K = 4 drafts).
  Then the turn's prefill, the step and the pass replayed as CUDA graphs over a static KV cache,
  which is how vLLM removes the per-kernel launch cost, and a graphed step for `--batch` calls at
  once; if a capture fails, its error is recorded instead.
- On the GPU host's CPU: the end-of-turn model (Smart Turn v3.2, ONNX) on an 8 s window, and the
  first audio of hibari for short first phrases, when `--turn-model` and hibari are available.

The random-weight rows are architecture timings, not vLLM's: vLLM adds its own kernels, scheduler,
batching and the HTTP hop, and a trained model's replies decide how many tokens a first clause
takes. With no CUDA GPU it says so and exits 0 (`--smoke` runs every code path on the CPU with
shrunken models instead, to test this script; its figures mean nothing).

    python3 bench/gpu_budget.py --json docs/bench/gpu_budget_h200.json
    python3 bench/gpu_budget.py --llm 7b --whisper tiny.en --asr-model /models/whisper-tiny.en
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import importlib.util
import json
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models import cpu

# Published config.json values of the Hugging Face models (Qwen/Qwen2.5-*-Instruct, openai/whisper-*,
# distil-whisper/distil-large-v3); only the shapes matter here.
QWEN = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}
WHISPER = {
    "tiny.en": dict(d_model=384, encoder_layers=4, decoder_layers=4, encoder_attention_heads=6,
                    decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536, vocab_size=51864,
                    num_mel_bins=80),
    "small.en": dict(d_model=768, encoder_layers=12, decoder_layers=12, encoder_attention_heads=12,
                     decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072, vocab_size=51864,
                     num_mel_bins=80),
    "distil-large-v3": dict(d_model=1280, encoder_layers=32, decoder_layers=2, encoder_attention_heads=20,
                            decoder_attention_heads=20, encoder_ffn_dim=5120, decoder_ffn_dim=5120,
                            vocab_size=51866, num_mel_bins=128),
}
SMOKE_QWEN = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=True)
SMOKE_WHISPER = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=51864,
                     num_mel_bins=80)
VERIFY_TOKENS = 5  # one target pass over K = 4 drafted tokens and the bonus position
WHISPER_PROMPT, WHISPER_STEPS = 4, 16  # <|startoftranscript|> ... prompt; ~16 tokens for a 3 s utterance
FIRST_PHRASES = ["Sure, one moment.", "It's seven thirty.", "Yes, that works.", "Okay, got it.",
                 "The pharmacy closes at nine."]
UTTERANCE = "What time does the pharmacy on Main Street close tonight?"


def ms(seconds: list[float]) -> float:
    return round(1000 * statistics.median(seconds), 2)


def raw(seconds: list[float]) -> list[float]:
    return [round(1000 * s, 3) for s in seconds]


def measure(fn: Callable[[], object], repeats: int, sync: Callable[[], None], warmup: int = 2,
            reset: Callable[[], None] | None = None) -> list[float]:
    """Wall time of `fn` in seconds, `repeats` samples after `warmup` unrecorded runs; `reset` runs
    between samples, untimed."""
    samples = []
    for i in range(warmup + repeats):
        sync()
        started = time.perf_counter()
        fn()
        sync()
        if i >= warmup:
            samples.append(time.perf_counter() - started)
        if reset is not None:
            reset()
    return samples


def trim(cache: Any, length: int) -> None:
    """Drop a DynamicCache's positions beyond `length` (a negative crop: transformers 4.x and 5.x agree)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def header(torch: Any, device: str) -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu": cpu.describe(), "python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "device": device,
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=torch.cuda.get_device_name(0), gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    multiprocessors=props.multi_processor_count, capability=f"{props.major}.{props.minor}")
    for name in ("transformers", "onnxruntime", "ctranslate2", "faster_whisper"):
        try:
            module = __import__(name)
            info[name] = getattr(module, "__version__", "?")
        except ImportError:
            info[name] = None
    return info


# ---------------------------------------------------------------------------------------------- LLM

def build_qwen(torch: Any, shape: dict[str, Any], device: str) -> tuple[Any, Any]:
    """A Qwen2 model of this shape in bfloat16 with random weights (initialized on the device)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    options: dict[str, Any] = {"attn_implementation": "sdpa"}  # typed loosely: the keywords vary by version
    config = Qwen2Config(**shape, **options, rms_norm_eps=1e-6, max_position_embeddings=32768)
    build: Any = Qwen2ForCausalLM
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = build(config)
    finally:
        torch.set_default_dtype(previous)
    return model.to(device=device, dtype=torch.bfloat16).eval(), config


def free(torch: Any, device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def llm_costs(torch: Any, arch: str, shape: dict[str, Any], device: str, args: argparse.Namespace) -> dict[str, Any]:
    from transformers import DynamicCache

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    started = time.perf_counter()
    model, config = build_qwen(torch, shape, device)
    built_s = time.perf_counter() - started
    params = sum(p.numel() for p in model.parameters())
    ctx, new, reps = args.context, args.new_tokens, args.repeats
    vocab = shape["vocab_size"]
    prompt = torch.randint(0, vocab, (1, ctx), device=device)
    turn = torch.randint(0, vocab, (1, new), device=device)
    one = torch.randint(0, vocab, (1, 1), device=device)
    verify = torch.randint(0, vocab, (1, VERIFY_TOKENS), device=device)
    result: dict[str, Any] = {"arch": f"Qwen2.5-{arch.upper()}-Instruct", "params_b": round(params / 1e9, 3),
                              "dtype": "bfloat16", "weights": "random", "runtime": "PyTorch eager (transformers)",
                              "context": ctx, "new_tokens": new, "built_s": round(built_s, 1)}
    with torch.inference_mode():
        def cold() -> None:
            model(input_ids=prompt, use_cache=True, logits_to_keep=1).logits.argmax(-1).item()

        cold_s = measure(cold, max(3, reps // 2), sync)
        cache = DynamicCache(config=config)
        model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)

        def cached() -> None:
            model(input_ids=turn, past_key_values=cache, use_cache=True, logits_to_keep=1).logits.argmax(-1).item()

        cached_s = measure(cached, reps, sync, reset=lambda: trim(cache, ctx))
        model(input_ids=turn, past_key_values=cache, use_cache=True, logits_to_keep=1)  # the cache now holds ctx + new

        def step() -> None:
            model(input_ids=one, past_key_values=cache, use_cache=True, logits_to_keep=1).logits.argmax(-1).item()

        def check() -> None:
            model(input_ids=verify, past_key_values=cache, use_cache=True,
                  logits_to_keep=VERIFY_TOKENS).logits.argmax(-1).tolist()

        step_s = measure(step, args.decode_steps, sync, reset=lambda: trim(cache, ctx + new))
        verify_s = measure(check, reps, sync, reset=lambda: trim(cache, ctx + new))
        result.update(
            cold_prefill_ms=ms(cold_s), cached_turn_prefill_ms=ms(cached_s), decode_step_ms=ms(step_s),
            verify_pass_ms=ms(verify_s),
            verify_over_step=round(statistics.median(verify_s) / statistics.median(step_s), 2),
            samples={"cold_prefill": raw(cold_s), "cached_turn_prefill": raw(cached_s), "decode_step": raw(step_s),
                     "verify_pass": raw(verify_s)})
    if device == "cuda":
        result["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return result


def llm_graphed(torch: Any, shape: dict[str, Any], device: str, args: argparse.Namespace) -> dict[str, Any]:
    """Passes replayed as CUDA graphs over a static KV cache, the way vLLM removes the per-kernel
    launch cost: the new turn's prefill after the cached context, one decoding step and the 5-token
    verification pass at batch 1, and one decoding step for `--batch` calls at once. Run after every
    eager measurement, so that a failed capture cannot spoil them."""
    model, config = build_qwen(torch, shape, device)
    vocab = shape["vocab_size"]
    prompt = torch.randint(0, vocab, (1, args.context), device=device)
    turn = torch.randint(0, vocab, (1, args.new_tokens), device=device)
    graphs: dict[str, Any] = {"how": "CUDA graph replay over a static KV cache" if device == "cuda"
                              else "static KV cache, eager (no CUDA here: smoke test only)"}
    whole = torch.cat([prompt, turn], dim=1)
    cases = {"turn_prefill": (prompt, args.new_tokens), "pass_1": (whole, 1),
             f"pass_{VERIFY_TOKENS}": (whole, VERIFY_TOKENS),
             f"batch_{args.batch}_pass_1": (whole.expand(args.batch, -1).contiguous(), 1)}
    with torch.inference_mode():
        for name, (context, n) in cases.items():
            try:
                samples = graphed_pass(torch, model, config, context, n, device, args.graph_repeats)
                graphs[f"{name}_ms"] = ms(samples)
                graphs[f"{name}_samples"] = raw(samples)
            except Exception as exc:  # a capture that fails is a finding to record, not a crash
                graphs[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return graphs


def static_cache(torch: Any, config: Any, length: int, batch: int, device: str, dtype: Any) -> Any:
    import inspect

    from transformers import StaticCache

    kwargs: dict[str, Any] = {"config": config, "max_cache_len": length}
    if "max_batch_size" in inspect.signature(StaticCache.__init__).parameters:  # transformers 4.x
        kwargs.update(max_batch_size=batch, device=device, dtype=dtype)
    return StaticCache(**kwargs)


def rewinder(torch: Any, cache: Any, length: int) -> Callable[[], None]:
    """Newer transformers keep a static cache's filled length in a tensor per layer, advanced in place
    by every pass (and so by every replay of a graph): set it back before each pass, so that all
    passes write the same positions. Older ones take the positions from cache_position alone."""
    counters = [layer.cumulative_length for layer in getattr(cache, "layers", [])
                if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]

    def rewind() -> None:
        for counter in counters:
            counter.fill_(length)

    return rewind


def replayed(torch: Any, forward: Callable[[], Any], rewind: Callable[[], None], device: str,
             repeats: int) -> list[float]:
    """Capture `forward` as a CUDA graph and time its replays (each reading the result back to the
    CPU, as a decoding loop does); on the CPU (smoke test) just time `forward`."""
    if device != "cuda":
        return measure(lambda: forward().tolist(), repeats, lambda: None, reset=rewind)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            forward()
            rewind()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = forward()
    rewind()

    def replay() -> None:
        graph.replay()
        out.tolist()

    return measure(replay, repeats, torch.cuda.synchronize, warmup=5, reset=rewind)


def graphed_pass(torch: Any, model: Any, config: Any, context: Any, n: int, device: str, repeats: int) -> list[float]:
    """One pass over n tokens after `context` (batch, length) is in a static cache, replayed."""
    batch, length = context.shape
    cache = static_cache(torch, config, length + 64, batch, device, torch.bfloat16)
    model(input_ids=context, past_key_values=cache, use_cache=True, logits_to_keep=1,
          cache_position=torch.arange(length, device=device))
    ids = torch.randint(0, config.vocab_size, (batch, n), device=device)
    position = torch.arange(length, length + n, device=device)

    keep = n if n <= VERIFY_TOKENS else 1  # a verification pass needs every position's logits, a prefill the last

    def forward() -> Any:
        return model(input_ids=ids, past_key_values=cache, use_cache=True, cache_position=position,
                     position_ids=position[None].expand(batch, -1), logits_to_keep=keep).logits.argmax(-1)

    return replayed(torch, forward, rewinder(torch, cache, length), device, repeats)


# ---------------------------------------------------------------------------------------------- ASR

def whisper_costs(
    torch: Any, arch: str, shape: dict[str, Any], device: str, args: argparse.Namespace
) -> dict[str, Any]:
    from transformers import DynamicCache, EncoderDecoderCache, WhisperConfig, WhisperForConditionalGeneration

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    dtype = torch.float16 if device == "cuda" else torch.float32
    options: dict[str, Any] = {"attn_implementation": "sdpa"}
    config = WhisperConfig(**shape, **options, max_source_positions=1500, max_target_positions=448)
    build: Any = WhisperForConditionalGeneration
    torch.manual_seed(0)
    with torch.device(device):
        model = build(config)
    model = model.to(device=device, dtype=dtype).eval()
    params = sum(p.numel() for p in model.parameters())
    features = torch.randn(1, shape["num_mel_bins"], 3000, device=device, dtype=dtype)
    decoder, head = model.model.decoder, model.proj_out
    reps = args.repeats
    result: dict[str, Any] = {"arch": f"whisper-{arch}", "params_m": round(params / 1e6, 1),
                              "dtype": str(dtype).removeprefix("torch."), "weights": "random",
                              "runtime": "PyTorch eager (transformers)", "window_frames": 3000,
                              "prompt_tokens": WHISPER_PROMPT, "decoded_tokens": WHISPER_STEPS}
    with torch.inference_mode():
        def encode() -> Any:
            return model.model.encoder(input_features=features).last_hidden_state

        encoded = encode()
        encode_s = measure(lambda: encode().sum().item(), reps, sync)

        def decode(batch: int) -> None:
            states = encoded.expand(batch, -1, -1)
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
            tokens = torch.randint(0, shape["vocab_size"], (batch, WHISPER_PROMPT), device=device)
            for _ in range(WHISPER_STEPS + 1):
                out = decoder(input_ids=tokens, encoder_hidden_states=states, past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                tokens = head(out.last_hidden_state[:, -1:]).argmax(-1)
                tokens.tolist()  # a decoder loop reads each token back before the next step

        result["encoder_ms"] = ms(encode_s)
        result["samples"] = {"encoder": raw(encode_s)}
        for batch in (1, 5):
            decoded = measure(functools.partial(decode, batch), reps, sync)
            result[f"batch_{batch}_decode_ms"] = ms(decoded)
            result[f"batch_{batch}_per_token_ms"] = round(ms(decoded) / (WHISPER_STEPS + 1), 2)
            result[f"batch_{batch}_ms"] = round(ms(encode_s) + ms(decoded), 2)
            result["samples"][f"batch_{batch}_decode"] = raw(decoded)
        for batch in (1, 5):
            try:
                states = encoded.expand(batch, -1, -1).contiguous()
                stepped = whisper_graphed_step(torch, model, states, device, reps * 5)
                result[f"batch_{batch}_graphed_step_ms"] = ms(stepped)
                result[f"batch_{batch}_graphed_total_ms"] = round(ms(encode_s) + (WHISPER_STEPS + 1) * ms(stepped), 2)
                result["samples"][f"batch_{batch}_graphed_step"] = raw(stepped)
            except Exception as exc:  # a capture that fails is a finding to record, not a crash
                result[f"batch_{batch}_graphed_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return result


def whisper_graphed_step(torch: Any, model: Any, states: Any, device: str, repeats: int) -> list[float]:
    """One decoder step (self-attention over a static cache, cross-attention over the encoder's
    output, cached after the prompt pass) replayed as a CUDA graph."""
    from transformers import EncoderDecoderCache

    batch = states.shape[0]
    config = model.config
    vocab = config.vocab_size
    cache = EncoderDecoderCache(static_cache(torch, config, 64, batch, device, states.dtype),
                                static_cache(torch, config, states.shape[1], batch, device, states.dtype))
    decoder, head = model.model.decoder, model.proj_out
    prompt = torch.randint(0, vocab, (batch, WHISPER_PROMPT), device=device)
    decoder(input_ids=prompt, encoder_hidden_states=states, past_key_values=cache, use_cache=True,
            cache_position=torch.arange(WHISPER_PROMPT, device=device))
    length = WHISPER_PROMPT + WHISPER_STEPS // 2  # a step in the middle of the utterance
    ids = torch.randint(0, vocab, (batch, 1), device=device)
    position = torch.tensor([length], device=device)
    self_attention = getattr(cache, "self_attention_cache", cache)

    def forward() -> Any:
        out = decoder(input_ids=ids, encoder_hidden_states=states, past_key_values=cache, use_cache=True,
                      cache_position=position)
        return head(out.last_hidden_state[:, -1:]).argmax(-1)

    rewind = rewinder(torch, self_attention, length)
    rewind()
    return replayed(torch, forward, rewind, device, repeats)


def utterance_audio() -> Any:
    """~3 s of speech from hibari (resampled 24 -> 16 kHz by linear interpolation), or None."""
    import numpy as np

    try:
        from hibari import SAMPLE_RATE, Hibari
    except ImportError:
        return None
    audio = np.asarray(Hibari(threads=1)(UTTERANCE), dtype=np.float32)
    t = np.arange(0, len(audio) / SAMPLE_RATE, 1 / 16000)
    return np.interp(t, np.arange(len(audio)) / SAMPLE_RATE, audio).astype(np.float32)


def faster_whisper_costs(model_path: str | None, device: str, repeats: int) -> dict[str, Any]:
    """Real faster-whisper (CTranslate2) in float16 on CUDA, through the service's own recognizer."""
    if importlib.util.find_spec("ctranslate2") is None or importlib.util.find_spec("faster_whisper") is None:
        return {"skipped": "ctranslate2 / faster-whisper are not installed in this Python"}
    import ctranslate2

    cuda_devices = ctranslate2.get_cuda_device_count()
    if device == "cuda" and cuda_devices == 0:
        return {"skipped": "CTranslate2 sees no CUDA device (its wheels need the CUDA 12 runtime and cuDNN 9)"}
    if not model_path:
        return {"skipped": "no --asr-model given (a faster-whisper model folder)",
                "ctranslate2_cuda_devices": cuda_devices}
    from models.config import AsrConfig
    from models.speech.asr_faster_whisper import FasterWhisperRecognizer

    audio = utterance_audio()
    if audio is None:
        return {"skipped": "hibari is not installed, so there is no utterance to transcribe"}
    ct2_device, compute = ("cuda", "float16") if device == "cuda" else ("cpu", "int8")
    recognizer = FasterWhisperRecognizer(AsrConfig(model=model_path, device=ct2_device, compute_type=compute))
    text = recognizer.transcribe(audio)
    samples = measure(lambda: recognizer.transcribe(audio), repeats, lambda: None, warmup=1)
    return {"model": model_path, "device": ct2_device, "compute_type": compute, "beam_size": 5,
            "audio_s": round(len(audio) / 16000, 2), "text": text, "transcribe_ms": ms(samples),
            "samples": raw(samples)}


# ------------------------------------------------------------------------------ CPU of the GPU host

def turn_model_costs(path: str | None, repeats: int) -> dict[str, Any]:
    """The end-of-turn model as the service runs it (SmartTurn.probability: NumPy features of the last
    8 s, then ONNX Runtime), and its feature extraction alone."""
    if not path or not Path(path).exists():
        return {"skipped": "no --turn-model file (smart-turn-v3.2-cpu.onnx)"}
    import numpy as np

    from models.speech.turn_smart import SmartTurn, last_seconds, log_mel

    audio = np.random.default_rng(0).standard_normal(3 * 16000).astype(np.float32) * 0.1
    features = measure(lambda: log_mel(last_seconds(audio)), repeats, lambda: None)
    result: dict[str, Any] = {"model": Path(path).name, "window_s": 8, "runtime": "onnxruntime, CPU",
                              "features_ms": ms(features), "samples": {"features": raw(features)}}
    for threads in (1, 4):
        model = SmartTurn(path, threads=threads)
        samples = measure(functools.partial(model.probability, audio), repeats, lambda: None, warmup=10)
        result[f"threads_{threads}_ms"] = ms(samples)
        result["samples"][f"threads_{threads}"] = raw(samples)
    return result


def tts_costs(repeats: int) -> dict[str, Any]:
    """hibari's first audio for short first phrases (what HibariSynthesizer.synthesize yields first)."""
    try:
        from hibari import Hibari
    except ImportError:
        return {"skipped": "hibari is not installed"}
    result: dict[str, Any] = {"engine": "hibari 0.2.1 (Kokoro-82M int8 ONNX)", "runtime": "onnxruntime, CPU",
                              "phrases": FIRST_PHRASES}
    for threads in (1, 4):
        tts = Hibari(threads=threads)
        tts("Warm up.")
        samples: list[float] = []
        for _ in range(repeats):
            for phrase in FIRST_PHRASES:
                started = time.perf_counter()
                next(iter(tts.stream(phrase)))
                samples.append(time.perf_counter() - started)
        result[f"threads_{threads}_first_audio_ms"] = ms(samples)
        result.setdefault("samples", {})[f"threads_{threads}"] = raw(samples)
    return result


# ---------------------------------------------------------------------------------------- reporting

def report(results: dict[str, Any], clause_tokens: int) -> None:
    m = results["machine"]
    print(f"GPU: {m.get('gpu', 'none')}  ({m.get('gpu_memory_gib', '-')} GiB, capability {m.get('capability', '-')})")
    print(f"CPU: {m['cpu']}")
    print(f"torch {m['torch']} (CUDA {m['cuda']}), transformers {m['transformers']}, onnxruntime {m['onnxruntime']}, "
          f"ctranslate2 {m['ctranslate2']}, Python {m['python']}, {m['date']}")
    print("All PyTorch rows: random weights, PyTorch eager unless marked graphed; not vLLM, not CTranslate2.\n")
    fw = results["asr"]["faster_whisper"]
    print("ASR, real faster-whisper (CTranslate2):", fw.get("skipped") or
          f"{fw['model']} on {fw['device']} ({fw['compute_type']}, beam {fw['beam_size']}): {fw['transcribe_ms']} ms "
          f"for {fw['audio_s']} s of speech")
    print(f"\n{'Whisper architecture':<24}{'params':>9}{'encoder 30 s':>14}{'b1 decode':>11}{'b1 /tok':>9}"
          f"{'b1 total':>10}{'b5 decode':>11}{'b5 /tok':>9}{'b5 total':>10}  (ms, medians; {WHISPER_PROMPT} prompt "
          f"+ {WHISPER_STEPS} decoded tokens)")
    for w in results["asr"]["whisper_torch"]:
        print(f"{w['arch']:<24}{w['params_m']:>8}M{w['encoder_ms']:>14}{w['batch_1_decode_ms']:>11}"
              f"{w['batch_1_per_token_ms']:>9}{w['batch_1_ms']:>10}{w['batch_5_decode_ms']:>11}"
              f"{w['batch_5_per_token_ms']:>9}{w['batch_5_ms']:>10}")
    print(f"{'  graphed decoder step':<24}{'':>9}{'':>14}{'b1 step':>11}{'':>9}{'b1 total':>10}{'b5 step':>11}{'':>9}"
          f"{'b5 total':>10}  (total = encoder + {WHISPER_STEPS + 1} graphed steps: derived)")
    for w in results["asr"]["whisper_torch"]:
        print(f"  {w['arch']:<22}{'':>9}{'':>14}{w.get('batch_1_graphed_step_ms', '-')!s:>11}{'':>9}"
              f"{w.get('batch_1_graphed_total_ms', '-')!s:>10}{w.get('batch_5_graphed_step_ms', '-')!s:>11}{'':>9}"
              f"{w.get('batch_5_graphed_total_ms', '-')!s:>10}")
        for key in ("batch_1_graphed_error", "batch_5_graphed_error"):
            if key in w:
                print(f"    {key}: {w[key]}")
    first = results["llm"][0] if results["llm"] else None
    if first:
        print(f"\nLLM, bfloat16, context {first['context']} tokens cached + {first['new_tokens']} new (ms, medians)")
    batch = results["args"]["batch"]
    print(f"{'':<28}{'':>8}{'eager':>14}{'':>14}{'':>8}{'':>12}{'graphed':>14}")
    print(f"{'architecture':<28}{'params':>8}{'cold prefill':>14}{'turn prefill':>14}{'step':>8}{'5-tok pass':>12}"
          f"{'turn prefill':>14}{'step':>8}{'5-tok pass':>12}{f'step x{batch}':>10}{'clause eager':>14}"
          f"{'clause graphed':>16}")
    for r in results["llm"]:
        g = r["graphed"]
        clause_eager = round(r["cached_turn_prefill_ms"] + (clause_tokens - 1) * r["decode_step_ms"], 1)
        clause_graph = (round(g["turn_prefill_ms"] + (clause_tokens - 1) * g["pass_1_ms"], 1)
                        if "pass_1_ms" in g and "turn_prefill_ms" in g else "-")
        r["first_clause_derived_ms"] = {"eager": clause_eager, "graphed": clause_graph, "tokens": clause_tokens}
        print(f"{r['arch']:<28}{r['params_b']:>7}B{r['cold_prefill_ms']:>14}{r['cached_turn_prefill_ms']:>14}"
              f"{r['decode_step_ms']:>8}{r['verify_pass_ms']:>12}{g.get('turn_prefill_ms', '-')!s:>14}"
              f"{g.get('pass_1_ms', '-')!s:>8}{g.get(f'pass_{VERIFY_TOKENS}_ms', '-')!s:>12}"
              f"{g.get(f'batch_{batch}_pass_1_ms', '-')!s:>10}{clause_eager:>14}{clause_graph!s:>16}")
        for key, value in g.items():
            if key.endswith("_error"):
                print(f"    graphed {key}: {value}")
    print(f"(clause = turn prefill + {clause_tokens - 1} single steps, plain decoding, no speculation: derived from "
          "the measured columns)")
    t = results["turn_model"]
    print("\nEnd-of-turn model (CPU):", t.get("skipped") or
          f"{t['model']}: {t['threads_1_ms']} ms on 1 thread, {t['threads_4_ms']} ms on 4 "
          f"(of which NumPy features {t['features_ms']} ms)")
    s = results["tts"]
    print("First-phrase TTS (CPU):", s.get("skipped") or
          f"hibari first audio {s['threads_1_first_audio_ms']} ms on 1 thread, {s['threads_4_first_audio_ms']} ms on 4")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--llm", nargs="*", default=list(QWEN), choices=list(QWEN))
    parser.add_argument("--whisper", nargs="*", default=list(WHISPER), choices=list(WHISPER))
    parser.add_argument("--context", type=int, default=1500, help="tokens already in the conversation")
    parser.add_argument("--new-tokens", type=int, default=40, help="the new turn's tokens, prefilled at request time")
    parser.add_argument("--clause-tokens", type=int, default=6, help="tokens of a 2-4 word first clause")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--decode-steps", type=int, default=48)
    parser.add_argument("--graph-repeats", type=int, default=100)
    parser.add_argument("--batch", type=int, default=8, help="calls decoding at once, for the graphed batch row")
    parser.add_argument("--asr-model", help="faster-whisper model folder, timed for real in float16 on CUDA")
    parser.add_argument("--turn-model", help="smart-turn-v3.2-cpu.onnx, timed on this machine's CPU")
    parser.add_argument("--no-cpu-stages", action="store_true", help="skip the end-of-turn model and TTS")
    parser.add_argument("--smoke", action="store_true", help="no GPU needed: shrunken models on the CPU, to test "
                        "this script; the figures mean nothing")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    args = parser.parse_args()

    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' renamed arguments
    try:
        import torch
    except ImportError:
        print("gpu_budget: PyTorch is not installed, so no GPU can be seen; nothing measured.")
        return 0
    if torch.cuda.is_available():
        device = "cuda"
    elif args.smoke:
        device = "cpu"
        args.context, args.new_tokens, args.repeats, args.decode_steps, args.graph_repeats = 32, 8, 2, 3, 2
    else:
        print(f"gpu_budget: no CUDA GPU is visible to torch {torch.__version__}; nothing measured "
              "(--smoke runs the code paths on the CPU).")
        return 0
    if importlib.util.find_spec("transformers") is None:
        print("gpu_budget: transformers is not installed; nothing measured.")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = True
    results: dict[str, Any] = {"machine": header(torch, device), "smoke": device == "cpu", "args": {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    print(f"gpu_budget: {results['machine'].get('gpu', 'CPU smoke test')}", flush=True)
    results["asr"] = {"faster_whisper": faster_whisper_costs(args.asr_model, device, args.repeats), "whisper_torch": []}
    for arch in args.whisper:
        print(f"  whisper {arch} ...", flush=True)
        shape = SMOKE_WHISPER if device == "cpu" else WHISPER[arch]
        results["asr"]["whisper_torch"].append(whisper_costs(torch, arch, shape, device, args))
        free(torch, device)
    results["llm"] = []
    for arch in args.llm:
        print(f"  qwen2.5 {arch} ...", flush=True)
        results["llm"].append(llm_costs(torch, arch, SMOKE_QWEN if device == "cpu" else QWEN[arch], device, args))
        free(torch, device)
    skip = {"skipped": "--no-cpu-stages"}
    results["turn_model"] = skip if args.no_cpu_stages else turn_model_costs(args.turn_model, args.repeats * 2)
    results["tts"] = skip if args.no_cpu_stages else tts_costs(max(1, args.repeats // 5))
    for arch, entry in zip(args.llm, results["llm"], strict=True):
        print(f"  qwen2.5 {arch}, graphed ...", flush=True)
        entry["graphed"] = llm_graphed(torch, SMOKE_QWEN if device == "cpu" else QWEN[arch], device, args)
        free(torch, device)
    print()
    report(results, args.clause_tokens)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
