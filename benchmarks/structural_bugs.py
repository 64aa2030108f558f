"""Structural noise bugs at the command line's defaults, in the user's setting of issue 48.

Each row is one ``cbdp audit-training`` process, every option at its default except the setting: a
user's logistic regression on 63 examples, Poisson q = 1/8, T = 16, S = 1, C = 1 (the run's own
claim, (4.015, 1e-5) by dp_accounting's PLD) and the runs per side. The planted bugs are
``dp_sgd(bug=...)``'s (``--bug``) on 63 synthetic examples; the user-written steps are
docs/examples/key_reusing_step.py's (``--problem``, 63 digits). For each: the exit status (0 clean,
1 violation certified, 3 defect named without a violation), the defects named, the empirical eps at
delta = 1e-5 and the critic of the family's strongest row, and the CPU seconds of the process.

    python benchmarks/structural_bugs.py --runs 20000 \
        --out benchmarks/measured/structural-bugs/summary.json

The ceiling beside the figures: a statistic exactly constant under D' that moves in a share P of D's
runs certifies at most log((P_lower - delta) / Q_upper) with exact binomial bounds on the 70% of the
runs held out, at the family's level (docs/theory/training_audit.md, section 10).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path

SETTING = [
    "--data", "synthetic", "--examples", "63", "--sampler", "poisson", "--rate", "0.125",
    "--steps", "16", "--noise", "1",
]  # fmt: skip
CASES = {
    "key-reuse": ["--bug", "key-reuse", *SETTING],
    "scalar-noise": ["--bug", "scalar-noise", *SETTING],
    "noise-every-other-step": ["--bug", "noise-every-other-step", *SETTING],
    "shared-noise-across-leaves": ["--bug", "shared-noise-across-leaves", *SETTING],
    "none": ["--bug", "none", *SETTING],
    "user key-reusing step": ["--problem", "docs/examples/key_reusing_step.py:reusing_problem"],
    "user correct step": ["--problem", "docs/examples/key_reusing_step.py:correct_problem"],
}


def _ceiling(p_in: float, n_test: int, family: int, delta: float = 1e-5) -> float:
    from cbdp_jax._src.statistics import binomial
    from cbdp_jax.statistics import family_confidence

    share = (1.0 - family_confidence(0.95, family)) / 2.0
    q_up = float(binomial.clopper_pearson_upper(0, n_test, 1.0 - share))
    p_lo = float(binomial.clopper_pearson_lower(round(p_in * n_test), n_test, 1.0 - share))
    return math.log((p_lo - delta) / q_up)


def run_case(name: str, args: list[str], runs: int) -> dict:
    cmd = [sys.executable, "-m", "cbdp_jax.cli", "audit-training", *args, "--runs", str(runs),
           "--format", "json"]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    row = {"case": name, "command": "cbdp audit-training " + " ".join(args) + f" --runs {runs}",
           "exit": proc.returncode, "wall_s": round(time.perf_counter() - start, 1),
           "cpu_s": round(cpu, 1)}  # fmt: skip
    try:
        out = json.loads(proc.stdout)
    except json.JSONDecodeError:
        row["stderr"] = proc.stderr[-500:]
        return row
    audit = out.get("audit", out)
    rows = audit.get("certified_bounds", [])
    best = max(rows, key=lambda r: (r["lower_bound"] or -1e9) - (r["claimed"] or 0), default={})
    row |= {
        "claim_eps": (audit.get("claimed") or {}).get("epsilon"),
        "empirical_eps": (audit.get("empirical") or {}).get("epsilon"),
        "violation": audit.get("violation"), "family": audit.get("family_size"),
        "defects": [d["kind"] for d in audit.get("defects", [])],
        "strongest_critic": best.get("critic"),
    }  # fmt: skip
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20_000)
    ap.add_argument("--cases", nargs="*", default=list(CASES))
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    rows = []
    for name in a.cases:
        rows.append(run_case(name, CASES[name], a.runs))
        print(json.dumps(rows[-1]), flush=True)
        if a.out:
            a.out.parent.mkdir(parents=True, exist_ok=True)
            family = next((r["family"] for r in rows if r.get("family")), 52)
            n_test = a.runs - int(0.3 * a.runs)
            p_in = 1.0 - (7 / 8) ** 16 - (1 / 8) ** 16  # in some but not all of 16 batches
            summary = {"runs_per_side": a.runs, "ceiling_key_reuse": _ceiling(p_in, n_test, family),
                       "rows": rows}  # fmt: skip
            a.out.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
