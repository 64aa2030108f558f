"""Theorems 3 and 4: parallel and sequential composition for additive adversary classes.

The joint release (M_1(D_1), M_2(D_2)) of two independent mechanisms is attacked by the additive class
H = {h_1(x_1) + h_2(x_2)}. Two such classes are expressible with :class:`~cbdp_jax.adversaries.AdversarySpec`:

* ``linear`` on the concatenated output: a . x + b = (a_1 x_1) + (a_2 x_2) + b is additive, with H_i the
  linear class of each block (convex, translation invariant, containing constants);
* ``poly`` of degree k: the class is b + sum_i sum_j w_ij x_i^j (no cross terms), i.e. additive with H_i
  the 1-D poly_k class.

Additive *networks* (a separate ReLU network per block) are not expressible with the current
``AdversarySpec`` (``feature_map`` is fixed, not trained), so the experiment is restricted to these two
classes.

Sequential composition (Thm 4: same data, every component changes between neighbours): the restricted
KL / Renyi of the joint release is at most eps_1 + eps_2, the components' exact restricted values
(:mod:`cbdp_jax.exact`). For KL the bound is an equality for additive classes on independent blocks (the
Donsker-Varadhan objective separates), for Renyi it is strict. Parallel composition (Thm 3: disjoint data,
a neighbour changes one block only): at most max(eps_1, eps_2). The components are Laplace(eps = 1) and
Laplace(eps = 0.5) (both with sensitivity 1), whose joint pair is, after rescaling the second coordinate,
the 2-D Laplace pair with shift (1, 0.5), so the exact joint linear value is also available; the full
run adds Laplace(eps = 1) with Gaussian(sigma = 1).

The bounds are attained (sequential KL; a parallel pair equals one component), so comparing a lower
bound with them is a coverage event: the checks use a Bonferroni lower bound, estimate - z SE with z the
1 - 0.05 / m normal quantile over the m comparisons (5% family-wise).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np

from cbdp_jax.experiments._common import (
    StoredEstimate,
    Timer,
    budget_summary,
    check,
    config_from_dict,
    estimator_config,
    estimator_dict,
    pyplot,
    save_outputs,
)
from cbdp_jax.experiments._units import Unit, run_experiment
from cbdp_jax.statistics import z_quantile

NAME = "composition"


def _component(family: str, param: float):
    from cbdp_jax import exact
    from cbdp_jax.mechanisms import GaussianMechanism, LaplaceMechanism

    if family == "laplace":
        return LaplaceMechanism(epsilon=param), exact.laplace_pair(param)
    return GaussianMechanism(sigma=param), exact.gaussian_pair(param)


def _exact(pair, divergence: str, degree: int, alpha: float | None) -> float:
    from cbdp_jax import exact

    adversary = "linear" if degree == 1 else "poly"
    return float(
        exact.restricted_divergence(pair, divergence, adversary, degree=degree, alpha=alpha).value
    )


def _joint_exact(case, divergence: str, degree: int, alpha: float | None) -> float | None:
    """Exact joint value for two Laplace components and the linear class (2-D Laplace pair), else None."""
    from cbdp_jax import exact

    (f1, p1), (f2, p2) = case
    if degree != 1 or f1 != "laplace" or f2 != "laplace":
        return None
    # Lap(0, 1/p2) shifted by 1 equals, after scaling by p2 / p1, Lap(0, 1/p1) shifted by p2 / p1;
    # the linear class is invariant under coordinate scaling.
    pair = exact.laplace_pair(p1, [1.0, p2 / p1])
    return float(exact.restricted_divergence(pair, divergence, "linear", alpha=alpha).value)


SEED = 2019_0304
FULL_STEPS = 3000
RELEASES = ("sequential (both change)", "parallel (block 1 changes)", "parallel (block 2 changes)")


def _cases(quick: bool):
    if quick:
        return ((("laplace", 1.0), ("laplace", 0.5)),)
    return ((("laplace", 1.0), ("laplace", 0.5)), (("laplace", 1.0), ("gaussian", 1.0)))


def _settings(quick: bool):
    if quick:
        return (("kl", None, 1), ("kl", None, 2), ("renyi", 2.0, 1))
    return tuple(
        (div, alpha, deg)
        for div, alpha in (("kl", None), ("renyi", 2.0), ("renyi", 4.0))
        for deg in (1, 2)
    )


def _samples(quick: bool) -> int:
    return 20_000 if quick else 200_000


def _unit_id(case, div: str, alpha: float | None, degree: int, release: str) -> str:
    (f1, p1), (f2, p2) = case
    div_label = "KL" if div == "kl" else f"Renyi(alpha={alpha:g})"
    cls = "linear" if degree == 1 else f"poly_{degree}"
    return f"{f1}({p1:g})+{f2}({p2:g})|{cls}|{div_label}|{release}"


def _n_compare(quick: bool) -> int:
    """Simultaneous comparisons of a lower bound with an exact value (three per case and setting)."""
    return len(_cases(quick)) * len(_settings(quick)) * 3


def plan(quick: bool) -> list[Unit]:
    """One unit per (pair of components, class, divergence, release).

    Args:
      quick: One pair of components and three settings.

    Returns:
      The units, in the order the experiment ran them before it was split into units.

    """
    base = {
        "quick": quick,
        "seed": SEED,
        "samples": _samples(quick),
        "estimator": estimator_dict(
            estimator_config(quick, full_steps=FULL_STEPS, family_size=_n_compare(quick))
        ),
    }
    units, counter = [], 0
    for case in _cases(quick):
        for div, alpha, degree in _settings(quick):
            for release in RELEASES:
                counter += 1
                config = {**base, "case": [list(c) for c in case], "divergence": div,
                          "alpha": alpha, "degree": degree, "release": release, "fold": counter}  # fmt: skip
                uid = _unit_id(case, div, alpha, degree, release)
                units.append(Unit(id=uid, config=config, kind="linear" if degree == 1 else "poly"))
    return units


def compute(config: dict) -> dict:
    """One held-out estimate on one joint release (a unit of :func:`plan`)."""
    from cbdp_jax.estimator import estimate
    from cbdp_jax.mechanisms import JointRelease, NeighbouringPair, canonical_pair

    (f1, p1), (f2, p2) = config["case"]
    joint = JointRelease(mechanisms=(_component(f1, p1)[0], _component(f2, p2)[0]))
    zero = (np.zeros(1), np.zeros(1))
    pair = {
        RELEASES[0]: lambda: canonical_pair(joint),
        RELEASES[1]: lambda: NeighbouringPair(joint, zero, (np.ones(1), np.zeros(1))),
        RELEASES[2]: lambda: NeighbouringPair(joint, zero, (np.zeros(1), np.ones(1))),
    }[config["release"]]()
    degree = config["degree"]
    res = estimate(
        jax.random.fold_in(jax.random.key(config["seed"]), config["fold"]),
        pair,
        samples=config["samples"],
        adversary="linear" if degree == 1 else "poly",
        degree=None if degree == 1 else degree,
        divergence=config["divergence"],
        alpha=config["alpha"],
        config=config_from_dict(config["estimator"]),
    )
    return StoredEstimate.from_result(res).to_dict()


def run(out_dir: str | Path, *, quick: bool = False) -> dict:
    """Runs the composition experiment (resumable); writes composition.png / .csv / .json.

    Args:
      out_dir: Output folder; units are kept under ``out_dir/.units/composition-{quick,full}``.
      quick: One pair of components, KL (linear and poly_2) and Renyi alpha = 2 (linear), small samples.

    Returns:
      The summary with its ``checks``.

    """
    return run_experiment(sys.modules[__name__], out_dir, quick=quick)


def finish(out_dir: str | Path, results: dict, *, quick: bool, seconds: float = 0.0) -> dict:
    """Checks, figure and outputs from the units' results (``unit id -> stored estimate``)."""
    plt = pyplot()

    config = estimator_config(quick, full_steps=FULL_STEPS)
    cases, settings, samples = _cases(quick), _settings(quick), _samples(quick)
    z = z_quantile(config.confidence)
    # Several bounds are attained (sequential KL is additive; a parallel pair equals one component), so
    # each comparison is a coverage event: use a Bonferroni lower bound over all of them (5% family-wise).
    # Each estimate's bound is one of n_compare simultaneous bounds (Bonferroni, taken by the estimator
    # on the f-scale, see plan).
    n_compare = _n_compare(quick)
    rows: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    plot: list[dict[str, Any]] = []

    with Timer() as timer:
        for case in cases:
            for div, alpha, degree in settings:
                entry = _entry(case, div, alpha, degree, results)
                for kind in RELEASES:
                    rows.append(_row(entry, kind))
                    checks.append(_release_check(entry, kind, n_compare))
                if entry["joint_exact"] is not None:
                    checks.append(_joint_check(entry, div))
                plot.append(entry)

    fig = _figure(plt, plot, z)
    summary = {
        "checks": checks,
        "quick": quick,
        "samples": samples,
        "config": budget_summary(config),
        "seconds": seconds + timer.seconds,
        "note": "additive network classes are not expressible with AdversarySpec; linear and "
        "per-coordinate polynomial classes are additive",
    }
    return save_outputs(out_dir, NAME, rows=rows, summary=summary, figure=fig)


def _entry(case, div: str, alpha: float | None, degree: int, results: dict) -> dict[str, Any]:
    """One (case, setting): the components' exact values, the exact joint value, the three estimates."""
    (f1, p1), (f2, p2) = case
    m1, pair1 = _component(f1, p1)
    m2, pair2 = _component(f2, p2)
    return {
        "case": f"{m1.label} + {m2.label}",
        "class": "linear" if degree == 1 else f"poly_{degree}",
        "divergence": "KL" if div == "kl" else f"Renyi(alpha={alpha:g})",
        "eps1": _exact(pair1, div, degree, alpha),
        "eps2": _exact(pair2, div, degree, alpha),
        "joint_exact": _joint_exact(case, div, degree, alpha),
        "results": {
            kind: StoredEstimate.from_dict(results[_unit_id(case, div, alpha, degree, kind)])
            for kind in RELEASES
        },
    }


def _bound(entry: dict[str, Any], kind: str) -> float:
    """Thm 4's eps1 + eps2 for the sequential release, Thm 3's max(eps1, eps2) for a parallel one."""
    eps1, eps2 = entry["eps1"], entry["eps2"]
    return eps1 + eps2 if kind.startswith("sequential") else max(eps1, eps2)


def _row(entry: dict[str, Any], kind: str) -> dict[str, Any]:
    """The CSV row of one release's estimate beside its bound."""
    res = entry["results"][kind]
    sequential = kind.startswith("sequential")
    return {
        "case": entry["case"],
        "release": kind,
        "class": res.adversary,
        "divergence": res.divergence,
        "estimate": res.estimate,
        "lower_bound": res.lower_bound,
        "std_error": res.std_error,
        "bound_reliable": getattr(res, "bound_reliable", True),
        "eps1_exact": entry["eps1"],
        "eps2_exact": entry["eps2"],
        "bound": _bound(entry, kind),
        "bound_kind": "eps1 + eps2" if sequential else "max(eps1, eps2)",
        "joint_exact": entry["joint_exact"] if sequential else None,
        "warnings": " | ".join(res.warnings),
    }


def _release_check(entry: dict[str, Any], kind: str, n_compare: int) -> dict[str, Any]:
    """Thm 3 or 4 for one release: the estimator's family-wise lower bound under the bound."""
    res = entry["results"][kind]
    sequential = kind.startswith("sequential")
    bound = _bound(entry, kind)
    eps1, eps2 = entry["eps1"], entry["eps2"]
    thm = "Thm 4 (sequential)" if sequential else "Thm 3 (parallel)"
    # The estimator's family-wise bound (the trivial 0 when refused).
    lb_fw = res.lower_bound
    return check(
        f"{thm}, {entry['case']}, ({entry['class']}, {entry['divergence']}), {kind}: family-wise lower "
        "bound <= " + ("eps1 + eps2" if sequential else "max(eps1, eps2)"),
        lb_fw <= bound,
        f"family-wise {1 - 0.05 / n_compare:.4f} lower bound {lb_fw:.4f} "
        f"(estimate {res.estimate:.4f} +- {res.std_error:.4f}, "
        f"{res.guarantee}) <= {bound:.4f} (eps1 = {eps1:.4f}, eps2 = "
        f"{eps2:.4f}, exact)",
    )


def _joint_check(entry: dict[str, Any], div: str) -> dict[str, Any]:
    """Thm 4 on exact values: the joint value equals (KL) or is at most (Renyi) eps1 + eps2."""
    joint_ex, total = entry["joint_exact"], entry["eps1"] + entry["eps2"]
    tight = div == "kl"
    holds = abs(joint_ex - total) <= 1e-6 if tight else joint_ex <= total + 1e-9
    return check(
        f"Thm 4 on exact values, {entry['case']}, ({entry['class']}, {entry['divergence']}): joint "
        + ("= eps1 + eps2 (DV separates)" if tight else "<= eps1 + eps2"),
        holds,
        f"exact joint {joint_ex:.6f}, eps1 + eps2 = {total:.6f}",
    )


def _figure(plt: Any, plot: list[dict[str, Any]], z: float) -> Any:
    """Bars of the three releases' estimates per (case, setting), with both bounds and the exact joint."""
    fig, ax = plt.subplots(figsize=(max(6.0, 2.2 * len(plot)), 4.2))
    kinds = list(RELEASES)
    width = 0.25
    for j, kind in enumerate(kinds):
        xs = np.arange(len(plot)) + (j - 1) * width
        est = [e["results"][kind].estimate for e in plot]
        err = [z * e["results"][kind].std_error for e in plot]
        ax.bar(xs, est, width, yerr=err, capsize=3, color=f"C{j}", label=f"{kind}: estimate")
    for i, e in enumerate(plot):
        s = e["eps1"] + e["eps2"]
        mx = max(e["eps1"], e["eps2"])
        ax.plot([i - 1.5 * width, i + 1.5 * width], [s, s], "k-", lw=1.5,
                label="eps1 + eps2 (Thm 4)" if i == 0 else None)  # fmt: skip
        ax.plot([i - 1.5 * width, i + 1.5 * width], [mx, mx], "k--", lw=1,
                label="max(eps1, eps2) (Thm 3)" if i == 0 else None)  # fmt: skip
        if e["joint_exact"] is not None:
            ax.plot([i - width], [e["joint_exact"]], "r*", ms=9,
                    label="exact joint (sequential)" if i == 0 else None)  # fmt: skip
    ax.set_xticks(
        np.arange(len(plot)),
        [
            f"{e['case'].replace(' + ', chr(10) + '+ ')}\n{e['class']}, {e['divergence']}"
            for e in plot
        ],
        fontsize=6,
    )
    ax.set_ylabel("restricted divergence")
    ax.set_title("Composition for additive classes h1(x1) + h2(x2)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
