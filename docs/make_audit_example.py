"""Regenerates docs/figures/audit_example (audit.json, report.png, output.txt): the mechanism audit example.

Usage (from the repository root): python docs/make_audit_example.py

The README and docs/guide/auditing.md show the command with ``--out audit_example`` (a folder of the
user's); this script runs the same command into the committed folder, so the figure the guide shows is
the one that command makes, and keeps what it printed at 80 columns in ``output.txt``: the output they
show is that text with rows left out where it says ``...`` (tests/test_new_user.py checks it line by
line).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "figures" / "audit_example"
COMMAND = [
    "audit", "docs/examples/noisy_mean.py:noisy_mean", "--claim", "pure:1",
    "--space", '{"shape": [10], "low": 0, "high": 2}', "--samples", "200000",
    "--classes", "halfspace,mlp,histogram",
]  # fmt: skip


def main() -> int:
    """Runs the example into docs/figures/audit_example; 0 when it certifies the violation it shows."""
    proc = subprocess.run(
        [sys.executable, "-m", "cbdp_jax.cli", *COMMAND, "--out", str(OUT)], cwd=ROOT, check=False,
        capture_output=True, text=True, env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    sys.stderr.write(proc.stderr)
    (OUT / "output.txt").write_text(proc.stdout)
    # exit status 1 = a violation certified, which is what the example shows
    return 0 if proc.returncode == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
