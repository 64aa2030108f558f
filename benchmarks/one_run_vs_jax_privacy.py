"""One-run epsilon lower bounds: cbdp_jax.one_run beside jax_privacy's CanaryScoreAuditor, same scores.

Each repeat draws m canaries, each included with probability 1/2, and one score per canary from a
mechanism of KNOWN privacy: Gaussian scores (N(mu, 1) if included, N(0, 1) if not: mu-GDP, true eps at
delta from the GDP curve) or randomized response on the inclusion bit (eps-DP; true eps at delta =
log(e^eps - delta (1 + e^eps))). Both tools get the same scores; each reports its bounds at level 95%.

Pairs compared: Steinke et al. (ours ``steinke`` vs jax_privacy ``epsilon_one_run``, default
Bonferroni over every threshold) and the Gaussian-curve f-DP bound (ours ``gdp`` vs jax_privacy
``epsilon_one_run_fdp``, which refutes the Gaussian mechanism calibrated to (eps, delta)). Ours
``fdp`` (the f-DP test with the (eps, delta) curve, valid for any (eps, delta)-DP mechanism) is
reported beside them, and ``steinke_all`` / ``gdp_all``: the same bounds with a family of one choice
fixed in advance, a guess on every canary (two-sided, centred).

Needs the ``peer`` extra in its own environment (never in the project's):
  python3 -m venv /tmp/jpvenv && /tmp/jpvenv/bin/pip install -e . jax-privacy==2.0.0
  /tmp/jpvenv/bin/python benchmarks/one_run_vs_jax_privacy.py --repeats 50
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import time
from pathlib import Path

import numpy as np

from cbdp_jax import one_run

OUT = Path(__file__).parent / "measured" / "one-run" / "summary.json"
LEVEL = 0.95
# (kind, parameter, m, delta): GDP mu in {0.5, 1, 2, 4} x m in {1000, 10000} at delta = 1e-5, two
# larger deltas, and randomized response
CASES = [("gdp", mu, m, 1e-5) for m in (1000, 10_000) for mu in (0.5, 1.0, 2.0, 4.0)]
CASES += [("gdp", 1.0, 1000, 1e-3), ("gdp", 4.0, 1000, 1e-3)]
CASES += [("rr", 1.0, 1000, 1e-5), ("rr", 3.0, 1000, 1e-5), ("rr", 2.0, 10_000, 1e-5)]
# randomized response with a tiny continuous jitter (many distinct scores) at delta ~ 0, where the
# Steinke bound is nearly tight: the case that tests soundness sharply
CASES += [("rrj", 1.0, 1000, 1e-10)]
OURS = ("steinke", "fdp", "gdp", "steinke_all", "gdp_all")  # *_all: the one choice "guess all m"
THEIRS = ("jp_steinke", "jp_fdp")
PAIRS = (
    ("steinke", "jp_steinke"), ("gdp", "jp_fdp"), ("steinke_all", "jp_steinke"), ("gdp_all", "jp_fdp"),
)  # fmt: skip


def true_epsilon(kind: str, param: float, delta: float) -> float:
    """The mechanism's exact eps at delta (GDP curve, or randomized response's)."""
    if kind == "gdp":
        return one_run.gdp_epsilon(param, delta)
    return math.log(math.exp(param) - delta * (1.0 + math.exp(param)))


def rr_gdp_mu(eps: float) -> float:
    """The least mu with G_mu <= f_eps (randomized response's trade-off curve): RR is mu-GDP for it.

    G_mu(a) <= f(a) iff mu >= Phi^-1(1 - a) - Phi^-1(f(a)); the sup over a (fine grid, then refined).
    """
    from scipy import optimize, stats

    def need(a):
        f = max(1.0 - math.exp(eps) * a, math.exp(-eps) * (1.0 - a))
        return stats.norm.ppf(1.0 - a) - stats.norm.ppf(f)

    grid = np.linspace(1e-6, 1.0 - 1e-6, 20_001)
    i = int(np.argmax([need(a) for a in grid]))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    res = optimize.minimize_scalar(lambda a: -need(a), bounds=(lo, hi), method="bounded")
    return max(-res.fun, need(grid[i]))


def gdp_truth(kind: str, param: float, delta: float) -> float:
    """The eps at delta of the least mu for which the mechanism is mu-GDP: what a GDP-curve bound
    (ours ``gdp``, jax_privacy's ``epsilon_one_run_fdp``) may not exceed."""
    mu = param if kind == "gdp" else rr_gdp_mu(param)
    return one_run.gdp_epsilon(mu, delta)


def draw(rng: np.random.Generator, kind: str, param: float, m: int):
    """Scores and inclusions of one run."""
    inc = rng.random(m) < 0.5
    if kind == "gdp":
        return rng.normal(size=m) + param * inc, inc
    keep = rng.random(m) < 1.0 / (1.0 + math.exp(-param))
    bits = np.where(keep, inc, ~inc).astype(np.float64)
    return (bits + 1e-3 * rng.random(m) if kind == "rrj" else bits), inc


def bounds(scores, inc, delta: float) -> dict[str, float]:
    """Every tool's bound on the same scores."""
    from jax_privacy import auditing

    out, m = {}, scores.size
    for name in OURS:
        method, choices = name.removesuffix("_all"), None
        if name.endswith("_all"):  # a family of one, fixed in advance: guess on every canary
            choices = [((m + 1) // 2, m // 2)]
        out[name] = one_run.one_run_audit(
            scores, inc, delta=delta, level=LEVEL, method=method, choices=choices
        ).epsilon
    auditor = auditing.CanaryScoreAuditor(scores[inc], scores[~inc])
    out["jp_steinke"] = float(auditor.epsilon_one_run(1.0 - LEVEL, delta))
    out["jp_fdp"] = float(auditor.epsilon_one_run_fdp(1.0 - LEVEL, delta))
    return out


def run_case(case, repeats: int, seed: int) -> dict:
    kind, param, m, delta = case
    rng = np.random.default_rng([seed, int(param * 100), m, int(-math.log10(delta))])
    truth = true_epsilon(kind, param, delta)
    truth_gdp = gdp_truth(kind, param, delta)
    limit = {t: truth_gdp if "gdp" in t or t == "jp_fdp" else truth for t in (*OURS, *THEIRS)}
    start = time.perf_counter()
    rows = [bounds(*draw(rng, kind, param, m), delta) for _ in range(repeats)]
    tools = list(rows[0])
    vals = {t: np.array([r[t] for r in rows]) for t in tools}
    return {
        "kind": kind, "param": param, "m": m, "delta": delta, "true_epsilon": truth,
        "true_epsilon_of_gdp_envelope": truth_gdp,
        "repeats": repeats, "seconds": time.perf_counter() - start,
        "mean": {t: float(vals[t].mean()) for t in tools},
        "std": {t: float(vals[t].std(ddof=1)) for t in tools},
        "above_truth": {t: float((vals[t] > limit[t]).mean()) for t in tools},
        "ours_ge_theirs": {f"{a}>={b}": float((vals[a] >= vals[b]).mean()) for a, b in PAIRS},
    }  # fmt: skip


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args()
    import importlib.metadata as md

    rows = []
    head = f"{'case':<24}{'true':>7}{'gdp-env':>8}" + "".join(f"{t:>12}" for t in (*OURS, *THEIRS))
    print(head + "  ours>=theirs (as PAIRS)  above truth (max)")
    for case in CASES:
        r = run_case(case, args.repeats, args.seed)
        rows.append(r)
        name = f"{r['kind']} {r['param']:g} m={r['m']} d={r['delta']:g}"
        ge = " ".join(f"{v:.2f}" for v in r["ours_ge_theirs"].values())
        print(f"{name:<24}{r['true_epsilon']:>7.3f}{r['true_epsilon_of_gdp_envelope']:>8.3f}"
              + "".join(f"{v:>12.3f}" for v in r["mean"].values())
              + f"  {ge:<23}  {max(r['above_truth'].values()):.2f}", flush=True)  # fmt: skip
    payload = {
        "config": vars(args) | {"level": LEVEL},
        "commit": _commit(),
        "versions": {k: md.version(k) for k in ("jax-privacy", "numpy", "scipy", "dp-accounting")},
        "cases": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    main()
