"""What the reliability benchmarks share: printing their table and saving it with its raw rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from models import cpu


def publish(text: str, rows: list[dict[str, Any]], out: str | None) -> None:
    """Print the table; with `out`, also write OUT.txt (the table) and OUT.json (the machine and rows)."""
    print(text)
    if out:
        Path(out + ".json").write_text(json.dumps({"machine": cpu.describe(), "rows": rows}, indent=2) + "\n")
        Path(out + ".txt").write_text(text + "\n")
