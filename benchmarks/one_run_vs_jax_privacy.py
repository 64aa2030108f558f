"""One-run epsilon lower bounds: cbdp_jax.one_run beside jax_privacy's CanaryScoreAuditor, same scores.

Each repeat draws m canaries, each included with probability 1/2, and one score per canary from a
mechanism of KNOWN privacy: Gaussian scores (N(mu, 1) if included, N(0, 1) if not: mu-GDP, true eps at
delta from the GDP curve) or randomized response on the inclusion bit (eps-DP; true eps at delta =
log(e^eps - delta (1 + e^eps))). Both tools get the same scores; each reports its bounds at level 95%.

Columns. Ours: ``steinke``, ``fdp`` (the f-DP test with the (eps, delta) curve), ``gdp`` (its
``epsilon``, which is the ``fdp`` bound on the same guesses: equal to ``fdp`` by construction),
``gdp_curve`` (its ``epsilon_gaussian_curve``: the refuted GDP mu's eps at delta, valid as an (eps,
delta) bound only for an exactly Gaussian curve), ``gaussian_scores`` (the continuous-score bound
under a Gaussian model of the scores; it refuses binary scores, counted in ``refused``), and
``steinke_all`` / ``gdp_curve_all``: ``steinke`` and ``gdp_curve`` with a family of one choice fixed in
advance (guess on every canary, two-sided, centred). jax_privacy: ``jp_steinke`` =
``epsilon_one_run``, ``jp_fdp`` = ``epsilon_one_run_fdp`` (default ``Bonferroni()``), which is a
GDP-curve number like ``gdp_curve``.

"Above truth" is counted twice: against the mechanism's true eps at delta (what an (eps, delta) lower
bound may not exceed) and, for the GDP-curve columns, against the eps of the mechanism's least GDP
envelope (what a refuted mu's eps may not exceed).

Needs the ``peer`` extra in its own environment (never in the project's):
  python3 -m venv /tmp/jpvenv && /tmp/jpvenv/bin/pip install -e . jax-privacy==2.0.0
  /tmp/jpvenv/bin/python benchmarks/one_run_vs_jax_privacy.py --repeats 200
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from cbdp_jax import InvalidParameterError, one_run
from cbdp_jax._src.infra.io import git_commit

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
OURS = (
    "steinke", "fdp", "gdp", "gdp_curve", "gaussian_scores", "steinke_all", "gdp_curve_all",
)  # fmt: skip  # *_all: the one choice "guess all m"
THEIRS = ("jp_steinke", "jp_fdp")
GDP_CURVE = ("gdp_curve", "gdp_curve_all", "jp_fdp")  # GDP-convention numbers
PAIRS = (
    ("steinke", "jp_steinke"), ("fdp", "jp_fdp"), ("gdp_curve", "jp_fdp"),
    ("gaussian_scores", "jp_fdp"),
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
    """Every tool's bound on the same scores (nan where ``gaussian_scores`` refuses them)."""
    from jax_privacy import auditing

    out, m = {}, scores.size
    for method in ("steinke", "fdp", "gdp"):
        b = one_run.one_run_audit(scores, inc, delta=delta, level=LEVEL, method=method)
        out[method] = b.epsilon
        if method == "gdp":
            out["gdp_curve"] = b.epsilon_gaussian_curve
    try:
        out["gaussian_scores"] = one_run.one_run_audit(
            scores, inc, delta=delta, level=LEVEL, method="gaussian-scores"
        ).epsilon
    except InvalidParameterError:
        out["gaussian_scores"] = math.nan
    everyone = [((m + 1) // 2, m // 2)]  # a family of one, fixed in advance: guess on every canary
    out["steinke_all"] = one_run.one_run_audit(
        scores, inc, delta=delta, level=LEVEL, method="steinke", choices=everyone
    ).epsilon
    out["gdp_curve_all"] = one_run.one_run_audit(
        scores, inc, delta=delta, level=LEVEL, method="gdp", choices=everyone
    ).epsilon_gaussian_curve
    auditor = auditing.CanaryScoreAuditor(scores[inc], scores[~inc])
    out["jp_steinke"] = float(auditor.epsilon_one_run(1.0 - LEVEL, delta))
    out["jp_fdp"] = float(auditor.epsilon_one_run_fdp(1.0 - LEVEL, delta))
    return out


def _summary(vals: dict[str, np.ndarray], truth: float, truth_gdp: float) -> dict:
    """Means over the runs a tool did not refuse, refusals, and the shares above the truths."""
    ok = {t: v[np.isfinite(v)] for t, v in vals.items()}
    n = len(next(iter(vals.values())))
    return {
        "mean": {t: float(v.mean()) if v.size else None for t, v in ok.items()},
        "std": {t: float(v.std(ddof=1)) if v.size > 1 else None for t, v in ok.items()},
        "refused": {t: int(n - v.size) for t, v in ok.items()},
        "above_true_epsilon": {t: float((v > truth).sum() / n) for t, v in ok.items()},
        "above_gdp_envelope": {t: float((ok[t] > truth_gdp).sum() / n) for t in GDP_CURVE},
    }


def run_case(case, repeats: int, seed: int) -> dict:
    kind, param, m, delta = case
    rng = np.random.default_rng([seed, int(param * 100), m, int(-math.log10(delta))])
    truth = true_epsilon(kind, param, delta)
    truth_gdp = gdp_truth(kind, param, delta)
    start = time.perf_counter()
    rows = [bounds(*draw(rng, kind, param, m), delta) for _ in range(repeats)]
    vals = {t: np.array([r[t] for r in rows]) for t in rows[0]}
    both = {a: np.isfinite(vals[a]) for a, _ in PAIRS}
    return {
        "kind": kind, "param": param, "m": m, "delta": delta, "true_epsilon": truth,
        "true_epsilon_of_gdp_envelope": truth_gdp,
        "repeats": repeats, "seconds": time.perf_counter() - start,
        **_summary(vals, truth, truth_gdp),
        "ours_ge_theirs": {
            f"{a}>={b}": float((vals[a][both[a]] >= vals[b][both[a]]).mean()) if both[a].any()
            else None for a, b in PAIRS
        },
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(OUT))
    p.add_argument(
        "--only", default="", help="run only the cases whose kind is this (gdp, rr, rrj)"
    )
    args = p.parse_args()
    commit = git_commit() or "unknown"  # the tree that runs, read before the (long) run
    import importlib.metadata as md

    rows = []
    head = f"{'case':<24}{'true':>7}{'gdp-env':>8}" + "".join(f"{t:>16}" for t in (*OURS, *THEIRS))
    print(head + "  above true eps (max over (eps, delta) columns)")
    for case in (c for c in CASES if args.only in ("", c[0])):
        r = run_case(case, args.repeats, args.seed)
        rows.append(r)
        name = f"{r['kind']} {r['param']:g} m={r['m']} d={r['delta']:g}"
        means = "".join(f"{'-' if v is None else f'{v:.3f}':>16}" for v in r["mean"].values())
        sound = ("steinke", "fdp", "gdp", "gaussian_scores", "steinke_all", "jp_steinke")
        worst = max(r["above_true_epsilon"][t] for t in sound)
        print(f"{name:<24}{r['true_epsilon']:>7.3f}{r['true_epsilon_of_gdp_envelope']:>8.3f}"
              + means + f"  {worst:.3f}", flush=True)  # fmt: skip
    payload = {
        "config": vars(args) | {"level": LEVEL},
        "commit": commit,
        "versions": {k: md.version(k) for k in ("jax-privacy", "numpy", "scipy", "dp-accounting")},
        "cases": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    main()
