"""The default training budget against a fixed one: bound and wall time per case, size and seed.

Chooses and checks ``EstimatorConfig``'s size-aware default (:func:`cbdp_jax.estimator.default_budget`)
against the fixed budget it replaced (2000 steps x 4 adversaries x 4096 pairs, every size). Each row
is one ``estimate_from_samples`` call (MLP 64x2, the default class; Renyi; every other setting the
default) on samples drawn once per (case, size, seed):

  laplace   Lap(0, 1) against Lap(1, 1) (Laplace mechanism, eps = 1; D_2 = 0.6191)
  gaussian  N(0, 4) against N(1, 4) (Gaussian mechanism, sigma = 2; D_alpha = alpha / 8)
  mean-v2   DP-Auditorium's outlier-heavy mean (its own ``MeanMechanism``, drawn in its venv as
            benchmarks/vs_dp_auditorium.py does; the automatic input map screens three maps here)
  cauchy    Cauchy(0, 1) against Cauchy(1, 1) (a heavy tail)

Profiles (``--profiles``): ``fixed`` (the old default, explicit), ``default`` (``EstimatorConfig()``),
``steps:ensemble:batch[:patience]`` for a fixed candidate, or ``rule:PASSES:SHARE`` for a candidate
rule (:func:`rule`). The first call of each (profile, case, size,
alpha) in the process compiles; its wall time is recorded with ``first: true`` and left out of the
warm medians. Rows go to ``--out/runs.jsonl``; ``--summarize`` writes ``summary.json`` and ``table.md``
(mean bound over seeds per case and profile, its change against ``fixed``, median warm seconds).

Usage:
  python benchmarks/budget_rule.py --profiles fixed default --sizes 10000 100000 --seeds 0 1 2 \\
      --out benchmarks/measured/budget-rule
  python benchmarks/budget_rule.py --summarize --out benchmarks/measured/budget-rule
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PEER = HERE / "peers" / "dp_auditorium" / "run_tester.py"
CASES = ("laplace", "gaussian", "mean-v2", "cauchy")
FIXED = {"steps": 2000, "ensemble": 4, "batch_size": 4096, "eval_every": 100}


def draw(
    case: str, n: int, seed: int, dpa_python: str, work: Path
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` samples per side of ``case`` (the same for every profile)."""
    if case == "mean-v2":
        path = work / f"mean-v2_{n}_{seed}.npz"
        if not path.exists():
            cmd = [dpa_python, str(PEER), "draw", "--mechanism", "v2", "--n", str(n)]
            subprocess.run([*cmd, "--seed", str(seed), "--out", str(path)], check=True)
        data = np.load(path)
        return data["p"].reshape(-1), data["q"].reshape(-1)
    rng = np.random.default_rng(seed)
    if case == "laplace":
        return rng.laplace(0.0, 1.0, n), rng.laplace(1.0, 1.0, n)
    if case == "gaussian":
        return rng.normal(0.0, 2.0, n), rng.normal(1.0, 2.0, n)
    return rng.standard_cauchy(n), 1.0 + rng.standard_cauchy(n)


def rule(n_train: int, passes: float, share: int) -> dict:
    """A candidate rule of :func:`~cbdp_jax.estimator.default_budget`'s form: minibatch n / share (a
    power of two in [512, 4096]), ``passes`` passes over the training samples in [400, 2000] steps, 10
    checks, patience 5, one adversary (``rule:4:64`` is the default)."""
    batch = 1 << max(n_train // share, 1).bit_length() - 1
    batch = min(max(batch, 512), 4096)
    steps = min(max(math.ceil(passes * n_train / batch), 400), 2000)
    return {"steps": steps, "ensemble": 1, "batch_size": batch, "eval_every": max(steps // 10, 1),
            "patience": 5}  # fmt: skip


def config_of(profile: str, n_train: int):
    """The ``EstimatorConfig`` of a profile name at ``n_train`` training samples per side."""
    from cbdp_jax.estimator import EstimatorConfig

    if profile == "fixed":
        return EstimatorConfig(**FIXED)
    if profile == "default":
        return EstimatorConfig()
    if profile.startswith("rule:"):
        _, passes, share = profile.split(":")
        return EstimatorConfig(**rule(n_train, float(passes), int(share)))
    parts = profile.split(":")
    steps, ensemble, batch = (int(x) for x in parts[:3])
    kw = {"steps": steps, "ensemble": ensemble, "batch_size": batch}
    if len(parts) > 3:
        kw["patience"] = int(parts[3])
    kw["eval_every"] = max(1, min(100, steps // (20 if len(parts) > 3 else 10)))
    return EstimatorConfig(**kw)


def run(args) -> None:
    import jax

    from cbdp_jax.estimator import estimate_from_samples

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    seen: set = set()
    for n in args.sizes:
        for case in args.cases:
            for seed in args.seeds:
                p, q = draw(case, n, seed, args.dpa_python, work)
                for alpha in args.alphas:
                    for profile in args.profiles:
                        cfg = config_of(profile, n // 2)  # the default split's training half
                        shape = (profile, case, n, alpha)
                        load = os.getloadavg()[0]
                        t0, c0 = time.perf_counter(), time.process_time()
                        res = estimate_from_samples(
                            jax.random.key(seed), p, q, adversary="mlp", divergence="renyi",
                            alpha=alpha, config=cfg,
                        )  # fmt: skip
                        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                        row = {
                            "case": case, "n_per_side": n, "seed": seed, "alpha": alpha,
                            "profile": profile, "bound": res.lower_bound,
                            "estimate": res.estimate, "guarantee": res.guarantee,
                            "input_map": res.input_map, "wall_s": wall, "cpu_s": cpu,
                            "first": shape not in seen, "load": load,
                            "budget": {k: res.config.get(k) for k in
                                       ("steps", "ensemble", "batch_size", "eval_every",
                                        "patience", "budget")},
                            "blocks_run": len(res.curves.get("val_objective", [])),
                        }  # fmt: skip
                        seen.add(shape)
                        with (out / "runs.jsonl").open("a") as fh:
                            fh.write(json.dumps(row, default=str) + "\n")
                        print(
                            f"{case:8s} n={n:>8d} a={alpha:g} seed={seed} {profile:14s} bound "
                            f"{res.lower_bound:8.4f} est {res.estimate:8.4f} wall {wall:6.2f} s "
                            f"{'(first)' if row['first'] else ''} load {load:.1f}",
                            flush=True,
                        )
    summarize(out)


def summarize(out: Path) -> None:
    """Mean bound over seeds per (case, n, alpha, profile) and its change against ``fixed``."""
    rows: dict = {}
    for line in (out / "runs.jsonl").read_text().splitlines():
        r = json.loads(line)
        rows[(r["case"], r["n_per_side"], r["alpha"], r["profile"], r["seed"])] = r
    groups: dict = {}
    for (case, n, alpha, profile, _), r in rows.items():
        groups.setdefault((case, n, alpha), {}).setdefault(profile, []).append(r)
    table = []
    for (case, n, alpha), by_profile in sorted(groups.items()):
        base = by_profile.get("fixed")
        base_mean = statistics.mean(r["bound"] for r in base) if base else None
        for profile, rs in sorted(by_profile.items()):
            mean = statistics.mean(r["bound"] for r in rs)
            warm = [r["wall_s"] for r in rs if not r["first"]]
            table.append({
                "case": case, "n_per_side": n, "alpha": alpha, "profile": profile,
                "seeds": sorted(r["seed"] for r in rs), "bounds": [r["bound"] for r in rs],
                "mean_bound": mean,
                "change_vs_fixed": None if base_mean in (None, 0) else mean / base_mean - 1,
                "median_warm_s": statistics.median(warm) if warm else None,
                "first_s": next((r["wall_s"] for r in rs if r["first"]), None),
                "budget": rs[0]["budget"], "blocks_run": [r["blocks_run"] for r in rs],
                "load": [min(r["load"] for r in rs), max(r["load"] for r in rs)],
            })  # fmt: skip
    (out / "summary.json").write_text(json.dumps(table, indent=1, default=str))
    lines = [
        "| case | n/side | alpha | profile | mean bound (seeds) | vs fixed | median warm s | load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in table:
        change = "-" if t["change_vs_fixed"] is None else f"{100 * t['change_vs_fixed']:+.1f}%"
        warm = "-" if t["median_warm_s"] is None else f"{t['median_warm_s']:.2f}"
        bounds = " / ".join(f"{b:.3f}" for b in t["bounds"])
        lines.append(
            f"| {t['case']} | {t['n_per_side']} | {t['alpha']:g} | {t['profile']} | "
            f"{t['mean_bound']:.4f} ({bounds}) | {change} | {warm} | "
            f"{t['load'][0]:.1f}-{t['load'][1]:.1f} |"
        )
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", nargs="+", default=["fixed", "default"])
    ap.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    ap.add_argument("--sizes", nargs="+", type=int, default=[10_000, 100_000])
    ap.add_argument("--alphas", nargs="+", type=float, default=[2.0])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--out", default="benchmarks/results/budget-rule")
    ap.add_argument("--work", default="/tmp/budget-rule-work")
    ap.add_argument(
        "--dpa-python", default=os.environ.get("DPA_VENV", "/tmp/dpa-venv") + "/bin/python"
    )
    ap.add_argument("--summarize", action="store_true")
    args = ap.parse_args()
    if args.summarize:
        summarize(Path(args.out))
    else:
        sys.setrecursionlimit(10_000)
        run(args)


if __name__ == "__main__":
    main()
