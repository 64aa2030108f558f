"""Issue 26: the input-map race against the full selection, on the same samples and keys.

``input_map='auto'`` on outlier-heavy samples trains every candidate map (standard, robust, rank) for one
validation block, trains only the leader in full, and falls back to training all three in full when the
leader predicts no positive bound (docs/theory/bounds.md, "'auto'"). This runs each unit twice, with
the race (the library as it is) and with the full selection (``estimator._screen`` switched off, which
is what the library did before the race), and compares the map chosen, every bound (both directions)
and the warm seconds of the two calls:

- ``mean-v2``: DP-Auditorium's outlier-heavy mean (``audit_suite.noisy_count_mean`` on
  ``MEAN_V2_PAIR``), 10^4 and 10^5 per side, Renyi alpha 2 and 5, seeds 0-2, at both budgets of the
  side-by-side benchmark (``vs_dp_auditorium.PROFILES``: 'short' and 'case'), both directions;
- ``atoms``: the coverage benchmark's atoms beside Cauchy laws (``coverage.atoms_samples``,
  ``coverage.ATOMS_CONFIG``), 40 runs, one direction.

Each size and budget is called once untimed first with each variant (compilation); the two variants then alternate,
the race first in even units. Writes ``summary.json`` (rows, counts, the speed ratio) to ``--out``.

Usage: PYTHONPATH=. python benchmarks/map_race.py --out benchmarks/measured/map-race [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import coverage  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import vs_dp_auditorium  # noqa: E402
from _common import run_record  # noqa: E402

from cbdp_jax._src.estimator import estimate as _estimator  # noqa: E402
from cbdp_jax._src.infra.io import atomic_write_json  # noqa: E402
from cbdp_jax.audit_suite import MEAN_V2_PAIR, noisy_count_mean  # noqa: E402
from cbdp_jax.estimator import EstimatorConfig, estimate_from_samples  # noqa: E402

_SCREEN = _estimator._screen


def mean_v2(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n outputs per side of M({0}) and M({0, 1}); data key 2000 + seed."""
    kp, kq = jax.random.split(jax.random.key(2000 + seed))
    p = noisy_count_mean(kp, np.asarray(MEAN_V2_PAIR[0]), n)
    q = noisy_count_mean(kq, np.asarray(MEAN_V2_PAIR[1]), n)
    return np.asarray(p).ravel(), np.asarray(q).ravel()


def call(variant: str, key, p, q, config, **kw):
    """``(result, seconds)`` with the race ('race') or every map trained in full ('full')."""
    _estimator._screen = _SCREEN if variant == "race" else (lambda map_keys, probs: None)
    try:
        t0 = time.perf_counter()
        res = estimate_from_samples(key, p, q, config=config, **kw)
        return res, time.perf_counter() - t0
    finally:
        _estimator._screen = _SCREEN


def unit(label: dict, key, p, q, config, order: tuple[str, str], **kw) -> dict:
    """One unit: both variants on the same samples and key; what each chose and bounded."""
    got = {v: call(v, key, p, q, config, **kw) for v in order}
    row = dict(label)
    for v, (res, seconds) in got.items():
        results = [("PQ", res)] + ([("QP", res.reverse)] if res.reverse is not None else [])
        row[v] = {
            "seconds": seconds,
            **{
                f"fallback_{d}": "leader predicts no bound" in r.input_map_choice
                for d, r in results
            },
            **{f"map_{d}": r.input_map for d, r in results},
            **{f"bound_{d}": r.lower_bound for d, r in results},
        }
    race, full = row["race"], row["full"]
    dirs = [k[4:] for k in race if k.startswith("map_")]
    row["same_map"] = all(race[f"map_{d}"] == full[f"map_{d}"] for d in dirs)
    row["same_bounds"] = all(race[f"bound_{d}"] == full[f"bound_{d}"] for d in dirs)
    print({k: row[k] for k in label} | {"same": row["same_bounds"]}, flush=True)
    return row


def run_mean_v2(sizes, seeds, alphas, budgets) -> list[dict]:
    rows, i = [], 0
    kw = dict(adversary="mlp", width=32, depth=2, divergence="renyi")
    for budget in budgets:
        config = EstimatorConfig(**vs_dp_auditorium.PROFILES[budget])
        for n in sizes:
            for alpha in alphas:
                p, q = mean_v2(n, 0)
                for v in ("race", "full"):  # compilation, untimed
                    call(v, jax.random.key(99), p, q, config, alpha=alpha, **kw)
                for seed in seeds:
                    p, q = mean_v2(n, seed)
                    order = ("race", "full") if i % 2 == 0 else ("full", "race")
                    label = {
                        "case": "mean-v2",
                        "budget": budget,
                        "n": n,
                        "alpha": alpha,
                        "seed": seed,
                    }
                    rows.append(
                        unit(label, jax.random.key(seed), p, q, config, order, alpha=alpha, **kw)
                    )
                    i += 1
    return rows


def run_atoms(runs: int) -> list[dict]:
    rows = []
    config = dataclasses.replace(coverage.ATOMS_CONFIG, input_map="auto")
    kw = dict(adversary="mlp", width=16, depth=2, divergence="renyi", alpha=2.0)
    p, q = coverage.atoms_samples(np.random.default_rng([coverage.SEED, runs]), 8000)
    for v in ("race", "full"):  # compilation, untimed (a run index not among the runs)
        call(v, jax.random.key(99), p, q, config, **kw)
    for run_index in range(runs):
        p, q = coverage.atoms_samples(np.random.default_rng([coverage.SEED, run_index]), 8000)
        key = jax.random.fold_in(jax.random.key(coverage.SEED), run_index)
        order = ("race", "full") if run_index % 2 == 0 else ("full", "race")
        label = {"case": "atoms", "run": run_index}
        rows.append(unit(label, key, p, q, config, order, **kw))
    return rows


def summary(rows: list[dict]) -> dict:
    out = {}
    for case in sorted({r["case"] for r in rows}):
        rs = [r for r in rows if r["case"] == case]
        bounds = {
            v: [r[v][k] for r in rs for k in r[v] if k.startswith("bound_")]
            for v in ("race", "full")
        }
        out[case] = {
            "units": len(rs),
            "same_map": sum(r["same_map"] for r in rs),
            "same_bounds": sum(r["same_bounds"] for r in rs),
            "race_fallbacks": sum(
                v for r in rs for k, v in r["race"].items() if k.startswith("fallback_")
            ),
            "mean_bound_race": float(np.mean(bounds["race"])),
            "mean_bound_full": float(np.mean(bounds["full"])),
            "differences": [
                {k: r.get(k) for k in ("budget", "n", "alpha", "seed", "run") if k in r}
                | {"race": r["race"], "full": r["full"]}
                for r in rs
                if not r["same_bounds"]
            ],  # fmt: skip
        }
        for budget in sorted({r.get("budget") for r in rs if "budget" in r}):
            for n in sorted({r["n"] for r in rs if r.get("budget") == budget}):
                sel = [r for r in rs if r.get("budget") == budget and r["n"] == n]
                ratio = [r["full"]["seconds"] / r["race"]["seconds"] for r in sel]
                out[case][f"speedup_{budget}_{n}"] = {
                    "median": statistics.median(ratio), "min": min(ratio), "max": max(ratio),
                    "race_seconds": [r["race"]["seconds"] for r in sel],
                    "full_seconds": [r["full"]["seconds"] for r in sel],
                }  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/map-race"))
    parser.add_argument(
        "--quick", action="store_true", help="10k, alpha 2, seed 0, short; 4 atoms runs"
    )
    args = parser.parse_args()
    load_before, t0 = os.getloadavg(), time.perf_counter()
    if args.quick:
        rows = run_mean_v2([10_000], [0], [2.0], ["short"]) + run_atoms(4)
    else:
        rows = run_mean_v2([10_000, 100_000], [0, 1, 2], [2.0, 5.0], ["short", "case"]) + run_atoms(
            40
        )
    payload = {
        "benchmark": "map_race",
        "quick": args.quick,
        "summary": summary(rows),
        "rows": rows,
        **run_record(t0, load_before),
    }
    atomic_write_json(args.out / "summary.json", payload)
    print(
        {
            c: {k: v for k, v in s.items() if k != "differences"}
            for c, s in payload["summary"].items()
        }
    )


if __name__ == "__main__":
    main()
