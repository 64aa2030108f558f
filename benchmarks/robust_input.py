"""Issue 26: the estimator's input maps on DP-Auditorium's outlier-heavy mean, and on the Laplace case.

Case "mean-v2": DP-Auditorium's ``MeanMechanism`` with the noisy count in the noise scale
(``cbdp_jax.audit_suite.noisy_count_mean``), claimed eps = 1, on the add/remove pair P = M({0}),
Q = M({0, 1}) (``MEAN_V2_PAIR``): atoms of mass 0.303 at 0 and 0.184 at 0.5 beside outliers up to ~1e6,
so D_2(P||Q) = +inf and the claim (D_2 <= 1) is false. Renyi alpha = 2, 100,000 training, 25,000
validation and 100,000 test samples per side (the sizes of benchmarks/auditorium_case.py), an MLP 32x2,
1000 steps, ensemble 2: the finite-sample bound with each input map ('standard', 'robust', 'rank') and
with the automatic choice ('auto', the default), and 'auto' under the default guarantee ('auto').

Case "laplace": benchmarks/auditorium_case.py's Laplace eps = 1 at alpha 2 and 4 (true 0.6191, 0.8137),
both guarantees, input_map 'standard' and 'auto': the screen keeps the standard map there, so the two
must agree to the last bit.

Each row records the bound, the estimate, the map used and why, and the wall seconds of that call (the
first call of each map in the process includes compiling it).

Usage: python benchmarks/robust_input.py [--out DIR] [--seeds 3] [--cases mean-v2,laplace]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import auditorium_case  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
from _common import run_record  # noqa: E402

from cbdp_jax import analytic  # noqa: E402
from cbdp_jax._src.infra.io import atomic_write_json  # noqa: E402
from cbdp_jax.audit_suite import MEAN_V2_PAIR, noisy_count_mean  # noqa: E402
from cbdp_jax.estimator import EstimatorConfig, estimate_from_samples  # noqa: E402

N_TRAIN, N_VAL, N_TEST = 100_000, 25_000, 100_000
SPLIT = (N_TRAIN / 225_000, N_VAL / 225_000, N_TEST / 225_000)
CLAIM = 1.0
MAPS = ("standard", "robust", "rank", "auto")


def mean_v2(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """225,000 outputs per side of M({0}) and M({0, 1}); data key 1000 + seed."""
    kp, kq = jax.random.split(jax.random.key(1000 + seed))
    n = N_TRAIN + N_VAL + N_TEST
    p = noisy_count_mean(kp, np.asarray(MEAN_V2_PAIR[0]), n)
    q = noisy_count_mean(kq, np.asarray(MEAN_V2_PAIR[1]), n)
    return np.asarray(p).ravel(), np.asarray(q).ravel()


def one(p, q, *, seed: int, alpha: float, input_map: str, guarantee: str, split) -> dict:
    cfg = EstimatorConfig(
        steps=1000, ensemble=2, batch_size=2048, learning_rate=3e-3, split=split,
        guarantee=guarantee, input_map=input_map,
    )  # fmt: skip
    t0 = time.perf_counter()
    res = estimate_from_samples(
        jax.random.key(seed), p, q, adversary="mlp", width=32, depth=2, divergence="renyi",
        alpha=alpha, config=cfg,
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    return {
        "seed": seed, "alpha": alpha, "input_map_option": input_map, "guarantee_option": guarantee,
        "input_map": res.input_map, "input_map_choice": res.input_map_choice,
        "guarantee": res.guarantee, "bound_method": res.bound_method,
        "lower_bound_95": res.lower_bound, "estimate": res.estimate, "std_error": res.std_error,
        "critic_bound": res.critic_bound, "certified_class": res.certified_class,
        "bound_reliable": res.bound_reliable, "refusal": res.refusal, "seconds": seconds,
    }  # fmt: skip


def run_mean_v2(seeds: int) -> list[dict]:
    rows = []
    for seed in range(seeds):
        p, q = mean_v2(seed)
        plan = [(m, "finite-sample") for m in MAPS] + [("auto", "auto")]
        for input_map, guarantee in plan:
            row = one(p, q, seed=seed, alpha=2.0, input_map=input_map, guarantee=guarantee,
                      split=SPLIT)  # fmt: skip
            row["case"] = "mean-v2"
            row["violation_certified"] = row["lower_bound_95"] > CLAIM
            rows.append(row)
            print(
                f"mean-v2 seed {seed} {input_map:8s} {guarantee:13s}: bound "
                f"{row['lower_bound_95']:.3f} (estimate {row['estimate']:.3f}, map "
                f"{row['input_map']}, {row['bound_method']}); {row['seconds']:.1f} s",
                flush=True,
            )
    return rows


def run_laplace() -> list[dict]:
    p, q, split = auditorium_case.data(0)
    rows = []
    for alpha in (2.0, 4.0):
        truth = analytic.laplace_renyi(alpha, 1.0)
        for guarantee in ("finite-sample", "asymptotic"):
            for input_map in ("standard", "auto"):
                row = one(p, q, seed=0, alpha=alpha, input_map=input_map, guarantee=guarantee,
                          split=split)  # fmt: skip
                row.update(case="laplace", true_renyi=truth)
                row["sound"] = row["lower_bound_95"] <= truth
                rows.append(row)
                print(
                    f"laplace alpha {alpha:g} {guarantee:13s} {input_map:8s}: bound "
                    f"{row['lower_bound_95']:.4f} (true {truth:.4f}; map {row['input_map']}); "
                    f"{row['seconds']:.1f} s",
                    flush=True,
                )
    return rows


def summary(rows: list[dict]) -> dict:
    out = {}
    for m in MAPS:
        fs = [r for r in rows if r["case"] == "mean-v2" and r["input_map_option"] == m
              and r["guarantee_option"] == "finite-sample"]  # fmt: skip
        if fs:
            out[f"mean-v2 {m} finite-sample"] = {
                "bounds": [round(r["lower_bound_95"], 4) for r in fs],
                "certified": f"{sum(r['violation_certified'] for r in fs)} of {len(fs)}",
                "maps_used": [r["input_map"] for r in fs],
            }
    lap = [r for r in rows if r["case"] == "laplace"]
    if lap:
        pairs = {}
        for r in lap:
            pairs.setdefault((r["alpha"], r["guarantee_option"]), {})[r["input_map_option"]] = r
        out["laplace auto == standard (bit-identical bound and estimate)"] = all(
            d["auto"]["lower_bound_95"] == d["standard"]["lower_bound_95"]
            and d["auto"]["estimate"] == d["standard"]["estimate"]
            for d in pairs.values()
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/robust-input"))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--cases", default="mean-v2,laplace")
    args = parser.parse_args()
    cases = args.cases.split(",")
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    rows = run_mean_v2(args.seeds) if "mean-v2" in cases else []
    rows += run_laplace() if "laplace" in cases else []
    payload = {
        "benchmark": "robust_input",
        "settings": {
            "seeds": args.seeds,
            "cases": cases,
            "n_train": N_TRAIN,
            "n_val": N_VAL,
            "n_test": N_TEST,
            "adversary": "mlp(32x2)",
            "steps": 1000,
            "ensemble": 2,
            "batch_size": 2048,
            "learning_rate": 3e-3,
        },  # fmt: skip
        "summary": summary(rows),
        "rows": rows,
        **run_record(t0, load_before),
    }
    atomic_write_json(args.out / "summary.json", payload)
    print(payload["summary"])


if __name__ == "__main__":
    main()
