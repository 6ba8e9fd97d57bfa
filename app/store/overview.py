"""The dashboard's overview: per time bucket, the voice-to-voice p50/p95/p99, each mark's p50, the
speculative acceptance rate and the number of turns. Computed in Python over the window's turns
(their number is bounded by the caller)."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from typing import Any

from app.store.records import TurnRecord, as_utc
from app.store.shapes import iso
from pipeline.turns import MARKS


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), interpolated linearly between the closest ranks, as numpy's default."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return round(ordered[low] + (ordered[high] - ordered[low]) * (rank - low), 1)


def buckets(turns: Sequence[TurnRecord], since: dt.datetime, until: dt.datetime,
            bucket_s: float) -> list[dict[str, Any]]:
    """Every bucket of [since, until), empty ones included (turns 0, figures null), oldest first."""
    since, until = as_utc(since), as_utc(until)
    count = max(1, math.ceil((until - since).total_seconds() / bucket_s))
    grouped: list[list[TurnRecord]] = [[] for _ in range(count)]
    for turn in turns:
        index = int((as_utc(turn.at) - since).total_seconds() // bucket_s)
        if 0 <= index < count:
            grouped[index].append(turn)
    return [_bucket(since + dt.timedelta(seconds=i * bucket_s), group) for i, group in enumerate(grouped)]


def _bucket(start: dt.datetime, turns: list[TurnRecord]) -> dict[str, Any]:
    v2v = [v for v in (t.v2v_ms() for t in turns) if v is not None]
    stages = {mark: percentile([t.latency_ms[mark] for t in turns if mark in t.latency_ms], 50) for mark in MARKS}
    drafted = accepted = 0
    for turn in turns:
        if turn.spec:
            drafted += turn.spec.get("draft_tokens") or 0
            accepted += turn.spec.get("accepted_tokens") or 0
    return {
        "start": iso(start),
        "turns": len(turns),
        "v2v_p50": percentile(v2v, 50),
        "v2v_p95": percentile(v2v, 95),
        "v2v_p99": percentile(v2v, 99),
        "stages_p50": {mark: value for mark, value in stages.items() if value is not None},
        "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
    }
