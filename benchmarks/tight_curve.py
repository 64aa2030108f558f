"""The randomized-response curve of an (eps, delta) claim: what it changes, and its false violations.

``Claim.claimed_delta`` for ``pure:`` and ``approx:`` claims is the hockey-stick curve of the (eps,
delta) randomized response, delta + (1 - delta) max(0, e^eps - e^eps') / (1 + e^eps) (Kairouz, Oh,
Viswanath 2015); it used to be delta + max(0, e^eps - e^eps'). Two parts:

``--part suite``: every case of the audit suite audited once as ``cbdp audit --suite`` does (the
case's space searched, the literature's pair offered), at a reduced budget. The rows' certified bounds
do not depend on the claimed curve (the critics are fitted at gamma = e^eps'), so each audit's rows are
compared with both curves: the verdict, the rows above each curve and the empirical epsilon under each.

``--part correct``: audits of correct mechanisms at the claim's own eps on their tight pair, no search:
randomized response at exactly (eps, delta) (the one mechanism that meets the new curve at every
eps'), at (1, 0) and (1, 0.01); the Laplace mechanism at pure:1; the analytic Gaussian at
approx:1:1e-5. Each audit is at 95% family-wise, so at most 5% of the audits of a mechanism ON the
curve may certify a violation; below it, fewer.

Usage (about 10 minutes on 2 shared CPU cores):
  python benchmarks/tight_curve.py --part suite --out benchmarks/measured/tight-curve
  python benchmarks/tight_curve.py --part correct --audits 200 --out benchmarks/measured/tight-curve
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from cbdp_jax import audit as au
from cbdp_jax._src.infra.io import atomic_write_json, environment_info
from cbdp_jax.audit_suite import SUITE, as_arrays
from cbdp_jax.hockey_stick import gaussian_sigma_for


def old_claimed(claim: au.Claim, eps: float) -> float:
    """The curve before: delta + max(0, e^eps_claim - e^eps')."""
    return claim.delta + max(0.0, math.exp(claim.epsilon) - math.exp(eps))


def old_empirical(rows, delta: float) -> float:
    """The empirical epsilon under the old curve: max over L_i > delta of log(e^eps_i + L_i - delta)."""

    best = 0.0
    for r in rows:
        if math.isfinite(r.lower_bound) and r.lower_bound > delta:
            best = max(best, math.log(math.exp(r.grid) + r.lower_bound - delta))
        if math.isfinite(r.p_lower) and math.isfinite(r.q_upper) and r.p_lower > delta:
            best = max(best, math.log((r.p_lower - delta) / r.q_upper))  # the old one-sided form
    return best


def suite_part(args) -> dict:
    config = au.AuditConfig(
        samples=args.samples, screen_samples=args.screen_samples, random_pairs=4, local_steps=4,
        classes=("halfspace", "histogram"),
    )  # fmt: skip
    cases = []
    for i, case in enumerate(SUITE):
        claim = au.parse_claim(case.claim)
        res = au.audit(
            jax.random.fold_in(jax.random.key(args.seed), i), au.load_mechanism(case.fn, case.name),
            claim, space=case.space, candidates=[as_arrays(case.paper_pair)], config=config,
        )  # fmt: skip
        rows = [r for r in res.rows if math.isfinite(r.lower_bound)]
        old_rows = [r for r in rows if r.lower_bound > old_claimed(claim, r.grid)]
        new_rows = [r for r in rows if r.violation]
        rec = {
            "case": case.name, "claim": case.claim, "flawed": case.flawed,
            "verdict_old": bool(old_rows), "verdict_new": bool(res.violation),
            "rows": len(res.rows), "rows_above_old_curve": len(old_rows),
            "rows_above_new_curve": len(new_rows),
            "rows_gained": sorted({f"{r.critic} {r.direction} eps'={r.grid:.3g}" for r in new_rows}
                                  - {f"{r.critic} {r.direction} eps'={r.grid:.3g}" for r in old_rows}),
            "empirical_eps_old": old_empirical(res.rows, claim.delta),
            "empirical_eps_new": res.empirical.epsilon if res.empirical else 0.0,
            "seconds": res.seconds,
        }  # fmt: skip
        print(json.dumps(rec), flush=True)
        cases.append(rec)
    changed = [c["case"] for c in cases if c["verdict_old"] != c["verdict_new"]]
    return {
        "config": {"samples": args.samples, "screen_samples": args.screen_samples, "seed": args.seed,
                   "classes": ["halfspace", "histogram"], "random_pairs": 4, "local_steps": 4},
        "verdicts_changed": changed,
        "violations_old": sum(c["verdict_old"] for c in cases),
        "violations_new": sum(c["verdict_new"] for c in cases),
        "violations_on_correct_new": sum(c["verdict_new"] for c in cases if not c["flawed"]),
        "rows_above_old_curve": sum(c["rows_above_old_curve"] for c in cases),
        "rows_above_new_curve": sum(c["rows_above_new_curve"] for c in cases),
        "cases": cases,
    }  # fmt: skip


def rr_mechanism(eps: float, delta: float):
    """The (eps, delta) randomized response on d in {0, 1}: outcomes 0..3, P of d = 1 as below."""
    w = (1.0 - delta) / (1.0 + math.exp(eps))
    p = jnp.array([delta, w * math.exp(eps), w, 0.0])

    def mech(key, d, n):
        probs = jnp.where(jnp.asarray(d)[0] > 0.5, p, p[::-1])
        return jax.random.categorical(key, jnp.log(probs), shape=(n,)).astype(jnp.float32)

    return mech


def laplace(key, d, n):
    return jnp.sum(jnp.asarray(d)) + jax.random.laplace(key, (n,))


_SIGMA = gaussian_sigma_for(1.0, 1e-5, 1.0)


def gaussian(key, d, n):
    return jnp.sum(jnp.asarray(d)) + _SIGMA * jax.random.normal(key, (n,))


CORRECT = (
    ("randomized_response(1, 0)", rr_mechanism(1.0, 0.0), "pure:1"),
    ("randomized_response(1, 0.01)", rr_mechanism(1.0, 0.01), "approx:1:0.01"),
    ("laplace(1)", laplace, "pure:1"),
    ("analytic_gaussian(1, 1e-5)", gaussian, "approx:1:1e-05"),
)


def correct_part(args) -> dict:
    config = au.AuditConfig(samples=args.samples, classes=("halfspace", "histogram"))
    per = {name: {"claim": claim, "audits": 0, "violations": 0, "max_excess": -math.inf}
           for name, _, claim in CORRECT}  # fmt: skip
    key = jax.random.key(args.seed)
    for i in range(args.audits):
        name, mech, claim = CORRECT[i % len(CORRECT)]
        res = au.audit(jax.random.fold_in(key, i), mech, claim, pair=([1.0], [0.0]), config=config)
        rec = per[name]
        rec["audits"] += 1
        rec["violations"] += int(res.violation)
        excess = max(r.lower_bound - r.claimed for r in res.rows if math.isfinite(r.lower_bound))
        rec["max_excess"] = max(rec["max_excess"], excess)
    total = sum(r["violations"] for r in per.values())
    print(json.dumps(per, indent=1), flush=True)
    return {"config": {"samples": args.samples, "classes": ["halfspace", "histogram"],
                       "seed": args.seed, "pair": [[1.0], [0.0]], "confidence": 0.95},
            "audits": args.audits, "false_violations": total, "per_mechanism": per}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--part", choices=("suite", "correct"), required=True)
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--screen-samples", type=int, default=5000)
    ap.add_argument("--audits", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "measured" / "tight-curve")
    args = ap.parse_args()
    if args.samples is None:
        args.samples = 50_000 if args.part == "suite" else 20_000
    start = time.perf_counter()
    summary = suite_part(args) if args.part == "suite" else correct_part(args)
    summary["seconds"] = time.perf_counter() - start
    summary["environment"] = environment_info()
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / f"{args.part}.json", summary)
    print(f"wrote {args.out / (args.part + '.json')} in {summary['seconds']:.0f} s")


if __name__ == "__main__":
    main()
