"""Adaptive 2- and 3-step releases against the sum of per-step values (an open question).

The paper's composition theorem (Theorem 4) is for non-adaptive releases and the additive class
H^T = {sum_t h_t(x_t)}; adaptive composition is left open. This experiment measures it on a DP-SGD-like
release. Each step is a Poisson-subsampled Gaussian (q = 0.5, sigma = 0.7, sensitivity 1); with the
record present, step t adds B_t a_t (B_t ~ Bernoulli(q)) to the noise, where the sign a_t = sign(x_{t-1})
is chosen from the previous output (adaptive) or a_t = +1 (non-adaptive control). Without the record every
step is N(0, sigma^2). For any fixed history, step t is the subsampled Gaussian pair with shift +-1, whose
restricted value eps_step does not depend on the sign (the classes are closed under x -> -x), so the sum
of the per-step values is T eps_step.

Compared, for T in {2, 3}, both neighbouring directions ('remove': P has the record; 'add': Q has it), KL
and Renyi alpha = 2:

* the additive quadratic class (per-coordinate poly_2, no cross terms): eps_step is exact (the exact
  layer), the joint value is a held-out estimate with its standard error. For KL in the 'remove'
  direction the sum bound provably holds (Q is a product, so the Donsker-Varadhan objective of an
  additive h separates into per-step terms whose P-marginals are mixtures of the +-1 steps; restricted KL
  is convex, paper Theorem 2) -- a built-in sanity check;
* a ReLU network on the joint output (not additive, so even non-adaptive releases may exceed the sum):
  eps_step is itself an estimate; adaptive and non-adaptive joints are both reported.

Reported per case: joint estimate +- SE, the sum T eps_step (+- T SE where estimated), the excess and its
z-score. What is found is reported either way (summary ``finding``).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
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
from cbdp_jax.mechanisms import Mechanism

NAME = "adaptive_composition"
Q_RATE = 0.5
SIGMA = 0.7


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdaptiveSteps(Mechanism):
    """T subsampled Gaussian steps whose record contribution's sign follows the previous output.

    The dataset is 1.0 (record present) or 0.0 (absent). Output x in R^T with
    x_t = d B_t a_t + sigma Z_t, B_t ~ Bernoulli(q), Z_t ~ N(0, 1) i.i.d., a_1 = 1 and
    a_t = sign(x_{t-1}) if ``adaptive`` else 1. Only sampling is needed (no density).

    Attributes:
      steps: T >= 1.
      sigma: The noise standard deviation.
      sampling_rate: q.
      adaptive: Whether a_t follows the previous output.

    """

    steps: int
    sigma: float
    sampling_rate: float
    adaptive: bool

    family: ClassVar[str] = "adaptive_steps"

    @property
    def dim(self) -> int:
        """The output dimension T."""
        return self.steps

    @property
    def label(self) -> str:
        """E.g. ``'AdaptiveSteps(T=2, adaptive)'``."""
        return f"AdaptiveSteps(T={self.steps}, {'adaptive' if self.adaptive else 'fixed'})"

    def _sample(self, key: jax.Array, dataset: Any, n: int, dtype: np.dtype) -> jax.Array:
        present = jnp.asarray(dataset, dtype=dtype)
        k_b, k_z = jax.random.split(key)
        chosen = jax.random.bernoulli(k_b, self.sampling_rate, (n, self.steps)).astype(dtype)
        noise = self.sigma * jax.random.normal(k_z, (n, self.steps), dtype=dtype)
        cols = []
        sign = jnp.ones((n,), dtype=dtype)
        for t in range(self.steps):
            x_t = present * chosen[:, t] * sign + noise[:, t]
            cols.append(x_t)
            if self.adaptive:
                sign = jnp.where(x_t >= 0, 1.0, -1.0).astype(dtype)
        return jnp.stack(cols, axis=1)


def _pair(steps: int, adaptive: bool, direction: str):
    from cbdp_jax.mechanisms import NeighbouringPair

    mech = AdaptiveSteps(steps=steps, sigma=SIGMA, sampling_rate=Q_RATE, adaptive=adaptive)
    with_record, without = np.float64(1.0), np.float64(0.0)
    if direction == "remove":
        return NeighbouringPair(mech, with_record, without)
    return NeighbouringPair(mech, without, with_record)


def _step_exact(divergence: str, alpha: float | None, direction: str) -> float:
    from cbdp_jax import exact

    pair = exact.subsampled_gaussian_pair(SIGMA, Q_RATE, direction=direction)
    return exact.restricted_divergence(pair, divergence, "poly", degree=2, alpha=alpha).value


SEED = 2024_1113
FULL_STEPS = 3000


def _samples(quick: bool) -> int:
    return 20_000 if quick else 400_000


def _grid(quick: bool):
    """(horizons, directions, divergence settings) of the experiment."""
    horizons = (2,) if quick else (2, 3)
    directions = ("remove",) if quick else ("remove", "add")
    settings = (("kl", None),) if quick else (("kl", None), ("renyi", 2.0))
    return horizons, directions, settings


def _unit_id(
    direction: str, divergence: str, alpha, steps: int, adversary: str, adaptive: bool
) -> str:
    div = "KL" if divergence == "kl" else f"Renyi(alpha={alpha:g})"
    release = "adaptive" if adaptive else "fixed"
    return f"{direction}|{div}|T={steps}|{adversary}|{release}"


def plan(quick: bool) -> list[Unit]:
    """One unit per estimate: each (direction, divergence)'s one-step MLP estimate, then every joint one.

    The fold index of each unit's key is its position in this order (the order the experiment ran its
    estimates in before it was split into units, so the numbers did not change).
    """
    horizons, directions, settings = _grid(quick)
    base = {
        "quick": quick,
        "seed": SEED,
        "samples": _samples(quick),
        "estimator": estimator_dict(estimator_config(quick, full_steps=FULL_STEPS)),
    }
    units, fold = [], 0

    def add(direction, divergence, alpha, steps, adversary, adaptive):
        nonlocal fold
        fold += 1
        config = {**base, "direction": direction, "divergence": divergence, "alpha": alpha,
                  "steps": steps, "adversary": adversary, "adaptive": adaptive, "fold": fold}  # fmt: skip
        uid = _unit_id(direction, divergence, alpha, steps, adversary, adaptive)
        units.append(Unit(id=uid, config=config, kind=adversary))

    for direction in directions:
        for divergence, alpha in settings:
            add(direction, divergence, alpha, 1, "mlp", False)
            for steps in horizons:
                for adversary in ("poly", "mlp"):
                    for adaptive in (True, False):
                        add(direction, divergence, alpha, steps, adversary, adaptive)
    return units


def compute(config: dict) -> dict:
    """One held-out estimate on one T-step release (a unit of :func:`plan`)."""
    from cbdp_jax.estimator import estimate

    poly = config["adversary"] == "poly"
    res = estimate(
        jax.random.fold_in(jax.random.key(config["seed"]), config["fold"]),
        _pair(config["steps"], config["adaptive"], config["direction"]),
        samples=config["samples"],
        adversary=config["adversary"],
        divergence=config["divergence"],
        alpha=config["alpha"],
        config=config_from_dict(config["estimator"]),
        **({"degree": 2} if poly else {"width": 64, "depth": 2}),
    )
    return StoredEstimate.from_result(res).to_dict()


def run(out_dir: str | Path, *, quick: bool = False) -> dict:
    """Runs the adaptive-composition experiment (resumable); writes adaptive_composition.png/.csv/.json.

    Args:
      out_dir: Output folder; units are kept under ``out_dir/.units/adaptive_composition-{quick,full}``.
      quick: T = 2, direction 'remove', KL only, small samples.

    Returns:
      The summary with its ``checks`` and ``finding``.

    """
    return run_experiment(sys.modules[__name__], out_dir, quick=quick)


def finish(out_dir: str | Path, results: dict, *, quick: bool, seconds: float = 0.0) -> dict:
    """Checks, finding, figure and outputs from the units' results (``unit id -> stored estimate``)."""
    plt = pyplot()
    with Timer() as timer:
        rows = _rows(quick, results)
        checks = _checks(rows)
        finding = _finding(rows)
        checks.append(check("finding recorded (reported either way)", True, finding))
        fig = _figure(plt, rows)
    summary = {
        "checks": checks,
        "finding": finding,
        "quick": quick,
        "samples": _samples(quick),
        "config": budget_summary(estimator_config(quick, full_steps=FULL_STEPS)),
        "seconds": seconds + timer.seconds,
    }
    return save_outputs(out_dir, NAME, rows=rows, summary=summary, figure=fig)


def _rows(quick: bool, results: dict) -> list[dict[str, Any]]:
    """Every joint estimate beside the sum of its per-step values, one row each."""
    horizons, directions, settings = _grid(quick)

    def stored(*key) -> StoredEstimate:
        return StoredEstimate.from_dict(results[_unit_id(*key)])

    rows: list[dict[str, Any]] = []
    for direction in directions:
        for divergence, alpha in settings:
            step_poly = _step_exact(divergence, alpha, direction)
            step_mlp = stored(direction, divergence, alpha, 1, "mlp", False)
            for steps in horizons:
                for adversary in ("poly", "mlp"):
                    for adaptive in (True, False):
                        res = stored(direction, divergence, alpha, steps, adversary, adaptive)
                        if adversary == "poly":
                            total, total_se = steps * step_poly, 0.0
                        else:
                            total, total_se = steps * step_mlp.estimate, steps * step_mlp.std_error
                        rows.append(
                            _row(res, direction, adversary, steps, adaptive, total, total_se)
                        )
    return rows


def _row(
    res: Any,
    direction: str,
    adversary: str,
    steps: int,
    adaptive: bool,
    total: float,
    total_se: float,
) -> dict[str, Any]:
    """One joint estimate against the sum of the per-step values, with the excess and its z-score."""
    se = math.hypot(res.std_error, total_se)
    excess = res.estimate - total
    return {
        "direction": direction,
        "divergence": res.divergence,
        "class": "additive poly_2" if adversary == "poly" else "joint MLP 64x2",
        "steps": steps,
        "release": "adaptive" if adaptive else "non-adaptive",
        "joint_estimate": res.estimate,
        "joint_se": res.std_error,
        "joint_lower_bound": res.lower_bound,
        "sum_of_steps": total,
        "sum_se": total_se,
        "sum_kind": "exact" if adversary == "poly" else "estimated",
        "excess": excess,
        "excess_se": se,
        "z": _z(excess, se),
        "warnings": " | ".join(res.warnings),
    }


def _z(excess: float, se: float) -> float | None:
    """The excess in standard errors; None where it has no value (a failed, infinite estimate)."""
    if not (math.isfinite(excess) and math.isfinite(se)):
        return None
    return excess / se if se > 0 else math.copysign(math.inf, excess)


def _checks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The provable case: additive class, KL, 'remove' -> the joint value cannot exceed the sum."""
    return [
        check(
            f"KL, additive poly_2, 'remove', T = {r['steps']}, {r['release']}: the joint estimate "
            "does not exceed the exact sum by more than 3 SE (the bound provably holds here)",
            r["excess"] <= 3 * r["excess_se"],
            f"joint {r['joint_estimate']:.5f} +- {r['joint_se']:.5f} vs sum {r['sum_of_steps']:.5f}",
        )
        for r in rows
        if r["class"].startswith("additive")
        and r["divergence"] == "KL"
        and r["direction"] == "remove"
    ]


def _finding(rows: list[dict[str, Any]]) -> str:
    """How many adaptive cases (and non-adaptive controls) exceed the sum by more than 3 SE."""
    adaptive_exceed = [r for r in rows if r["release"] == "adaptive" and (r["z"] or 0.0) > 3]
    control_exceed = [r for r in rows if r["release"] == "non-adaptive" and (r["z"] or 0.0) > 3]
    return (
        f"{len(adaptive_exceed)} of {sum(r['release'] == 'adaptive' for r in rows)} adaptive cases exceed "
        "the sum of per-step values by more than 3 SE"
        + (
            ": "
            + "; ".join(
                f"{r['direction']} {r['divergence']} {r['class']} T={r['steps']}: excess "
                f"{r['excess']:.4f} +- {r['excess_se']:.4f}"
                for r in adaptive_exceed
            )
            if adaptive_exceed
            else ""
        )
        + f"; non-adaptive controls exceeding: {len(control_exceed)}"
        + (
            " ("
            + "; ".join(
                f"{r['direction']} {r['divergence']} {r['class']} T={r['steps']}"
                for r in control_exceed
            )
            + ")"
            if control_exceed
            else ""
        )
        + _failed(rows)
    )


def _failed(rows: list[dict[str, Any]]) -> str:
    """The rows whose excess has no value (an infinite estimate: the training failed), by name."""
    bad = [r for r in rows if r["z"] is None]
    if not bad:
        return ""
    names = "; ".join(
        f"{r['direction']} {r['divergence']} {r['class']} T={r['steps']} {r['release']}"
        for r in bad
    )
    return f"; {len(bad)} rows without a comparison (an infinite estimate or SE: {names})"


def _figure(plt: Any, rows: list[dict[str, Any]]) -> Any:
    """The excess of each joint estimate over the sum, adaptive in blue, controls in grey."""
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(rows)), 4.2))
    xs = np.arange(len(rows))
    colors = ["C0" if r["release"] == "adaptive" else "C7" for r in rows]
    ax.bar(
        xs,
        [r["excess"] for r in rows],
        yerr=[2 * r["excess_se"] for r in rows],
        color=colors,
        capsize=2,
    )
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_xticks(
        xs,
        [
            f"{r['direction']} {r['divergence']}\n{r['class']}\nT={r['steps']} {r['release'][:5]}"
            for r in rows
        ],
        fontsize=5,
    )
    ax.set_ylabel("joint estimate - sum of per-step values (+- 2 SE)")
    ax.set_title(
        f"Adaptive (blue) vs non-adaptive (grey) composition, subsampled Gaussian q={Q_RATE}, sigma={SIGMA}"
    )
    fig.tight_layout()
    return fig
