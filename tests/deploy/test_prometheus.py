"""The Prometheus configuration and rules: checked and unit-tested with promtool (Debian package
`prometheus`), and read for what matters: what is scraped, the 60 % acceptance alerts, metric names."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import yaml

from tests.deploy.promql import PROMETHEUS_DIR, ROOT, known_metric_names, metric_names, rules
from tests.needs import missing

PROMTOOL = shutil.which("promtool")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    if PROMTOOL is None:
        missing("promtool is not installed (Debian package prometheus: scripts/setup.sh --test)")
    return subprocess.run([PROMTOOL, *args], cwd=PROMETHEUS_DIR, capture_output=True, text=True, timeout=120)


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((PROMETHEUS_DIR / name).read_text())
    return data


def test_promtool_checks_the_config() -> None:
    result = promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_checks_the_rules() -> None:
    result = promtool("check", "rules", "rules.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_rule_unit_tests_pass() -> None:
    result = promtool("test", "rules", "rules_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_rule_unit_tests_cover_the_acceptance_alerts_firing_and_not() -> None:
    """rules_test.yml must keep, for each acceptance alert, a case where it fires and one where not."""
    outcomes: dict[str, set[bool]] = {}
    for case in load("rules_test.yml")["tests"]:
        for check in case.get("alert_rule_test", []):
            outcomes.setdefault(check["alertname"], set()).add(bool(check.get("exp_alerts")))
    for alert in ("VllmSpecDecodeAcceptanceLow", "EmbeddedSpecDecodeAcceptanceLow", "VoiceToVoiceP95High"):
        assert outcomes.get(alert) == {True, False}, f"{alert}: {outcomes.get(alert)}"


def test_acceptance_alerts_fire_below_60_percent_for_10_minutes() -> None:
    alerts = {rule["alert"]: rule for rule in rules() if "alert" in rule}
    for name, counters in (("VllmSpecDecodeAcceptanceLow", "vllm:spec_decode_num_"),
                           ("EmbeddedSpecDecodeAcceptanceLow", "voice_agent_spec_decode_num_")):
        rule = alerts[name]
        expr = " ".join(rule["expr"].split())
        assert f"{counters}accepted_tokens_total" in expr and f"{counters}draft_tokens_total" in expr
        assert ") < 0.6" in expr
        assert rule["for"] == "10m"


def test_rules_read_only_metrics_that_exist() -> None:
    known = known_metric_names()
    for rule in rules():
        unknown = metric_names(rule["expr"]) - known
        assert not unknown, f"{rule.get('record') or rule.get('alert')}: unknown metrics {sorted(unknown)}"


def test_prometheus_scrapes_the_voice_service_and_vllm() -> None:
    config = load("prometheus.yml")
    assert config["rule_files"] == ["rules.yml"]
    assert config["global"]["evaluation_interval"]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    voice = jobs["voice-agent"]
    assert voice["static_configs"][0]["targets"] == ["voice-agent:9100"]  # server.metrics_port: no key there
    assert voice.get("metrics_path", "/metrics") == "/metrics"
    vllm = jobs["vllm"]
    assert vllm["dns_sd_configs"][0]["names"] == ["vllm"] and vllm["dns_sd_configs"][0]["port"] == 8000

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert "vllm" in services and "voice-agent" in services
    mounts = [v.split(":")[:2] for v in services["prometheus"]["volumes"]]
    assert ["./docker/prometheus", "/etc/prometheus"] in mounts
