"""docker-compose.yml and the call store: both voice services keep calls under the voice-data volume,
record them in the demo, take a PostgreSQL URL from the host, and the `postgres` profile brings a
healthy PostgreSQL that they wait for when it runs."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.deploy.test_compose import COMPOSE_FILE, active_in, interpolate, volume_mounts

VOICE_SERVICES = ("voice-agent", "voice-agent-cpu")


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return data


def test_voice_services_keep_calls_on_a_volume_and_record_them(raw: dict[str, Any],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from app.settings import Settings

    services = interpolate(raw)["services"]
    for name in VOICE_SERVICES:
        written = raw["services"][name]["environment"]
        assert written["VOICE_AGENT_STORAGE__URL"] == "${VOICE_AGENT_STORAGE__URL:-}"
        assert written["VOICE_AGENT_STORAGE__RECORDINGS"] == "${VOICE_AGENT_STORAGE__RECORDINGS:-true}"
        env = services[name]["environment"]
        mounts = dict((target, source) for source, target in volume_mounts(services[name]))
        assert mounts[env["VOICE_AGENT_STORAGE__DATA_DIR"]] == "voice-data"
        assert services[name]["depends_on"]["postgres"] == {"condition": "service_healthy", "required": False}
        for variable, value in env.items():
            if variable.startswith("VOICE_AGENT_STORAGE__"):
                monkeypatch.setenv(variable, str(value))
        storage = Settings().storage
        assert storage.recordings and storage.url == "" and storage.data_path().as_posix() == "/data"
        assert storage.database_url() == "sqlite+aiosqlite:////data/calls.db"


def test_the_postgres_profile_brings_a_healthy_database_on_a_volume(raw: dict[str, Any]) -> None:
    compose = interpolate(raw)
    postgres = compose["services"]["postgres"]
    assert postgres["image"].startswith("postgres:16")
    assert postgres["profiles"] == ["postgres"]
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    mounts = dict((target, source) for source, target in volume_mounts(postgres))
    assert mounts["/var/lib/postgresql/data"] in compose["volumes"]
    assert "postgres" not in active_in("cpu", compose["services"]) | active_in("gpu", compose["services"])
