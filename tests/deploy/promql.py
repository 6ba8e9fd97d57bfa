"""Helpers for the deployment tests: paths, metric names found in PromQL, and the metric names that
really exist (the voice service's registry, vLLM's documented metrics, the recording rules)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
PROMETHEUS_DIR = DOCKER / "prometheus"
GRAFANA_DIR = DOCKER / "grafana"

# vLLM's Prometheus metrics that the dashboard and rules may use (see shared/DESIGN.md).
VLLM_METRICS = frozenset({
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:generation_tokens_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:gpu_cache_usage_perc",
    # The current name of the KV-cache usage gauge: vLLM deprecated vllm:gpu_cache_usage_perc in
    # favour of it (vllm-project/vllm#18354) and then removed the old name (#29330), so the pinned
    # vLLM image exports only this one.
    "vllm:kv_cache_usage_perc",
})

# Gauges the voice service derives from vLLM's counters and re-exports beside its own metrics; they
# come from its vLLM metrics reader (the OpenAI-compatible LLM backend), not from app/metrics.py.
VLLM_READER_GAUGES = frozenset({
    "voice_agent_vllm_spec_decode_acceptance_rate",
    "voice_agent_vllm_spec_decode_mean_acceptance_length",
})

# Series Prometheus makes itself.
PROMETHEUS_SERIES = frozenset({"up"})

_KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless",
    "inf", "nan", "start", "end",
})
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_TEMPLATE_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w:.])[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are not function calls, keywords,
    label names (in matchers or by/without/on/ignoring lists), strings, durations or numbers."""
    text = _STRING.sub('""', expr)
    text = _TEMPLATE_VARIABLE.sub("5m", text)  # Grafana's $__rate_interval and the like
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        name = match.group()
        if name.lower() in _KEYWORDS:
            continue
        if text[match.end():].lstrip().startswith("("):
            continue  # a function or aggregation
        names.add(name)
    return names


def service_metric_names() -> set[str]:
    """The series names the voice service exports, from its own registry: counters as <name>_total,
    histograms as <name>_bucket, _sum and _count, gauges as they are."""
    from app.metrics import Metrics

    names: set[str] = set()
    for family in Metrics().registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        elif family.type == "summary":
            names.update((family.name, f"{family.name}_sum", f"{family.name}_count"))
        else:
            names.add(family.name)
    return names


def load_rules() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((PROMETHEUS_DIR / "rules.yml").read_text())
    return data


def rules() -> list[dict[str, Any]]:
    return [rule for group in load_rules()["groups"] for rule in group["rules"]]


def recording_rule_names() -> set[str]:
    return {rule["record"] for rule in rules() if "record" in rule}


def known_metric_names() -> set[str]:
    return service_metric_names() | VLLM_METRICS | VLLM_READER_GAUGES | PROMETHEUS_SERIES | recording_rule_names()
