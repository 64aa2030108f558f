"""Privacy loss growing with adversary capacity: restricted KL and Renyi over a ladder of classes.

For Laplace eps in {0.5, 1, 2} and Gaussian sigma = 1 (sensitivity 1), the restricted KL and Renyi
(alpha = 2, 4) are estimated (held-out values, :func:`cbdp_jax.estimator.estimate`) for classes of
increasing capacity: linear, poly_2, poly_3, two-layer ReLU networks relu2 of width 2, 4, ..., 256, deeper
ReLU networks and random Fourier features. Beside them: the exact restricted value where it exists
(linear and polynomial classes, :mod:`cbdp_jax.exact`) and the unrestricted divergence
(:mod:`cbdp_jax.analytic`), the ceiling every class stays under.

Every (mechanism, divergence, class) is one unit of work (:mod:`cbdp_jax.experiments._units`), kept
under ``out_dir/.units/capacity_curve-{quick,full}``: a killed sweep restarted with the same arguments
skips the finished units and produces the same output as an uninterrupted run.

Checks compare a Bonferroni (5% family-wise) lower bound of each estimate with the exact and unrestricted
values (the estimator targets the exact value, so each comparison is a coverage event), and test that
the widest network class certifiably exceeds the exact linear value wherever the linear class leaves a
gap of at least 0.05 below the unrestricted divergence. A bound the estimator flags unreliable (one
held-out sample dominates the variance) counts as the trivial bound 0.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np

from cbdp_jax.experiments._common import (
    budget_summary,
    check,
    config_from_dict,
    estimator_config,
    estimator_dict,
    pyplot,
    save_outputs,
)
from cbdp_jax.experiments._units import Unit, run_experiment
from cbdp_jax.statistics import family_confidence, z_quantile

NAME = "capacity_curve"
WIDTHS = (2, 4, 8, 16, 32, 64, 128, 256)


def _classes(quick: bool) -> list[tuple[str, dict[str, Any]]]:
    """The capacity ladder: (label, adversary options) in increasing capacity."""
    if quick:
        return [
            ("linear", {"name": "linear"}),
            ("poly_2", {"name": "poly", "degree": 2}),
            *[(f"relu2(w={w})", {"name": "relu2", "width": w}) for w in (2, 8, 32)],
        ]
    return [
        ("linear", {"name": "linear"}),
        ("poly_2", {"name": "poly", "degree": 2}),
        ("poly_3", {"name": "poly", "degree": 3}),
        *[(f"relu2(w={w})", {"name": "relu2", "width": w}) for w in WIDTHS],
        ("mlp(64x2)", {"name": "mlp", "width": 64, "depth": 2}),
        ("mlp(64x3)", {"name": "mlp", "width": 64, "depth": 3}),
        ("rff(F=64)", {"name": "rff", "features": 64}),
        ("rff(F=256)", {"name": "rff", "features": 256}),
    ]


def _mechanisms(quick: bool) -> list[tuple[str, float]]:
    if quick:
        return [("laplace", 1.0)]
    return [("laplace", 0.5), ("laplace", 1.0), ("laplace", 2.0), ("gaussian", 1.0)]


def _divergences(quick: bool) -> list[tuple[str, float | None]]:
    if quick:
        return [("kl", None)]
    return [("kl", None), ("renyi", 2.0), ("renyi", 4.0)]


def _div_label(div: str, alpha: float | None) -> str:
    return "KL" if div == "kl" else f"Renyi(alpha={alpha:g})"


def _mech_label(family: str, param: float) -> str:
    return f"Laplace eps={param:g}" if family == "laplace" else f"Gaussian sigma={param:g}"


def unrestricted(family: str, param: float, div: str, alpha: float | None) -> float:
    """The unrestricted divergence of the canonical pair (closed form)."""
    from cbdp_jax import analytic

    if family == "laplace":
        return analytic.laplace_kl(param) if div == "kl" else analytic.laplace_renyi(alpha, param)
    return analytic.gaussian_kl(param) if div == "kl" else analytic.gaussian_renyi(alpha, param)


def exact_value(family: str, param: float, div: str, alpha: float | None, options) -> float | None:
    """The exact restricted value for the linear and polynomial classes (quadrature), else None."""
    from cbdp_jax import exact

    if options["name"] not in ("linear", "poly"):
        return None
    pair = exact.laplace_pair(param) if family == "laplace" else exact.gaussian_pair(param)
    degree = options.get("degree", 1)
    adversary = "linear" if options["name"] == "linear" else "poly"
    return float(
        exact.restricted_divergence(pair, div, adversary, degree=degree, alpha=alpha).value
    )


def _float(value: Any) -> float:
    return float(value) if value is not None else math.nan


SEED = 2019_1212
FULL_STEPS = 2000


def _samples(quick: bool) -> int:
    return 20_000 if quick else 100_000


def _kind(options: dict[str, Any]) -> str:
    """The cost-table row of a class: wide two-layer networks cost more than narrow ones."""
    name = options["name"]
    if name == "relu2" and options["width"] >= 64:
        return "relu2_wide"
    return name


def _n_compare(quick: bool) -> int:
    """Simultaneous comparisons of lower bounds with exact values (two per unit, one per curve)."""
    n_units = len(_mechanisms(quick)) * len(_divergences(quick)) * len(_classes(quick))
    return 2 * n_units + len(_mechanisms(quick)) * len(_divergences(quick))


def plan(quick: bool) -> list[Unit]:
    """One unit per (mechanism, divergence, class).

    Args:
      quick: Laplace eps = 1, KL only, five classes.

    Returns:
      The units, mechanism-major, then divergence, then class in increasing capacity.

    """
    mode = "quick" if quick else "full"
    budget = estimator_dict(
        estimator_config(quick, full_steps=FULL_STEPS, family_size=_n_compare(quick))
    )
    units = []
    for mi, (family, param) in enumerate(_mechanisms(quick)):
        for di, (div, alpha) in enumerate(_divergences(quick)):
            for ci, (cls, options) in enumerate(_classes(quick)):
                uid = f"{mode}|{_mech_label(family, param)}|{_div_label(div, alpha)}|{cls}"
                config = {
                    "quick": quick,
                    "family": family,
                    "param": param,
                    "divergence": div,
                    "alpha": alpha,
                    "class": cls,
                    "options": options,
                    "capacity_rank": ci,
                    "fold": [mi, di, ci],
                    "seed": SEED,
                    "samples": _samples(quick),
                    "estimator": budget,
                }
                units.append(Unit(id=uid, config=config, kind=_kind(options)))
    return units


def compute(config: dict) -> dict[str, Any]:
    """One estimate with its exact (where known) and unrestricted reference values."""
    from cbdp_jax.adversaries import make_adversary
    from cbdp_jax.estimator import estimate
    from cbdp_jax.mechanisms import GaussianMechanism, LaplaceMechanism

    family, param = config["family"], config["param"]
    div, alpha, options = config["divergence"], config["alpha"], config["options"]
    if family == "laplace":
        mech = LaplaceMechanism(epsilon=param)
    else:
        mech = GaussianMechanism(sigma=param)
    spec = make_adversary(**options)
    key = jax.random.key(config["seed"])
    for index in config["fold"]:
        key = jax.random.fold_in(key, index)
    res = estimate(
        key,
        mech,
        samples=config["samples"],
        adversary=spec,
        divergence=div,
        alpha=alpha,
        config=config_from_dict(config["estimator"]),
    )
    return {
        "mechanism": _mech_label(family, param),
        "divergence": _div_label(div, alpha),
        "class": config["class"],
        "class_label": spec.label,
        "capacity_rank": config["capacity_rank"],
        "estimate": res.estimate,
        "lower_bound": res.lower_bound,
        "std_error": res.std_error,
        "bound_reliable": bool(getattr(res, "bound_reliable", True)),
        "exact": exact_value(family, param, div, alpha, options),
        "unrestricted": unrestricted(family, param, div, alpha),
        "seconds": res.seconds,
        "warnings": " | ".join(res.warnings),
    }


def run(out_dir: str | Path, *, quick: bool = False) -> dict:
    """Runs the capacity sweep (resumable); writes capacity_curve.png / .csv / .json.

    Args:
      out_dir: Output folder; finished units are kept under
        ``out_dir/.units/capacity_curve-{quick,full}``.
      quick: Laplace eps = 1, KL only, classes linear, poly_2 and relu2 of width 2, 8, 32, few steps.

    Returns:
      The summary with its ``checks``, ``units`` and ``units_reused``.

    """
    return run_experiment(sys.modules[__name__], out_dir, quick=quick)


def finish(out_dir: str | Path, results: dict, *, quick: bool, seconds: float = 0.0) -> dict:
    """Checks, figure and outputs from the units' results (``unit id -> row``)."""
    plt = pyplot()

    config = estimator_config(quick, full_steps=FULL_STEPS)
    # Each unit's bound is one of n_compare simultaneous bounds (Bonferroni, taken by the estimator on
    # the f-scale, see plan); a refused bound is the trivial 0.
    n_compare = _n_compare(quick)
    z = z_quantile(config.confidence)
    rows = _rows(results)
    checks = _bound_checks(rows) + _growth_checks(rows, _mechanisms(quick), _divergences(quick))
    fig = _figure(plt, rows, quick, z)
    summary = {
        "checks": checks,
        "quick": quick,
        "units": len(results),
        "samples": _samples(quick),
        "config": budget_summary(config),
        "familywise_level": family_confidence(0.95, n_compare),
        "seconds": seconds,
    }
    return save_outputs(out_dir, NAME, rows=rows, summary=summary, figure=fig)


def _rows(results: dict) -> list[dict[str, Any]]:
    """The units' rows with numbers as floats (None as NaN), the family-wise bound and the unit id."""
    rows = []
    for uid, r in results.items():
        r = dict(r)
        for k in ("estimate", "lower_bound", "std_error", "exact", "unrestricted"):
            r[k] = _float(r[k])
        r["lower_bound_familywise"] = r["lower_bound"]
        r["unit"] = uid
        rows.append(r)
    return rows


def _bound_checks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each lower bound against the unrestricted divergence and, where known, the exact value."""
    checks: list[dict[str, Any]] = []
    for r in rows:
        tag = f"{r['mechanism']}, {r['divergence']}, {r['class']}"
        lb = r["lower_bound_familywise"]
        why = _nothing_certified(r)
        checks.append(
            check(
                f"{tag}: family-wise lower bound <= unrestricted divergence",
                lb <= r["unrestricted"],
                f"{lb:.4f} (estimate {r['estimate']:.4f} +- {r['std_error']:.4f}) <= "
                f"{r['unrestricted']:.4f}" + why,
            )
        )
        if not math.isnan(r["exact"]):
            checks.append(
                check(
                    f"{tag}: family-wise lower bound <= exact restricted value",
                    lb <= r["exact"],
                    f"{lb:.4f} (estimate {r['estimate']:.4f}) <= exact {r['exact']:.6f}" + why,
                )
            )
    return checks


def _nothing_certified(r: dict[str, Any]) -> str:
    """For a bound at or below 0: why, and that the check then holds trivially ('' otherwise)."""
    if r["lower_bound_familywise"] > 0:
        return ""
    if not r.get("bound_reliable", True):
        cause = "the bound was refused (its assumption failed on the held-out data), so it is 0"
    else:
        cause = "the family-wise bound reaches 0 (the estimate is within its margin of 0)"
    return (
        f"; nothing certified: {cause}, and the check holds for any value (it tests nothing here)"
    )


def _growth_checks(
    rows: list[dict[str, Any]],
    mechs: list[tuple[str, float]],
    divs: list[tuple[str, float | None]],
) -> list[dict[str, Any]]:
    """The widest relu2 class certifiably above the exact linear value where the gap allows it."""
    checks: list[dict[str, Any]] = []
    for family, param in mechs:
        for div, alpha in divs:
            mech_l, div_l = _mech_label(family, param), _div_label(div, alpha)
            group = [r for r in rows if r["mechanism"] == mech_l and r["divergence"] == div_l]
            lin = next(r for r in group if r["class"] == "linear")
            nets = [r for r in group if r["class"].startswith("relu2")]
            widest = nets[-1]
            gap = lin["unrestricted"] - lin["exact"]
            if gap < 0.05:
                continue
            lb = widest["lower_bound_familywise"]
            checks.append(
                check(
                    f"{mech_l}, {div_l}: loss grows with capacity -- {widest['class']} certifiably "
                    "exceeds the exact linear value",
                    lb > lin["exact"],
                    f"{widest['class']} lower bound {lb:.4f} (estimate {widest['estimate']:.4f}) > "
                    f"exact linear {lin['exact']:.4f}; unrestricted {lin['unrestricted']:.4f}; "
                    "relu2 estimates by width: "
                    + ", ".join(
                        f"{r['class'].split('=')[1].rstrip(')')}: {r['estimate']:.3f}" for r in nets
                    ),
                )
            )
    return checks


def _figure(plt: Any, rows: list[dict[str, Any]], quick: bool, z: float) -> Any:
    """One panel per mechanism: estimates by capacity, exact values, unrestricted ceilings."""
    mechs, divs = _mechanisms(quick), _divergences(quick)
    ncols = len(mechs)
    fig, axes = plt.subplots(1, ncols, figsize=(6.5 * ncols, 4.4), squeeze=False)
    labels = [c for c, _ in _classes(quick)]
    for m, (family, param) in enumerate(mechs):
        ax = axes[0, m]
        mech_l = _mech_label(family, param)
        for d, (div, alpha) in enumerate(divs):
            div_l = _div_label(div, alpha)
            group = sorted(
                (r for r in rows if r["mechanism"] == mech_l and r["divergence"] == div_l),
                key=lambda r: r["capacity_rank"],
            )
            xs = np.array([r["capacity_rank"] for r in group])
            color = f"C{d}"
            ax.errorbar(xs, [r["estimate"] for r in group], yerr=[z * r["std_error"] for r in group],
                        fmt="o-", color=color, capsize=3, label=f"{div_l}: estimate")  # fmt: skip
            ex = [(r["capacity_rank"], r["exact"]) for r in group if not math.isnan(r["exact"])]
            if ex:
                ax.plot(*zip(*ex, strict=True), "kx", ms=8, label="exact" if d == 0 else None)
            ax.axhline(group[0]["unrestricted"], color=color, ls="--", lw=1,
                       label=f"{div_l}: unrestricted")  # fmt: skip
        ax.set_xticks(range(len(labels)), labels, rotation=60, fontsize=7)
        ax.set_title(f"{mech_l}: restricted divergence vs adversary capacity")
        ax.set_ylabel("privacy loss")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
