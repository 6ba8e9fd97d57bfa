"""Benchmark: does a new default system prompt move the end-of-turn decision?

The words' probability that the caller's sentence ends (the LLM's, read after the conversation so far)
is computed with the call's system prompt in front, and the shipped learned decision
(pipeline/turn_decision.json) was trained on probabilities read with the prompt of the day. This
replays a turn-detection run's committed evidence (docs/bench/turn_detection.json: every pause's
transcript, timings and sound) twice with the learned decision: with the probabilities as recorded,
and with each transcript weighed again under today's default prompt (pipeline.config; or another
prompt, `--prompt-file`, and another LLM pack, `--pack`, with the time each weighing took), side by side,
tuned and held-out families apart. The VAD windows are rebuilt from each pause's first and last window
(32 ms apart, silence counted from the pause's start); the first line checks that the recorded
probabilities reproduce the run's own decisions so.

    .venv/bin/python bench/turn_prompt_shift.py --json docs/bench/turn_prompt_shift.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.turn_detection import AUDIO_MS, TUNED_FAMILIES, Method, Replay, score
from bench.turn_evidence import WINDOW_MS, Pause, WordsJudge
from models import cpu
from pipeline.config import DEFAULT_SYSTEM_PROMPT, EndpointingConfig
from pipeline.turn_model import load_turn_model

RUN = Path(__file__).resolve().parents[1] / "docs" / "bench" / "turn_detection.json"


def pauses_of(sample: dict[str, Any]) -> list[Pause]:
    out = []
    for p in sample["pauses"]:
        windows = list(np.arange(p["at_ms"], p["last_window_ms"] + 1e-6, WINDOW_MS))
        out.append(Pause(p["sample"], p["at_ms"], p["silence_from_ms"], windows,
                         [w - p["silence_from_ms"] for w in windows], p["p_audio"], p["p_text"], p["words"],
                         p["audio_ms"], p["asr_ms"], p["llm_ms"], p.get("avg_logprob"), p.get("no_speech_prob"),
                         p.get("speech_ms", 0.0)))
    return out


def replays(samples: list[dict[str, Any]], audio_ms: float, p_text: dict[str, float | None] | None) -> list[Replay]:
    out = []
    for s in samples:
        pauses = pauses_of(s)
        if p_text is not None:
            pauses = [replace(p, p_text=p_text.get(p.words)) if p.words else p for p in pauses]
        sample = SimpleNamespace(id=s["id"], kind=s["kind"], pause_s=s["pause_s"], true_end_ms=s["true_end_ms"])
        out.append(Replay(sample, pauses, audio_ms))  # type: ignore[arg-type]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", default=str(RUN), help="a bench/turn_detection.py --json output")
    parser.add_argument("--pack", help="weigh with this LLM pack (default: llm.model)")
    parser.add_argument("--prompt-file", help="weigh under this system prompt (default: today's default)")
    parser.add_argument("--json")
    args = parser.parse_args()
    print(f"CPU: {cpu.describe()}")
    run = json.loads(Path(args.run).read_text())
    samples = run["samples"]
    method = Method("learned", EndpointingConfig(decision="learned", early_final_ms=run["early_final_ms"]),
                    load_turn_model(""))
    recorded = replays(samples, run.get("audio_ms", AUDIO_MS), None)
    same = sum(1 for r, s in zip(recorded, samples, strict=True)
               if (r.decide(method) or -1) == (s["decided_ms"].get("learned") or -1))
    print(f"{args.run}: {len(samples)} samples; the recorded evidence reproduces the run's learned decision for "
          f"{same} of {len(samples)}")

    words = sorted({p["words"] for s in samples for p in s["pauses"] if p["words"]})
    prompt = Path(args.prompt_file).read_text().strip() if args.prompt_file else DEFAULT_SYSTEM_PROMPT
    print(f"weighing {len(words)} transcripts with {args.pack or 'llm.model'} under "
          f"{'the given' if args.prompt_file else 'the default'} system prompt", flush=True)
    judge = WordsJudge(args.pack, prompt)
    try:
        timed = {w: judge.probability(w) for w in words}
    finally:
        judge.close()
    weighed = {w: p for w, (p, _) in timed.items()}
    took = sorted(ms for _, ms in timed.values())
    print(f"time to weigh a transcript (the LLM's part of a pause): p50 {statistics.median(took):.0f} ms, "
          f"p90 {took[int(0.9 * (len(took) - 1))]:.0f} ms")
    old = {p["words"]: p["p_text"] for s in samples for p in s["pauses"] if p["words"]}
    pairs = [(old[w], weighed[w]) for w in words if old[w] and weighed[w]]
    shift = [math.log(b) - math.log(a) for a, b in pairs]
    corr = float(np.corrcoef([math.log(a) for a, _ in pairs], [math.log(b) for _, b in pairs])[0, 1])
    print(f"log-probability, new minus recorded: median {statistics.median(shift):+.3f}, "
          f"p10 {np.percentile(shift, 10):+.3f}, p90 {np.percentile(shift, 90):+.3f}; correlation {corr:.3f}")
    now = replays(samples, run.get("audio_ms", AUDIO_MS), weighed)
    tuned_voices = set(run["tuned_voices"])
    groups = {"tuned": lambda s: s.id.split("/")[0] in tuned_voices,
              "held out": lambda s: s.id.split("/")[0] not in tuned_voices}
    print(f"\n{'families':9s} {'prompt':9s} {'cut@0.6s':>9} {'(95% up)':>9} {'cut all':>8} {'p50 ms':>7} "
          f"{'p90 ms':>7} {'>700ms':>7}")
    table: dict[str, Any] = {}
    for name, chosen in groups.items():
        for label, group in (("recorded", recorded), ("weighed", now)):
            s = score([r for r in group if chosen(r.sample)], method)
            table[f"{name} / {label}"] = s
            print(f"{name:9s} {label:9s} {s['cut_off_600_pct']:8}% {s['cut_off_600_upper_pct']:8}% "
                  f"{s['cut_off_pct']:7}% {s['p50_ms']:7} {s['p90_ms']:7} {s['late_pct']:6}%")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "cpu": cpu.describe(), "run": args.run, "pack": args.pack or "llm.model", "prompt": prompt,
            "weigh_ms_p50": statistics.median(took), "reproduced": [same, len(samples)],
            "tuned_families": list(TUNED_FAMILIES), "log_shift_median": statistics.median(shift),
            "correlation": corr, "table": table, "weighed": weighed}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
