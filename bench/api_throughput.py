"""Benchmark: plain decoding speed through `POST /v1/chat/completions`, as an API client sees it.

Starts the service (its own server per model, default settings otherwise) and streams a few
chat completions with speculation off, measuring on the client: time to the first token, and
decoding speed after it (tokens after the first / seconds after the first), with the token counts
from `usage`. Medians per model.

    .venv/bin/python bench/api_throughput.py --json docs/bench/api_throughput.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models import cpu
from tests.e2e.conftest import start_server, stop_server

PROMPTS = [
    "Explain in a few sentences how a bicycle gear works.",
    "Describe a walk through a forest in autumn.",
    "Why do cats purr? Answer in a short paragraph.",
    "Tell me about the history of the printing press.",
    "What should I pack for a weekend trip to the mountains?",
]


def one(base_url: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "speculative": {"method": "off"}}
    started = time.perf_counter()
    first: float | None = None
    usage: dict[str, Any] = {}
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=120) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if first is None and any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                first = time.perf_counter()
    end = time.perf_counter()
    tokens = int(usage.get("completion_tokens", 0))
    decode = (tokens - 1) / (end - first) if first is not None and tokens > 1 and end > first else 0.0
    return {"prompt": prompt, "completion_tokens": tokens, "ttft_ms": round(1000 * ((first or end) - started), 1),
            "decode_tokens_per_second": round(decode, 2),
            "server_tokens_per_second": usage.get("speculative_decoding", {}).get("tokens_per_second")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="qwen2.5-coder-0.5b-instruct-q4_k_m,qwen2.5-coder-1.5b-instruct-q4_k_m")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--json")
    args = parser.parse_args()
    print(f"CPU: {cpu.describe()}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            server, proc = start_server(Path(tmp), {"VOICE_AGENT_LLM__MODEL": model})
            try:
                one(server.base_url, "Hello!", 8)  # warm up
                runs = [one(server.base_url, p, args.max_tokens) for p in PROMPTS]
            finally:
                stop_server(proc)
            row = {"model": model, "runs": runs,
                   "median_decode_tokens_per_second": statistics.median(r["decode_tokens_per_second"] for r in runs),
                   "median_ttft_ms": statistics.median(r["ttft_ms"] for r in runs)}
            results.append(row)
            print(f"{model:24s} decode {row['median_decode_tokens_per_second']:6.1f} tok/s (median of {len(runs)}), "
                  f"first token {row['median_ttft_ms']:.0f} ms; per run: "
                  f"{[r['decode_tokens_per_second'] for r in runs]}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), "results": results}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
