"""docker/entrypoint.sh: fetches the model packs that the settings load, then runs the service.
Run here with a stand-in `voice-agent` command that records its arguments."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.deploy.promql import ROOT

ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"


def run(tmp_path: Path, *args: str, **env: str) -> list[str]:
    """The `voice-agent` invocations the entrypoint makes, one line of arguments each."""
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    bin_dir = work / "bin"
    bin_dir.mkdir()
    log = work / "calls.log"
    fake = bin_dir / "voice-agent"
    fake.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\n')
    fake.chmod(0o755)
    python = bin_dir / "python"  # the image's `python`: this interpreter, which has the project's packages
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("VOICE_AGENT_")}
    result = subprocess.run(
        ["sh", str(ENTRYPOINT), *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**clean, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", **env},
    )
    assert result.returncode == 0, result.stderr
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture(autouse=True)
def _needs_sh() -> None:
    if shutil.which("sh") is None:
        pytest.skip("no POSIX shell")


def test_embedded_default_fetches_asr_turn_and_llm_packs_then_serves(tmp_path: Path) -> None:
    assert run(tmp_path) == ["models fetch whisper-tiny.en smart-turn-v3.2-cpu qwen2.5-coder-0.5b-instruct-q4_k_m "
                             "qwen2.5-coder-1.5b-instruct-q4_k_m", "serve"]


def test_vllm_engine_fetches_no_llm_pack(tmp_path: Path) -> None:
    calls = run(tmp_path, "serve", "--log-level", "debug", VOICE_AGENT_LLM__ENGINE="openai")
    assert calls == ["models fetch whisper-tiny.en smart-turn-v3.2-cpu", "serve --log-level debug"]
    calls = run(tmp_path, VOICE_AGENT_LLM__ENGINE="openai", VOICE_AGENT_TURN__ENGINE="off")
    assert calls == ["models fetch whisper-tiny.en", "serve"]


def test_draft_model_pack_is_fetched_and_hub_ids_are_left_alone(tmp_path: Path) -> None:
    calls = run(tmp_path, VOICE_AGENT_ASR__MODEL="small.en",
                VOICE_AGENT_LLM__MODEL="qwen2.5-coder-1.5b-instruct-q4_k_m",
                VOICE_AGENT_LLM__SPECULATIVE__METHOD="draft_model", VOICE_AGENT_TURN__ENGINE="off")
    assert calls == ["models fetch qwen2.5-coder-1.5b-instruct-q4_k_m qwen2.5-coder-0.5b-instruct-q4_k_m", "serve"]


def test_fetch_can_be_skipped_and_other_commands_pass_through(tmp_path: Path) -> None:
    assert run(tmp_path, VOICE_AGENT_SKIP_FETCH="1") == ["serve"]
    assert run(tmp_path, "models", "list") == ["models list"]
    assert run(tmp_path, "true") == []  # not a voice-agent command: run as is
