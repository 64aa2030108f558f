"""What the one-run critics family costs a correct training's bounds (issue 50).

The default family (the score and the step-difference critic ``steps-max``) audits each critic at
level 1 - beta / 2 instead of 1 - beta. On a correct DP-SGD run the step critic is nearly blind, so
the family's bound is the score's at 0.975 where the plain audit (``critics=('score',)``) had it at
0.95. Both come from the same run (same key: the family only changes the bounds), so "before" is
one_run_audit on the run's own scores at 0.95 and "after" the family's bound.

Setting (cheap): 200 digits, MLP with 64 hidden units (704 coordinates no example moves), m = 700
coordinate canaries, q = 0.05, T = 100, the accountant's eps 2, 4, 8 at delta 1e-5; R keys each
(vmapped, ``one_run_repeats``).

  python benchmarks/one_run_critics_cost.py [--runs R]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import jax
import numpy as np

from cbdp_jax import training_audit as ta
from cbdp_jax._src.infra.io import git_commit
from cbdp_jax.one_run import one_run_audit
from cbdp_jax.training_audit import dpsgd_noise

OUT = Path(__file__).parent / "measured" / "one-run-training" / "critics-cost.json"
FINITE = ("steinke", "fdp", "gdp")


def problem(eps: float):
    noise = dpsgd_noise(eps, 1e-5, 0.05, 100)
    p = ta.build_problem(model="mlp", data="digits", n=200, noise=noise, rate=0.05, steps=100,
                         learning_rate=0.5)  # fmt: skip
    return dataclasses.replace(p, model=ta.make_model("mlp", 64, 10, hidden=64))


def row(eps: float, runs: int) -> dict:
    res = ta.one_run_repeats(jax.random.key(int(eps)), problem(eps), runs, canaries=700, chunk=4)
    out = {"eps_target": eps, "claim": res[0].claim_epsilon, "runs": runs,
           "critics": list(res[0].critics)}  # fmt: skip
    for k in FINITE + ("gaussian-scores",):
        before = [one_run_audit(r.scores, r.coins, method=k).epsilon for r in res]
        after = [r.bounds[k]["epsilon"] or 0.0 for r in res]
        by = [r.bounds[k]["critic"] for r in res]
        out[k] = {"before": before, "after": after, "median_before": float(np.median(before)),
                  "median_after": float(np.median(after)), "critic": by}  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--eps", type=float, nargs="+", default=[2.0, 4.0, 8.0])
    args = ap.parse_args()
    t = time.perf_counter()
    rows = []
    for eps in args.eps:
        rows.append(row(eps, args.runs))
        print(json.dumps(rows[-1]), flush=True)
    meta = {"command": " ".join(["python", "benchmarks/one_run_critics_cost.py", *sys.argv[1:]]),
            "seconds": time.perf_counter() - t, "load": os.getloadavg(), "commit": git_commit()}  # fmt: skip
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"rows": rows, "meta": meta}, indent=2, default=float))


if __name__ == "__main__":
    main()
