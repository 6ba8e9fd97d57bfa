"""What the follow-up to tool results would cost with every prompt token but the results' own at zero
cost: a replay over a bench/tool_calls.py JSON (the follow-ups' `llm_steps`). Each follow-up's first
token took `time_to_first_token_ms` for `prefill_tokens`; at its own measured cost per prefilled token,
only the result's tokens (all but the template's CLOSING ones after it) would take this much.

    .venv/bin/python bench/follow_up_replay.py docs/bench/tool_calls_issue34_after4.json
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

# "\nAnswer the caller from this result.\n</tool_response><|im_end|>\n<|im_start|>assistant\n" on Qwen2.5's
# tokenizer, and the one token the head start leaves open (models/llm/llm_embedded.py)
CLOSING = 15


def main() -> None:
    for path in sys.argv[1:]:
        results = json.loads(Path(path).read_text())["results"]
        steps = [s for r in results for s in r.get("llm_steps", []) if s["step"] > 1 and s["prefill_tokens"] > CLOSING]
        if not steps:
            print(f"{path}: no follow-up with its prefill recorded")
            continue
        first = [s["time_to_first_token_ms"] for s in steps]
        result_only = [s["time_to_first_token_ms"] / s["prefill_tokens"] * (s["prefill_tokens"] - CLOSING)
                       for s in steps]
        prefill = statistics.median(s["prefill_tokens"] for s in steps)
        print(f"{path}: {len(steps)} follow-ups; first token p50 {statistics.median(first):.0f} ms "
              f"(prefill p50 {prefill:.0f} tokens); with all but the result's tokens at zero cost "
              f"p50 {statistics.median(result_only):.0f} ms, min {min(result_only):.0f} ms")


if __name__ == "__main__":
    main()
