"""How close a gradient-canary audit of correct DP-SGD gets to the accountant, as the runs grow.

Synthetic data (63 examples + the canary), logistic regression, the library's DP-SGD step, Poisson
q = 1/8, T = 16 steps, noise S = 1, the gradient canary along a coordinate no example moves (so the
score's law is exactly the T-fold Poisson-subsampled Gaussian). For each run count the audit of the
run's own ``dpsgd:`` claim reports the empirical epsilon at delta = 1e-5 and the certified lower bound
on delta(eps) at each grid point, next to the accountant's delta(eps) there (PLD, an upper bound that
is tight for this mechanism). Correct runs: no violation, and bounds below the accountant's curve.

    python benchmarks/training_audit_tightness.py --out benchmarks/measured/training-throughput/tightness.json
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
import jax  # noqa: E402

from cbdp_jax import training_audit as ta  # noqa: E402
from cbdp_jax.audit import parse_claim  # noqa: E402

SETTING = dict(data="synthetic", n=63, sampler="poisson", rate=0.125, steps=16, noise=1.0)


def one(runs: int, seed: int) -> dict:
    problem = ta.build_problem(**(SETTING | {"chunk": 4096}))
    claim = parse_claim(ta.default_claim(problem))
    config = ta.training_audit_config(claim.epsilon, samples=runs)
    t0 = time.perf_counter()
    result = ta.audit_training(jax.random.key(seed), problem, config=config)
    curve = [
        {"epsilon": e, "certified": b, "accountant": claim.source.delta_at(e)}
        for e, b in result.empirical.curve
    ]
    return {
        "runs_per_side": runs, "seed": seed, "violation": result.violation,
        "claimed_epsilon": claim.epsilon, "empirical_epsilon": result.empirical.epsilon,
        "gdp_mu": result.empirical.gdp_mu, "curve": curve, "seconds": time.perf_counter() - t0,
    }  # fmt: skip


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0], "training_audit_tightness.json")
    p.add_argument("--runs", default="1000,10000,100000")
    args = p.parse_args()
    _common.setup_device(args.device)
    counts = [int(r) for r in args.runs.split(",")]
    if args.quick:
        counts = [c for c in counts if c <= 10_000]
    rows = [one(r, 0) for r in counts]
    table = [
        {"runs": r["runs_per_side"], "claimed eps": r["claimed_epsilon"],
         "empirical eps": r["empirical_epsilon"], "violation": r["violation"],
         **{f"L/acct @{c['epsilon']:.3g}": c["certified"] / c["accountant"] for c in r["curve"]},
         "s": r["seconds"]}
        for r in rows
    ]  # fmt: skip
    _common.print_table("gradient-canary audit of correct DP-SGD", table, list(table[-1]))
    _common.write(args.out, "training_audit_tightness", args, {"setting": SETTING, "rows": rows})


if __name__ == "__main__":
    main()
