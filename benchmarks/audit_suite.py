"""The audit suite, repeated: certified violations of flawed mechanisms, none for the correct twins.

Every correct case of ``cbdp_jax.audit_suite.SUITE`` is audited ``--repeats`` times (default 20) and
every flawed one ``--flawed-repeats`` times (default 10; 2 CPU cores), with independent keys. The
pair is SEARCHED in the case's dataset space (random and local search; the literature's pair is not
offered as a candidate), then certified on fresh samples. Each audit is written to
``OUT/runs/<case>/<repeat>.json`` (resumable: finished audits are skipped), and ``OUT/summary.json``
collects per case: audits, violations certified, the certified bounds, the pairs found, time per audit,
and for flawed cases the held-out E_gamma of the found pair beside that of the paper's pair (same critic
recipe, fresh samples of the same size).

Usage (the measured configuration, 2 CPU cores, in two shards run side by side):
  python benchmarks/audit_suite.py --shard 0/2 & python benchmarks/audit_suite.py --shard 1/2; \\
  python benchmarks/audit_suite.py --summarize
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import jax
import numpy as np

from cbdp_jax import audit as au
from cbdp_jax._src.infra.io import atomic_write_json, environment_info
from cbdp_jax.audit_suite import SUITE, as_arrays

OUT = Path(__file__).parent / "measured" / "audit_suite"


def config_of(args) -> au.AuditConfig:
    return au.AuditConfig(
        samples=args.samples,
        screen_samples=args.screen_samples,
        random_pairs=args.random_pairs,
        local_steps=args.local_steps,
        classes=tuple(args.classes.split(",")),
    )


def compare_with_paper(case, found, key, n: int) -> dict:
    """Held-out E_gamma (best of half-space / histogram critics, both orders) of found vs paper pair."""
    mech = au.load_mechanism(case.fn, case.name)
    gamma = math.exp(au.parse_claim(case.claim).epsilon)
    k1, k2 = jax.random.split(key)
    found_score = au.screen_score(mech, k1, as_arrays(found), gamma, n)
    paper_score = au.screen_score(mech, k2, as_arrays(case.paper_pair), gamma, n)
    # Monte Carlo: each score is a held-out mean of n/2 terms in [-gamma, 1], whose SD is at most half
    # the range, so its SE is at most (1 + gamma) / (2 sqrt(n/2)); "at least as bad" = found >= paper
    # - 3 SE of the difference (0.025 at n = 2e5, gamma = e)
    se = (1.0 + gamma) / (2.0 * math.sqrt(n / 2))
    margin = 3.0 * math.sqrt(2.0) * se
    return {
        "found": found_score, "paper": paper_score, "n": n, "margin_3se": margin,
        "at_least_as_bad": found_score >= paper_score - margin,
    }  # fmt: skip


def run_one(case_i: int, repeat: int, args) -> dict:
    case = SUITE[case_i]
    path = Path(args.out) / "runs" / case.name / f"{repeat}.json"
    if path.exists():
        return json.loads(path.read_text())
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(args.seed), case_i), repeat)
    result = au.audit(
        key, au.load_mechanism(case.fn, case.name), case.claim, space=case.space,
        config=config_of(args),
    )  # fmt: skip
    rec = result.to_dict()
    rec.pop("screened")
    rec.update(case=case.name, flawed=case.flawed, repeat=repeat)
    if case.flawed and repeat == 0:
        rec["pair_vs_paper"] = compare_with_paper(
            case, result.pair, jax.random.fold_in(key, 7), args.compare_samples
        )
    atomic_write_json(path, rec)
    return rec


def summarize(args) -> dict:
    cases = []
    for case in SUITE:
        runs = [
            json.loads(p.read_text())
            for p in sorted((Path(args.out) / "runs" / case.name).glob("*.json"))
        ]
        if not runs:
            continue
        best = [
            max(r["certified_bounds"], key=lambda b: b["lower_bound"] - b["claimed"]) for r in runs
        ]
        cases.append({
            "case": case.name,
            "claim": case.claim,
            "flawed": case.flawed,
            "beyond_sampling": case.beyond_sampling,
            "audits": len(runs),
            "violations": sum(r["violation"] for r in runs),
            "strongest_certified": [b["lower_bound"] for b in best],
            "claimed_at_strongest": [b["claimed"] for b in best],
            "median_certified": statistics.median(b["lower_bound"] for b in best),
            "pairs_found": [r["pair"] for r in runs[:3]],
            "pair_vs_paper": runs[0].get("pair_vs_paper"),
            "seconds_per_audit": statistics.mean(r["seconds"] for r in runs),
            "samples_per_side": runs[0]["samples_per_side"],
        })  # fmt: skip
    summary = {"config": vars(args), "environment": environment_info(), "cases": cases}
    atomic_write_json(Path(args.out) / "summary.json", summary)
    for c in cases:
        pv = c["pair_vs_paper"]
        cmp_ = f" found {pv['found']:.3f} paper {pv['paper']:.3f}" if pv else ""
        print(
            f"{c['case']:<28} flawed={c['flawed']!s:<5} {c['violations']:>2}/{c['audits']} flagged "
            f"median bound {c['median_certified']:.4g} {c['seconds_per_audit']:.1f}s{cmp_}"
        )
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=20, help="audits per correct mechanism")
    p.add_argument("--flawed-repeats", type=int, default=10, help="audits per flawed mechanism")
    p.add_argument("--samples", type=int, default=250_000)
    p.add_argument("--screen-samples", type=int, default=10_000)
    p.add_argument("--random-pairs", type=int, default=8)
    p.add_argument("--local-steps", type=int, default=8)
    p.add_argument("--classes", default="halfspace,histogram")
    p.add_argument("--compare-samples", type=int, default=200_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard", default="0/1", help="i/N: run every N-th audit starting at i")
    p.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    p.add_argument("--summarize", action="store_true")
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args()
    if args.summarize:
        summarize(args)
        return
    i, n = (int(v) for v in args.shard.split("/"))
    wanted = set(filter(None, args.cases.split(",")))
    jobs = [
        (ci, r)
        for r in range(args.repeats)
        for ci, case in enumerate(SUITE)
        if (not wanted or case.name in wanted) and (not case.flawed or r < args.flawed_repeats)
    ]
    for j, (ci, r) in enumerate(jobs):
        if j % n != i:
            continue
        t = time.perf_counter()
        rec = run_one(ci, r, args)
        print(f"{SUITE[ci].name} #{r}: violation={rec['violation']} {time.perf_counter() - t:.1f}s",
              flush=True)  # fmt: skip
    _ = np  # numpy is imported for users extending the script


if __name__ == "__main__":
    main()
