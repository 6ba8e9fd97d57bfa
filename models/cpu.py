"""Facts about this machine's CPU that choose defaults: usable cores and instruction-set flags."""

from __future__ import annotations

import os
import platform
import re

_FLAGS = re.compile(r"avx512[a-z_0-9]*|avx2|avx_vnni|amx[a-z_0-9]*|f16c|fma|sse4_2|asimd|sve|i8mm|bf16")


def cores() -> int:
    """CPUs this process may run on (the affinity mask, else the count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def flags() -> list[str]:
    """Instruction-set extensions the kernel lets processes use (from /proc/cpuinfo), the ones that
    matter for inference speed; empty where /proc/cpuinfo is not available."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return []
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return sorted(set(_FLAGS.findall(line.split(":", 1)[1])))
    return []


def model_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe() -> str:
    """One line for benchmark headers and the start-up log."""
    return f"{model_name()}, {cores()} cores, {platform.machine()}, flags: {' '.join(flags()) or 'unknown'}"
