"""Accuracy of held-out estimates against exact values, as the number of test samples grows.

Laplace (epsilon = 1) and Gaussian (sigma = 1); KL and Renyi alpha = 4; classes linear, poly_3 and an
MLP (32 x 2 ReLU). Each (class, divergence) is ONE sweep over both mechanisms and ``repeats`` seeds
(independent training noise per member, ``shared_noise=False``); each trained member is then evaluated on
independent fresh test sets of n = 10^3 .. 10^7 samples per side (quick: up to 10^6).

Reference values: linear and poly_3 against the exact restricted value (cbdp_jax.exact: quadrature
plus a concave solver); the MLP against the unrestricted analytic value (cbdp_jax.analytic), which
bounds D^MLP from above, so the MLP's error includes the class gap. Reported per setting: absolute
error, the reported SE, their ratio, and the coverage of the one-sided 95% lower bound over repeats.

The verdict: at n = 10^6 the linear-class estimate (seed 0) lies within 3 SE of the exact value, for KL
and Renyi alpha = 4 on both mechanisms.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

from cbdp_jax import analytic, exact  # noqa: E402
from cbdp_jax.adversaries import AdversarySpec  # noqa: E402
from cbdp_jax.mechanisms import GaussianMechanism, LaplaceMechanism  # noqa: E402
from cbdp_jax.sweep import SweepConfig, evaluate_sweep, train_sweep  # noqa: E402

MECHANISMS = (LaplaceMechanism(epsilon=1.0), GaussianMechanism(sigma=1.0))
DIVERGENCES = (("kl", None), ("renyi", 4.0))
CLASSES = {
    "linear": AdversarySpec(name="linear"),
    "poly_3": AdversarySpec(name="poly", degree=3),
    "mlp": AdversarySpec(name="mlp", width=32, depth=2),
}


def reference(mechanism, divergence: str, alpha: float | None, cls: str) -> tuple[float, str]:
    """The value an estimate is compared with, and where it comes from."""
    pair = exact.noise_pair_from(mechanism)
    if cls == "linear":
        return exact.restricted_divergence(pair, divergence, "linear", alpha=alpha).value, "exact"
    if cls == "poly_3":
        r = exact.restricted_divergence(pair, divergence, "poly", degree=3, alpha=alpha)
        return r.value, "exact"
    if mechanism.family == "laplace":
        e = mechanism.epsilon
        value = analytic.laplace_kl(e) if divergence == "kl" else analytic.laplace_renyi(alpha, e)
    else:
        s = mechanism.sigma
        value = analytic.gaussian_kl(s) if divergence == "kl" else analytic.gaussian_renyi(alpha, s)
    return value, "unrestricted"


def config_for(cls: str, quick: bool) -> SweepConfig:
    """Training budget per class (linear classes converge fast; the MLP needs more steps)."""
    if cls == "mlp":
        steps, batch = (2000, 1024) if quick else (6000, 4096)
    else:
        steps, batch = (3000, 4096) if quick else (6000, 8192)
    return SweepConfig(
        steps=steps,
        eval_every=100,
        batch_size=batch,
        val_samples=16384,
        eval_chunk=65536,
        shared_noise=False,
        learning_rate=5e-3,
    )


def run(quick: bool, seed: int = 0) -> dict[str, Any]:
    """All settings; returns the JSON payload."""
    sizes = [10**k for k in range(3, 7 if quick else 8)]
    repeats = 4 if quick else 8
    key = jax.random.key(seed)
    rows: list[dict[str, Any]] = []
    timings = []
    for ci, (cls, spec) in enumerate(CLASSES.items()):
        for di, (div, alpha) in enumerate(DIVERGENCES):
            k_train, k_eval = jax.random.split(jax.random.fold_in(key, 10 * ci + di))
            t0 = time.perf_counter()
            training = train_sweep(
                k_train,
                MECHANISMS,
                adversaries=spec,
                divergence=div,
                alphas=None if alpha is None else (alpha,),
                seeds=repeats,
                config=config_for(cls, quick),
            )
            t_train = time.perf_counter() - t0
            refs = {m.label: reference(m, div, alpha, cls) for m in MECHANISMS}
            t0 = time.perf_counter()
            for n in sizes:
                for r in evaluate_sweep(jax.random.fold_in(k_eval, n), training, test_samples=n):
                    ref, source = refs[r["mechanism"]]
                    err = r["estimate"] - ref
                    rows.append(
                        {
                            "mechanism": r["mechanism"],
                            "family": r["family"],
                            "class": cls,
                            "divergence": r["divergence"],
                            "n": n,
                            "seed": r["seed"],
                            "estimate": r["estimate"],
                            "std_error": r["std_error"],
                            "lower_bound": r["lower_bound"],
                            "reference": ref,
                            "reference_source": source,
                            "error": err,
                            "abs_error": abs(err),
                            "error_over_se": err / r["std_error"]
                            if r["std_error"] > 0
                            else math.inf,
                            "covered": r["lower_bound"] <= ref,
                            "warnings": r["warnings"],
                        }
                    )
            timings.append(
                {
                    "class": cls,
                    "divergence": div,
                    "train_s": t_train,
                    "evaluate_s": time.perf_counter() - t0,
                }
            )
            print(
                f"  {cls:>6s} {div:>5s}: train {t_train:6.1f} s, evaluate "
                f"{timings[-1]['evaluate_s']:6.1f} s",
                flush=True,
            )
    summary = summarise(rows)
    verdicts = verdict(rows)
    return {
        "sizes": sizes,
        "repeats": repeats,
        "configs": {c: vars(config_for(c, quick)) for c in CLASSES},
        "summary": summary,
        "verdicts": verdicts,
        "linear_within_3se_at_1e6": all(v["within_3se"] for v in verdicts),
        "timings": timings,
        "rows": rows,
    }


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (mechanism, class, divergence, n): mean |error|, mean SE, their ratio, coverage."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["mechanism"], r["class"], r["divergence"], r["n"]), []).append(r)
    out = []
    for (mech, cls, div, n), rs in groups.items():
        with np.errstate(invalid="ignore"):
            out.append(_summary_row(mech, cls, div, n, rs))
    return out


def _summary_row(mech: str, cls: str, div: str, n: int, rs: list[dict[str, Any]]) -> dict[str, Any]:
    err = np.array([r["error"] for r in rs])
    se = np.array([r["std_error"] for r in rs])
    seed0 = min(rs, key=lambda r: r["seed"])
    return {
        "mechanism": mech,
        "class": cls,
        "divergence": div,
        "n": n,
        "reference": rs[0]["reference"],
        "estimate_seed0": seed0["estimate"],
        "error_seed0": seed0["error"],
        "se_seed0": seed0["std_error"],
        "mean_abs_error": float(np.mean(np.abs(err))),
        "mean_se": float(np.mean(se)),
        "abs_error_over_se": float(np.mean(np.abs(err)) / np.mean(se)),
        "within_3se": float(np.mean(np.abs(err) <= 3 * se)),
        "coverage": float(np.mean([r["covered"] for r in rs])),
        "warned": float(np.mean([bool(r["warnings"]) for r in rs])),
    }


def verdict(rows: list[dict[str, Any]], n: int = 10**6) -> list[dict[str, Any]]:
    """Linear class, seed 0, n = 10^6: is |estimate - exact| <= 3 SE, per mechanism and divergence?"""
    out = []
    for r in rows:
        if r["class"] == "linear" and r["n"] == n and r["seed"] == 0:
            out.append(
                {
                    "mechanism": r["mechanism"],
                    "divergence": r["divergence"],
                    "estimate": r["estimate"],
                    "exact": r["reference"],
                    "error": r["error"],
                    "std_error": r["std_error"],
                    "error_over_se": r["error_over_se"],
                    "within_3se": abs(r["error"]) <= 3 * r["std_error"],
                }
            )
    return out


COLUMNS = (
    "mechanism",
    "class",
    "divergence",
    "n",
    "reference",
    "estimate_seed0",
    "mean_abs_error",
    "mean_se",
    "abs_error_over_se",
    "within_3se",
    "coverage",
)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _common.parser(__doc__.splitlines()[0], "benchmarks/results/accuracy.json").parse_args(
        argv
    )
    _common.setup_device(args.device)
    payload = run(args.quick)
    _common.print_table("held-out accuracy vs exact / analytic values", payload["summary"], COLUMNS)
    for v in payload["verdicts"]:
        status = "PASS" if v["within_3se"] else "FAIL"
        print(
            f"{status}: linear {v['divergence']:>15s} {v['mechanism']:>24s} n=1e6: estimate "
            f"{v['estimate']:.5f}, exact {v['exact']:.5f}, error {v['error']:+.5f} = "
            f"{v['error_over_se']:+.2f} SE"
        )
    ok = payload["linear_within_3se_at_1e6"]
    print(f"verdict: linear-class error within 3 SE at n = 1e6 in all four cases: {ok}")
    _common.write(args.out, "accuracy", args, payload)
    return payload


if __name__ == "__main__":
    main()
