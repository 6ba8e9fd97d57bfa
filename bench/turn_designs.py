"""Benchmark: two designs of the learned end-of-turn decision that are not shipped, side by side with
the shipped design, on bench/turn_detection.py's set and evidence (issue 31):

- the turn's prosody at the pause (pipeline/prosody.py: where the pitch ends in the caller's range
  and how it moves, the last voiced stretch's length, the fade), first alone (how well each measure
  tells a caller's true end from a pause inside a cut turn, per voice family: the area under the ROC
  curve, 0.5 = no better than chance), then as features of the decision;
- gradient-boosted trees (scikit-learn's HistGradientBoostingClassifier, depth 3) in place of the
  logistic regression, over the same features.

Every design is trained and its patience curve chosen on the tuned families named (default hibari and
espeak-ng off the phone line, as the shipped file was), by bench/turn_detection.py's tuner, and
reported on the held-out families (flite, Piper, each also on the phone, human readings), with each
design's trade-off as its sure_probability turns. The evidence is bench/turn_detection.py's cache
(gathered on first use, ~25 min on 2 cores).

    pip install scikit-learn   # the trees only; not a dependency of the service
    .venv/bin/python bench/turn_designs.py --json docs/bench/turn_designs.json > docs/bench/turn_designs.txt
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.turn_detection import AUDIO_MS, LEARNED_GRID, TUNED_FAMILIES, Method, Replay, best_of, score
from bench.turn_evidence import gather, measure_prosody
from bench.turn_set import HELD_OUT, HUMAN_MIN_S, TUNED, build_set, pick_voices
from bench.turn_train import TEXT_FEATURES, is_final, rows, train
from bench.voices import Renderer, families, human_utterances
from models import cpu
from pipeline import prosody
from pipeline.config import EndpointingConfig
from pipeline.turn_model import PROSODY_FEATURES, TurnModel, features
from pipeline.turn_policy import Evidence

SURES = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98)
LEFT_OUT = ("asr_last_word", "asr_end_mark")  # as shipped: asr.end_confidence is off


@dataclasses.dataclass(frozen=True)
class TreeDecision:
    """Trees in the learned decision's place (a TurnModel's interface, for the replay)."""

    predict: Callable[[np.ndarray], np.ndarray]
    names: tuple[str, ...]
    cache: dict[Any, float]
    sure_probability: float = 0.9
    doubt_probability: float = 0.1
    max_patience_ms: int = 1500
    hold_ms: int = 0
    hears = False

    def probability(self, evidence: Evidence) -> float:
        key = (evidence.text, evidence.words, evidence.asr_logprob, evidence.prosody)
        if key not in self.cache:
            f = features(evidence)
            self.cache[key] = float(self.predict(np.array([[f[n] for n in self.names]]))[0, 1])
        return self.cache[key]

    def wait_ms(self, p: float) -> float:
        return TurnModel.wait_ms(self, p)  # type: ignore[arg-type]  # the same curve, duck-typed


def auc(scores: list[float], labels: list[bool]) -> float | None:
    """The area under the ROC curve of `scores` for `labels` (ties count a half)."""
    pos = np.array([s for s, y in zip(scores, labels, strict=True) if y])
    neg = np.array([s for s, y in zip(scores, labels, strict=True) if not y])
    if not len(pos) or not len(neg):
        return None
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return round(float(greater) / (len(pos) * len(neg)), 3)


def separability(replays: list[Replay]) -> dict[str, dict[str, Any]]:
    """Per family: each prosody measure's AUC for "the caller's true end" against "a pause inside a
    cut turn" (complete turns' pauses at a comma left out)."""
    out: dict[str, dict[str, Any]] = {}
    for family in sorted({r.sample.family for r in replays}):
        points = [(p.prosody, is_final(r.sample, p)) for r in replays if r.sample.family == family
                  for p in r.pauses if p.prosody is not None and (r.sample.kind != "complete" or is_final(r.sample, p))]
        labels = [final for _, final in points]
        out[family] = {"ends": sum(labels), "cut_pauses": len(labels) - sum(labels),
                       **{n: auc([m[n] for m, _ in points], labels) for n in prosody.NAMES}}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tune-on", default="hibari,espeak", help="the tuned families to train and choose on")
    parser.add_argument("--early-final-ms", type=int, default=64)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    from sklearn.ensemble import HistGradientBoostingClassifier  # the trees' design only

    began = time.perf_counter()
    print(f"CPU: {cpu.describe()}")
    found = families()
    voices = pick_voices(found, TUNED) + pick_voices(found, HELD_OUT)
    samples, _ = build_set(voices, human_utterances(min_s=HUMAN_MIN_S), Renderer(), None)
    evidence = gather(samples, args.early_final_ms)
    measure_prosody(samples, evidence)
    replays = [Replay(s, evidence[s.id], AUDIO_MS) for s in samples]
    tune_on = tuple(args.tune_on.split(","))
    tuned = {f: [r for r in replays if r.sample.family == f] for f in tune_on}
    held = [r for r in replays if r.sample.family not in TUNED_FAMILIES]
    pairs = [(r.sample, p) for rs in tuned.values() for r in rs for p in r.pauses]
    base = EndpointingConfig(early_final_ms=args.early_final_ms, decision="learned")
    print(f"{len(samples)} samples; tuned on {', '.join(tune_on)}; held out: {len(held)} samples of "
          f"{', '.join(sorted({r.sample.family for r in held}))}")

    apart = separability(replays)
    print("\nPROSODY ALONE: AUC of each measure, the caller's true end against a pause inside a cut turn "
          "(0.5 = chance; under 0.5: the other way round)")
    print(f"  {'family':<14}{'ends':>6}{'cuts':>6}" + "".join(f"{n:>15}" for n in prosody.NAMES))
    for family, a in apart.items():
        print(f"  {family:<14}{a['ends']:>6}{a['cut_pauses']:>6}" + "".join(f"{a[n]!s:>15}" for n in prosody.NAMES))

    def logistic(with_prosody: bool) -> list[Method]:
        model = train(pairs, False, f"{args.tune_on}", LEFT_OUT, with_prosody)
        return [Method("lr", base, TurnModel(model.weights, s, d, int(p), model.trained_on, int(h)))
                for s, d, p, h in itertools.product(*LEARNED_GRID.values()) if d <= s]

    def trees(with_prosody: bool) -> list[Method]:
        names = tuple(n for n in (*TEXT_FEATURES, *(PROSODY_FEATURES if with_prosody else ())) if n not in LEFT_OUT)
        x, y = rows(pairs, names, False)
        fitted = HistGradientBoostingClassifier(max_depth=3, max_iter=150, learning_rate=0.05,
                                                l2_regularization=1.0, min_samples_leaf=40, random_state=0).fit(x, y)
        cache: dict[Any, float] = {}
        return [Method("trees", base, TreeDecision(fitted.predict_proba, names, cache, s, d, p, h))  # type: ignore[arg-type]
                for s, d, p, h in itertools.product(*LEARNED_GRID.values()) if d <= s]

    designs: dict[str, Any] = {}
    print("\nHELD OUT, each design as chosen on the tuned families, then its sure_probability turned:")
    makers: tuple[tuple[str, Callable[[], list[Method]]], ...] = (
        ("logistic (as shipped)", lambda: logistic(False)), ("logistic + prosody", lambda: logistic(True)),
        ("trees", lambda: trees(False)), ("trees + prosody", lambda: trees(True)))
    for name, make in makers:
        method, on_tuned, _ = best_of(tuned, make())
        m = method.model
        assert m is not None
        chosen = score(held, method)
        points = [{"sure_probability": sure,
                   **score(held, Method(name, base, dataclasses.replace(
                       m, sure_probability=sure, doubt_probability=min(m.doubt_probability, sure))))}
                  for sure in SURES]
        designs[name] = {"chosen": {"sure_probability": m.sure_probability, "doubt_probability": m.doubt_probability,
                                    "hold_ms": m.hold_ms, "max_patience_ms": m.max_patience_ms},
                         "on_tuned": on_tuned, "held_out": chosen, "curve": points}
        print(f"  {name}: sure {m.sure_probability:g}, doubt {m.doubt_probability:g}, hold {m.hold_ms} ms -> "
              f"cut-offs at 0.6 s {chosen['cut_off_600_pct']}% (95 % upper {chosen['cut_off_600_upper_pct']}%), "
              f"all pauses {chosen['cut_off_pct']}%, inside complete {chosen['early_pct']}%; "
              f"decided p50 {chosen['p50_ms']} ms, p90 {chosen['p90_ms']} ms, past 700 ms {chosen['late_pct']}%")
        print("    curve: " + "; ".join(f"sure {p['sure_probability']:g}: {p['cut_off_600_pct']}% at p50 {p['p50_ms']} "
                                      f"p90 {p['p90_ms']} (past 700 ms {p['late_pct']}%)" for p in points))
    print(f"Run took {time.perf_counter() - began:.0f} s.")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu.describe(), "tuned_on": tune_on,
                                               "early_final_ms": args.early_final_ms, "prosody_alone": apart,
                                               "designs": designs}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
