"""The Grafana provisioning and dashboard: every panel has a data source and queries, every query
reads metrics that exist (the voice service's registry, vLLM's documented metrics, the recording
rules) and parses as PromQL (promtool), and the dashboard shows what the deployment is watched by."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.promql import GRAFANA_DIR, ROOT, known_metric_names, metric_names
from tests.needs import missing

DASHBOARD = GRAFANA_DIR / "dashboards" / "voice-agent.json"


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


@pytest.fixture(scope="module")
def datasource() -> dict[str, Any]:
    config = yaml.safe_load((GRAFANA_DIR / "provisioning" / "datasources" / "prometheus.yml").read_text())
    found: dict[str, Any] = config["datasources"][0]
    return found


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """The panels that show data (rows are only headings), including any inside collapsed rows."""
    found = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in panels(dashboard) for target in panel["targets"]]


def test_every_panel_has_the_provisioned_datasource_and_queries(
    dashboard: dict[str, Any], datasource: dict[str, Any]
) -> None:
    assert panels(dashboard)
    for panel in panels(dashboard):
        title = panel["title"]
        assert panel.get("datasource", {}).get("uid") == datasource["uid"], f"{title}: no or another data source"
        assert panel.get("targets"), f"{title}: no queries"
        for target in panel["targets"]:
            assert target.get("expr", "").strip(), f"{title}: empty query"
            assert target.get("datasource", panel["datasource"])["uid"] == datasource["uid"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), f"{title}: repeated refId"


def test_every_query_reads_metrics_that_exist(dashboard: dict[str, Any]) -> None:
    known = known_metric_names()
    for title, expr in expressions(dashboard):
        found = metric_names(expr)
        assert found, f"{title}: no metric found in {expr}"
        assert not found - known, f"{title}: unknown metrics {sorted(found - known)} in {expr}"


def test_every_query_parses_as_promql(dashboard: dict[str, Any], tmp_path: Path) -> None:
    """promtool checks each query's syntax when it is written as a recording rule."""
    promtool = shutil.which("promtool")
    if promtool is None:
        missing("promtool is not installed (Debian package prometheus)")
    grafana_variables = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
    exprs = []
    for _, expr in expressions(dashboard):
        for variable, value in grafana_variables.items():
            expr = expr.replace(variable, value)
        exprs.append(expr)
    rule_file = tmp_path / "dashboard_rules.yml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": expr} for i, expr in enumerate(exprs)]}]}))
    result = subprocess.run([promtool, "check", "rules", str(rule_file)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_shows_latency_speculation_and_calls(dashboard: dict[str, Any]) -> None:
    text = "\n".join(expr for _, expr in expressions(dashboard))
    for quantile in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({quantile}, sum by (le) (rate(voice_agent_voice_to_voice_seconds_bucket" in text
    assert "sum by (stage, le) (rate(voice_agent_stage_latency_seconds_bucket" in text
    for prefix in ("vllm:", "voice_agent_"):
        for counter in ("num_accepted_tokens_total", "num_draft_tokens_total", "num_drafts_total",
                        "num_accepted_tokens_per_pos_total"):
            assert f"{prefix}spec_decode_{counter}" in text, f"{prefix}spec_decode_{counter}"
    for metric in ("voice_agent_active_sessions", "voice_agent_turns_total", "voice_agent_interruptions_total",
                   "voice_agent_errors_total", "voice_agent_llm_tokens_per_second_bucket",
                   "vllm:generation_tokens_total"):
        assert metric in text, metric


def test_panels_do_not_overlap(dashboard: dict[str, Any]) -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, f"{panel['title']}: wider than the grid"
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_provisioning_points_at_the_compose_services(datasource: dict[str, Any], dashboard: dict[str, Any]) -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert datasource["type"] == "prometheus"
    assert datasource["url"] == "http://prometheus:9090"
    assert "prometheus" in compose["services"]

    providers = yaml.safe_load((GRAFANA_DIR / "provisioning" / "dashboards" / "dashboards.yml").read_text())
    path = providers["providers"][0]["options"]["path"]
    mounts = dict(v.split(":")[:2] for v in compose["services"]["grafana"]["volumes"])
    assert mounts.get("./docker/grafana/dashboards") == path
    assert mounts.get("./docker/grafana/provisioning") == "/etc/grafana/provisioning"
    home = compose["services"]["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{path}/{DASHBOARD.name}"
    assert dashboard["uid"] and dashboard["title"]


def test_dashboard_links_to_the_call_qa_pages(dashboard: dict[str, Any]) -> None:
    """The dashboard (and the panels about calls and latency) open the QA list of the same time range
    at ${qa_url}, a text variable; a voice-to-voice point opens the calls around it."""
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["qa_url"]["type"] == "textbox" and variables["qa_url"]["query"] == "http://localhost:8000"
    page_params = {"since", "until", "transport", "status", "min_v2v_ms", "limit", "offset", "sort", "dir", "around"}

    def check(url: str) -> dict[str, str]:
        base, _, query = url.partition("?")
        assert base == "${qa_url}/qa", url
        params = dict(part.split("=", 1) for part in query.split("&"))
        assert set(params) <= page_params, url  # what app/static/qa/list.js reads (docs/qa.md)
        return params

    [link] = [link for link in dashboard["links"] if "/qa" in link["url"]]
    assert check(link["url"]) == {"since": "${__from:date:iso}", "until": "${__to:date:iso}"}
    linked = {panel["title"] for panel in panels(dashboard) for link in panel.get("links", []) if check(link["url"])}
    assert {"Calls started (1h)", "Voice-to-voice"} <= linked
    v2v = next(panel for panel in panels(dashboard) if panel["title"] == "Voice-to-voice")
    [data_link] = v2v["fieldConfig"]["defaults"]["links"]
    assert check(data_link["url"])["around"] == "${__value.time}"


def test_a_voice_to_voice_point_links_to_its_call(dashboard: dict[str, Any], datasource: dict[str, Any]) -> None:
    """Exemplars: the service labels each voice-to-voice sample with its call id, Prometheus keeps
    them (exemplar-storage), the panel shows them and the data source turns call_id into a link."""
    v2v = next(p for p in panels(dashboard) if p.get("title") == "Voice-to-voice")
    assert any(t.get("exemplar") for t in v2v["targets"])
    destinations = datasource["jsonData"]["exemplarTraceIdDestinations"]
    assert [(d["name"], d["url"]) for d in destinations] == [("call_id", "${QA_URL}/qa/calls/$${__value.raw}")]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert "--enable-feature=exemplar-storage" in compose["services"]["prometheus"]["command"]
    assert "QA_URL" in compose["services"]["grafana"]["environment"]
