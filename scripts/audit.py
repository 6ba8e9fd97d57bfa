"""The dependency audit of scripts/test.sh: pip-audit over the installed environment (the project
itself, installed editable, is skipped), against pip-audit's default vulnerability service.

- A known vulnerability fails the audit (exit 1), unless scripts/audit-ignore.txt lists its id
  with a reason (one `ID  reason` a line; `#` starts a comment). An entry without a reason is an error.
- When the vulnerability service cannot be reached, or audits none of the packages (a machine that
  reaches only a package mirror), the audit prints a WARNING and passes: it cannot tell, and a
  network outage must not fail the tests. docs/reliability.md says why.

    .venv/bin/python scripts/audit.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
IGNORE_FILE = ROOT / "scripts" / "audit-ignore.txt"


@dataclass(frozen=True)
class Verdict:
    ok: bool
    message: str


def read_ignores(text: str) -> dict[str, str]:
    """`ID  reason` lines -> {id: reason}; a line without a reason raises ValueError."""
    ignores: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split(None, 1)
        if len(parts) < 2:
            raise ValueError(f"{IGNORE_FILE.name} line {number}: {parts[0]} has no reason; write `ID  reason`")
        ignores[parts[0]] = parts[1]
    return ignores


def judge(report: dict[str, Any]) -> Verdict:
    """pip-audit's JSON report -> pass or fail, with what to print."""
    deps = report.get("dependencies", [])
    audited = [d for d in deps if "skip_reason" not in d]
    vulnerable = [d for d in audited if d.get("vulns")]
    if vulnerable:
        lines = [f"  {d['name']} {d['version']}: {v['id']} (fixed in {', '.join(v.get('fix_versions') or ['-'])})"
                 for d in vulnerable for v in d["vulns"]]
        return Verdict(False, "known vulnerabilities (fix them, or list them with a reason in "
                              f"scripts/{IGNORE_FILE.name}):\n" + "\n".join(lines))
    if not audited:
        return Verdict(True, f"WARNING: the vulnerability service audited none of the {len(deps)} packages "
                             "(unreachable from here?): dependencies NOT audited")
    skipped = len(deps) - len(audited)
    extra = f"; {skipped} not found by the service and not audited" if skipped else ""
    return Verdict(True, f"{len(audited)} packages audited: no known vulnerabilities{extra}")


def main() -> int:
    try:
        ignores = read_ignores(IGNORE_FILE.read_text() if IGNORE_FILE.exists() else "")
    except ValueError as exc:
        print(f"audit: {exc}", file=sys.stderr)
        return 1
    command = [str(Path(sys.executable).parent / "pip-audit"), "--skip-editable", "--format", "json",
               "--progress-spinner", "off"]
    for vuln in ignores:
        command += ["--ignore-vuln", vuln]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    try:
        report = json.loads(run.stdout)
    except json.JSONDecodeError:
        last = (run.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"audit: WARNING: pip-audit could not run its audit ({last[:300]}): dependencies NOT audited")
        return 0
    verdict = judge(report)
    for vuln, reason in ignores.items():
        print(f"audit: ignoring {vuln}: {reason}")
    print(f"audit: {verdict.message}")
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
