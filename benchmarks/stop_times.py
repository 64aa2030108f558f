"""Seconds from Ctrl-C (SIGINT) to exit for every long ``cbdp`` command, as a user meets them.

Each command starts as a fresh process with ``--out DIR``; SIGINT is sent ``--after`` seconds after DIR
appears (the arguments are checked and the work has begun). Recorded per command: the seconds from
the signal to the exit, the exit status (130 expected), the last line of stderr ("interrupted"), and
whether a temporary or unparsable JSON file was left behind. The tests (tests/test_interrupt.py)
assert < 2 s; this script reports the numbers.

    python benchmarks/stop_times.py --out benchmarks/measured/stop-times/summary.json
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parser, write  # noqa: E402

CBDP = [sys.executable, "-c", "import sys; from cbdp_jax.cli import console_main; console_main()"]
COMMANDS = {
    "estimate": ("estimate", "--samples", "3000000", "--steps", "200000"),
    "audit --suite": ("audit", "--suite"),
    "audit-training": ("audit-training", "--data", "worst-case", "--sampler", "shuffle", "--steps",
                       "100", "--runs", "200000"),
    "demo": ("demo",),
    "sweep": ("sweep", "--mechanism", "gaussian", "--sigma", "0.5,1,2", "--adversary", "mlp",
              "--steps", "200000"),
    "reproduce": ("reproduce", "capacity_curve", "--quick"),
}  # fmt: skip


def stop_time(args: tuple[str, ...], after: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        proc = subprocess.Popen([*CBDP, *args, "--out", str(out)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "80"})  # fmt: skip
        while not out.exists() and proc.poll() is None:
            time.sleep(0.05)
        time.sleep(after)
        if proc.poll() is not None:
            return {"error": "finished before the signal", "returncode": proc.returncode}
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        took = time.monotonic() - sent
        left = [p.name for p in out.rglob("*") if p.name.endswith(".tmp")]
        for p in out.rglob("*.json"):
            try:
                json.loads(p.read_text())
            except ValueError:
                left.append(p.name)
        lines = err.strip().splitlines()
        return {"seconds": took, "returncode": proc.returncode,
                "last_line": lines[-1] if lines else "", "partial_files": left}  # fmt: skip


def main() -> None:
    ap = parser(__doc__.splitlines()[0], "benchmarks/measured/stop-times/summary.json")
    ap.add_argument("--after", type=float, default=4.0, help="seconds of work before the signal")
    args = ap.parse_args()
    rows = []
    for name, cmd in COMMANDS.items():
        load = os.getloadavg()[0]
        row = {"command": "cbdp " + " ".join(cmd), "name": name, "load": load,
               **stop_time(cmd, args.after)}  # fmt: skip
        rows.append(row)
        print(f"{name:<16} {row.get('seconds', float('nan')):6.2f} s  exit {row.get('returncode')}"
              f"  {row.get('last_line', row.get('error'))!r}  load {load:.1f}", flush=True)  # fmt: skip
    write(args.out, "stop_times", args, {"rows": rows, "after_s": args.after})


if __name__ == "__main__":
    main()
