"""How close a gradient-canary audit of correct DP-SGD gets to the accountant, as the runs grow.

Synthetic data (63 examples + the canary), logistic regression, the library's DP-SGD step, Poisson
sampling, the gradient canary along a coordinate no example moves (so the score's law is exactly the
T-fold Poisson-subsampled Gaussian the accountant composes), trained by the real engine
(``audit_training``). Three settings, each with the accountant's eps at delta = 1e-5 between 3.5
and 4: one step with q = 1 (the Gaussian mechanism), one step with q = 1/2, and T = 16 steps with
q = 1/8. For each run count the audit of the run's own ``dpsgd:`` claim reports the empirical eps
at delta = 1e-5, which must never exceed the accountant's (asserted), next to two ceilings computed
from the accountant's own privacy-loss distribution (dp_accounting's PLD, pessimistic, so the
ceilings are if anything too high):

* ``oracle``: the best threshold on the log-likelihood ratio known in advance, exact Clopper-Pearson
  bounds on P(S) and Q(S) at 0.025 each from the EXPECTED counts of all n runs, no multiplicity: no
  finite-sample audit of n runs per side does better at this level;
* ``split``: the same with what this audit pays: 70% of the runs held out (30% choose the set) and
  the per-side level of its Bonferroni family (0.05 / (2 K)).

Both ceilings are also inverted: the runs per side at which they reach 0.8 of the accountant's eps.

    python benchmarks/training_audit_tightness.py --device cpu --runs 10000,100000,1000000 \\
        --out benchmarks/measured/training-tightness/summary.json
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

from cbdp_jax import training_audit as ta  # noqa: E402
from cbdp_jax._src.privacy.accounting import _composed  # noqa: E402
from cbdp_jax._src.statistics.binomial import (  # noqa: E402
    clopper_pearson_lower,
    clopper_pearson_upper,
)
from cbdp_jax.audit import parse_claim  # noqa: E402

DELTA = 1e-5
BASE = dict(data="synthetic", n=63, sampler="poisson")
SETTINGS = {
    "1 step q=1": dict(rate=1.0, steps=1, noise=1.08),
    "1 step q=1/2": dict(rate=0.5, steps=1, noise=1.0),
    "16 steps q=1/8": dict(rate=0.125, steps=16, noise=1.0),
}


def _tails(noise: float, rate: float, steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each direction of the accountant's PLD: P(L > t) and Q(L > t) at every loss value t."""
    pld = _composed(float(noise), float(rate), int(steps))._pld
    out = []
    for pmf in (pld._pmf_remove, pld._pmf_add):
        loss = (pmf._lower_loss + np.arange(len(pmf._probs))) * pmf._discretization
        probs = np.asarray(pmf._probs, np.float64)
        p = np.minimum(np.cumsum(probs[::-1])[::-1], 1.0)  # P(L >= loss_i)
        q = np.minimum(np.cumsum((probs * np.exp(-loss))[::-1])[::-1], 1.0)
        out.append((p, q))
    return out


def ceiling(tails, n: int, alpha_side: float, held: float = 1.0) -> float:
    """The best eps a threshold set certifies at DELTA from the expected counts of held * n runs."""
    m, best = max(int(held * n), 1), 0.0
    for p, q in tails:
        lo = clopper_pearson_lower(np.floor(p * m), m, 1 - alpha_side)
        up = clopper_pearson_upper(np.minimum(np.ceil(q * m), m), m, 1 - alpha_side)
        ok = lo > DELTA
        if ok.any():
            best = max(best, float(np.max(np.log((lo[ok] - DELTA) / up[ok]))))
    return best


def runs_for(tails, target: float, alpha_side: float, held: float = 1.0) -> float:
    """The least runs per side (to 3%) at which ``ceiling`` reaches ``target`` (inf past 10^11)."""
    lo, hi = 1e3, 1e3
    while ceiling(tails, int(hi), alpha_side, held) < target:
        lo, hi = hi, hi * 4
        if hi > 1e11:
            return math.inf
    while hi / lo > 1.03:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if ceiling(tails, int(mid), alpha_side, held) < target else (lo, mid)
    return hi


def one(name: str, runs: int, seed: int) -> dict:
    setting = SETTINGS[name]
    problem = ta.build_problem(**(BASE | setting | {"chunk": 4096}))
    claim = parse_claim(ta.default_claim(problem, DELTA))
    config = ta.training_audit_config(claim.epsilon, samples=runs)
    t0 = time.perf_counter()
    result = ta.audit_training(jax.random.key(seed), problem, config=config)
    seconds = time.perf_counter() - t0
    emp = result.empirical
    assert emp.epsilon <= claim.epsilon, (
        f"{name}: empirical {emp.epsilon} > accountant {claim.epsilon}"
    )
    tails = _tails(setting["noise"], setting["rate"], setting["steps"])
    side = 0.05 / (2 * result.family_size)
    tail_rows = [r for r in result.rows if r.critic == "tail-halfspace"]
    return {
        "setting": name, **setting, "runs_per_side": runs, "seed": seed,
        "violation": result.violation, "family_size": result.family_size,
        "accountant_epsilon": claim.epsilon, "empirical_epsilon": emp.epsilon,
        "ratio": emp.epsilon / claim.epsilon, "gdp_mu": emp.gdp_mu,
        "oracle_ceiling": ceiling(tails, runs, 0.025),
        "split_ceiling": ceiling(tails, runs, side, held=1 - config.train_fraction),
        "tail_rows": [{"direction": r.direction, "p_lower": r.p_lower, "q_upper": r.q_upper}
                      for r in tail_rows],
        "curve": [{"epsilon": e, "certified": b, "accountant": claim.source.delta_at(e)}
                  for e, b in emp.curve],
        "seconds": seconds, "runs_per_second": 2 * runs / seconds,
    }  # fmt: skip


def reach(name: str, family_size: int) -> dict:
    """Runs per side at which the two ceilings reach 0.8 of the accountant's eps."""
    s = SETTINGS[name]
    tails = _tails(s["noise"], s["rate"], s["steps"])
    target = (
        0.8
        * parse_claim(
            f"dpsgd:noise={s['noise']},rate={s['rate']},steps={s['steps']},delta={DELTA}"
        ).epsilon
    )
    return {
        "setting": name, "target_epsilon": target,
        "oracle_runs": runs_for(tails, target, 0.025),
        "split_runs": runs_for(tails, target, 0.05 / (2 * family_size), held=0.7),
    }  # fmt: skip


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0], "training_audit_tightness.json")
    p.add_argument("--runs", default="10000,100000,1000000")
    p.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated names")
    p.add_argument("--seeds", type=int, default=1, help="independent audits per setting and count")
    args = p.parse_args()
    _common.setup_device(args.device)
    counts = [int(r) for r in args.runs.split(",")]
    names = [s.strip() for s in args.settings.split(",")]
    if args.quick:
        counts = [c for c in counts if c <= 10_000]
    rows = [one(name, r, s) for name in names for r in counts for s in range(args.seeds)]
    reached = [reach(name, rows[0]["family_size"]) for name in names]
    table = [
        {"setting": r["setting"], "runs": r["runs_per_side"], "acct eps": r["accountant_epsilon"],
         "emp eps": r["empirical_epsilon"], "emp/acct": r["ratio"],
         "oracle/acct": r["oracle_ceiling"] / r["accountant_epsilon"],
         "split/acct": r["split_ceiling"] / r["accountant_epsilon"], "violation": r["violation"],
         "runs/s": r["runs_per_second"], "s": r["seconds"]}
        for r in rows
    ]  # fmt: skip
    _common.print_table("gradient-canary audit of correct DP-SGD, eps at delta = 1e-5", table,
                        list(table[-1]))  # fmt: skip
    _common.print_table("runs per side for 0.8 x the accountant's eps", reached, list(reached[0]))
    spread = _spread(rows)
    if args.seeds > 1:
        _common.print_table("emp eps / accountant over seeds", spread, list(spread[0]))
    _common.write(
        args.out, "training_audit_tightness", args,
        {"base": BASE, "settings": SETTINGS, "delta": DELTA, "rows": rows, "reach_0.8": reached,
         "over_seeds": spread},
    )  # fmt: skip


def _spread(rows: list[dict]) -> list[dict]:
    """Mean, standard deviation, min and max of emp eps / accountant per (setting, runs)."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        groups.setdefault((r["setting"], r["runs_per_side"]), []).append(r["ratio"])
    return [
        {"setting": k[0], "runs": k[1], "seeds": len(v), "mean": float(np.mean(v)),
         "sd": float(np.std(v, ddof=1)) if len(v) > 1 else 0.0, "min": min(v), "max": max(v)}
        for k, v in groups.items()
    ]  # fmt: skip


if __name__ == "__main__":
    main()
