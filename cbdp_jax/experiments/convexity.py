"""Theorem 2 (convexity): restricted KL of a coin-flip mixture, and the Renyi non-convexity remark.

A coin-flip mixture M_lambda runs A = Laplace(eps = 2) with probability lambda and B = Gaussian(sigma = 1)
otherwise, both on the pair 0 vs 1. Theorem 2 says D_f^H(M_lambda) <= lambda D_f^H(A) + (1 - lambda)
D_f^H(B) for every f-divergence and class H. Measured for KL over a lambda grid with

* the linear class, where everything is exact: E_Q[exp(a x)] of the mixture is a mixture of the two
  moment generating functions, so (lin, KL)(M_lambda) = sup_{|a| < eps} -a - log(lambda / (1 - a^2 /
  eps^2) + (1 - lambda) exp(sigma^2 a^2 / 2)) is a one-dimensional concave maximisation (DV form,
  E_P x = 0); the estimates' lower bounds are compared with the exact combination;
* a two-hidden-layer ReLU network, where the components' values are themselves estimates: the mixture's
  estimate is compared with the lambda-combination of the components' estimates within two combined
  standard errors, and with the unrestricted KL of the mixture (quadrature) as a ceiling.

Renyi is not an f-divergence and is not convex (paper remark after Thm 2). Measured here: for A' =
Laplace(eps = 1.5) and B' = Gaussian(sigma = 10), lambda = 1/2, alpha = 4, the lower bound of the
network-restricted Renyi of the mixture exceeds lambda R(A') + (1 - lambda) R(B') computed with the
*unrestricted* component values, which bound the restricted ones from above, so the restricted Renyi
divergence of this mixture is certified (up to the CLT) to exceed the convex combination. The linear
class on the same mixture stays convex here (exact values by quadrature are reported).

Every lower bound in the checks is a Bonferroni bound, estimate - z SE with z the 1 - 0.05 / m normal
quantile over the m comparisons (5% family-wise): the network class nearly attains the unrestricted
values it is compared with, so each comparison is a coverage event.
"""

from __future__ import annotations

import math
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
    result_row,
    save_outputs,
)
from cbdp_jax.experiments._units import Unit, run_experiment
from cbdp_jax.statistics import z_quantile

NAME = "convexity"
EPS_A = 2.0  # Laplace component (KL part)
SIGMA_B = 1.0  # Gaussian component (KL part)
RENYI_EPS = 1.5  # Laplace component (Renyi part)
RENYI_SIGMA = 10.0  # Gaussian component (Renyi part)
RENYI_ALPHA = 4.0
RENYI_WEIGHT = 0.5


# ----------------------------------------------------------------------------------------------
# Exact values for mixtures of Laplace(0|1, 1/eps) and N(0|1, sigma^2)
# ----------------------------------------------------------------------------------------------


def mixture_lin_kl(weight: float, eps: float, sigma: float) -> float:
    """(lin, KL) of the pair (w Lap(0, 1/eps) + (1-w) N(0, s^2), same shifted by 1), exactly.

    DV form with E_P x = 0: sup_a -a - log M(a), M(a) = w / (1 - a^2/eps^2) + (1 - w) exp(s^2 a^2 / 2)
    (|a| < eps when w > 0). log M is convex (a mixture of log-convex MGFs), so the objective is concave
    and a ternary search on a in (-eps, 0] finds the maximum.
    """

    def objective(a: float) -> float:
        parts = []
        if weight > 0:
            parts.append(math.log(weight) - math.log1p(-((a / eps) ** 2)))
        if weight < 1:
            parts.append(math.log1p(-weight) + 0.5 * (sigma * a) ** 2)
        return -a - float(np.logaddexp.reduce(parts))

    lo = -eps * (1.0 - 1e-12) if weight > 0 else -50.0 / sigma**2
    hi = 0.0
    for _ in range(200):
        m1, m2 = lo + (hi - lo) / 3.0, hi - (hi - lo) / 3.0
        if objective(m1) < objective(m2):
            lo = m1
        else:
            hi = m2
    return objective(0.5 * (lo + hi))


def _grid(lo: float, hi: float, width: float) -> tuple[np.ndarray, np.ndarray]:
    x, w = np.polynomial.legendre.leggauss(16)
    edges = np.union1d(np.arange(lo, hi + width, width), [0.0, 1.0])  # Laplace kinks as edges
    a, b = edges[:-1, None], edges[1:, None]
    return (0.5 * (b - a) * x + 0.5 * (a + b)).ravel(), (0.5 * (b - a) * w).ravel()


def _mixture_densities(weight: float, eps: float, sigma: float, x: np.ndarray):
    def dens(c):
        lap = 0.5 * eps * np.exp(-eps * np.abs(x - c))
        gau = np.exp(-0.5 * ((x - c) / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))
        return weight * lap + (1 - weight) * gau

    return dens(0.0), dens(1.0)


def mixture_unrestricted(weight, eps, sigma, divergence, alpha=None) -> float:
    """Unrestricted KL or Renyi of the mixture pair by composite Gauss-Legendre quadrature."""
    reach = 60.0 * max(1.0 / eps, sigma)
    x, w = _grid(-reach, 1.0 + reach, 0.1 * min(1.0 / eps, sigma))
    p, q = _mixture_densities(weight, eps, sigma, x)
    ok = (p > 0) & (q > 0)
    x, w, p, q = x[ok], w[ok], p[ok], q[ok]
    if divergence == "kl":
        return float(np.sum(w * p * (np.log(p) - np.log(q))))
    log_int = np.logaddexp.reduce(np.log(w) + alpha * np.log(p) + (1 - alpha) * np.log(q))
    return float(log_int / (alpha - 1))


def mixture_lin_renyi(weight, eps, sigma, alpha) -> float:
    """(lin, Renyi) of the mixture pair: Newton on the concave f-form in (b, a) over quadrature nodes."""
    reach = 60.0 * max(1.0 / eps, sigma)
    x, w = _grid(-reach, 1.0 + reach, 0.1 * min(1.0 / eps, sigma))
    p, q = _mixture_densities(weight, eps, sigma, x)
    scale = max(1.0 / eps, sigma)
    phi = np.stack([np.ones_like(x), (x - 0.5) / scale], axis=1)
    wp, wq = w * p, w * q
    mp = wp @ phi
    big_a = alpha / (alpha - 1)
    c_a = (alpha - 1) ** big_a / alpha
    c0 = 1.0 / (alpha * alpha - alpha)

    def f(theta):
        h = phi @ theta
        ah = np.maximum(np.abs(h), 1e-300)
        val = mp @ theta - wq @ (c_a * ah**big_a + c0)
        grad = mp - (wq * c_a * big_a * ah ** (big_a - 1) * np.sign(h)) @ phi
        hess = (
            -(phi.T * (wq * c_a * big_a * (big_a - 1) * np.maximum(ah, 1e-8) ** (big_a - 2))) @ phi
        )
        return val, grad, hess

    theta = np.array([0.0, -0.1])
    val, grad, hess = f(theta)
    for _ in range(200):
        step = -np.linalg.solve(hess - 1e-12 * np.eye(2), grad)
        if grad @ step <= 0:
            step = grad
        t = 1.0
        while t > 1e-12:
            v2, g2, h2 = f(theta + t * step)
            if v2 >= val + 1e-4 * t * (grad @ step):
                break
            t *= 0.5
        if t <= 1e-12:
            break
        theta, val, grad, hess = theta + t * step, v2, g2, h2
        if np.max(np.abs(grad)) < 1e-12:
            break
    return math.log1p(alpha * (alpha - 1) * val) / (alpha - 1)


SEED = 2019_02
FULL_STEPS = 3000
NET_WIDTH, NET_DEPTH = 32, 2


def _lambdas(quick: bool) -> tuple[float, ...]:
    if quick:
        return (0.0, 0.25, 0.5, 0.75, 1.0)
    return tuple(float(v) for v in np.round(np.linspace(0.0, 1.0, 11), 2))


def _samples(quick: bool) -> int:
    return 20_000 if quick else 200_000


def _unit_id(cls: str, lam: float) -> str:
    return f"KL|{cls}|lambda={lam:g}"


RENYI_UNIT = f"Renyi(alpha={RENYI_ALPHA:g})|network|lambda={RENYI_WEIGHT:g}"


def _n_compare(quick: bool) -> int:
    """Simultaneous comparisons of a lower bound with an exact value (each estimate's family)."""
    return 2 * len(_lambdas(quick)) + 2


def plan(quick: bool) -> list[Unit]:
    """One unit per estimate: linear class at each inner lambda, network at each lambda, the Renyi case.

    Args:
      quick: The quick grid (5 lambdas, small samples, few steps).

    Returns:
      The units, in the order the experiment ran them before it was split into units.

    """
    budget = estimator_dict(
        estimator_config(quick, full_steps=FULL_STEPS, family_size=_n_compare(quick))
    )
    samples = _samples(quick)
    base = {"quick": quick, "estimator": budget, "seed": SEED, "net": [NET_WIDTH, NET_DEPTH]}
    units = []
    for i, lam in enumerate(_lambdas(quick)):
        common = {**base, "divergence": "kl", "alpha": None, "weight": lam, "samples": samples}
        if 0.0 < lam < 1.0:
            config = {**common, "class": "linear", "fold": 100 + i}
            units.append(Unit(id=_unit_id("linear", lam), config=config, kind="linear"))
        config = {**common, "class": "network", "fold": 200 + i}
        units.append(Unit(id=_unit_id("network", lam), config=config, kind="network"))
    config = {
        **base,
        "divergence": "renyi",
        "alpha": RENYI_ALPHA,
        "weight": RENYI_WEIGHT,
        # the one claim that needs a violation beyond the margin
        "samples": max(samples, 40_000),
        "class": "network",
        "fold": 300,
    }
    units.append(Unit(id=RENYI_UNIT, config=config, kind="renyi_network"))
    return units


def _mechanism(divergence: str, weight: float):
    from cbdp_jax.mechanisms import GaussianMechanism, LaplaceMechanism, Mixture

    if divergence == "kl":
        first, second = LaplaceMechanism(epsilon=EPS_A), GaussianMechanism(sigma=SIGMA_B)
    else:
        first, second = LaplaceMechanism(epsilon=RENYI_EPS), GaussianMechanism(sigma=RENYI_SIGMA)
    if weight == 1.0:
        return first
    if weight == 0.0:
        return second
    return Mixture(first=first, second=second, weight=float(weight))


def compute(config: dict) -> dict:
    """One estimate of the mixture's restricted divergence (a unit of :func:`plan`)."""
    from cbdp_jax.adversaries import make_adversary
    from cbdp_jax.estimator import estimate

    if config["class"] == "linear":
        adversary = "linear"
    else:
        adversary = make_adversary("mlp", width=config["net"][0], depth=config["net"][1])
    res = estimate(
        jax.random.fold_in(jax.random.key(config["seed"]), config["fold"]),
        _mechanism(config["divergence"], config["weight"]),
        samples=config["samples"],
        adversary=adversary,
        divergence=config["divergence"],
        alpha=config["alpha"],
        config=config_from_dict(config["estimator"]),
    )
    return StoredEstimate.from_result(res).to_dict()


def run(out_dir: str | Path, *, quick: bool = False) -> dict:
    """Runs the convexity experiment (resumable per unit); writes convexity.png / .csv / .json.

    Args:
      out_dir: Output folder; finished units are kept under ``out_dir/.units/convexity-{quick,full}``.
      quick: A 5-point lambda grid, small samples and few steps (about a minute on 2 CPU cores).

    Returns:
      The summary with its ``checks``.

    """
    return run_experiment(sys.modules[__name__], out_dir, quick=quick)


def finish(out_dir: str | Path, results: dict, *, quick: bool, seconds: float = 0.0) -> dict:
    """Checks, figure and outputs from the units' results (``unit id -> stored estimate``)."""
    plt = pyplot()

    from cbdp_jax.adversaries import make_adversary

    config = estimator_config(quick, full_steps=FULL_STEPS)
    lambdas = _lambdas(quick)
    samples = _samples(quick)
    z = z_quantile(config.confidence)
    # Lower bounds are compared with exact values that the network class nearly attains, so each
    # comparison is a coverage event: checks use a Bonferroni lower bound, 5% family-wise. Every
    # estimate's lower bound is one of _n_compare(quick) simultaneous bounds (Bonferroni, taken by the
    # estimator on the f-scale and then mapped, see plan): a refused bound is the trivial 0.
    net = make_adversary("mlp", width=NET_WIDTH, depth=NET_DEPTH)
    rows: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []

    with Timer() as timer:
        exact_kl, exact_check = _exact_kl()
        checks.append(exact_check)
        lin_res, net_res = _kl_estimates(lambdas, results, exact_kl, rows, checks)
        checks += _network_checks(lambdas, net_res, net.label)
        renyi = _renyi(StoredEstimate.from_dict(results[RENYI_UNIT]), rows, checks)

    fig = _figure(plt, exact_kl, lin_res, net_res, renyi, net.label, z)
    summary = {
        "checks": checks,
        "quick": quick,
        "lambdas": list(lambdas),
        "samples": samples,
        "config": budget_summary(config),
        "seconds": seconds + timer.seconds,
    }
    return save_outputs(out_dir, NAME, rows=rows, summary=summary, figure=fig)


def _exact_kl() -> tuple[dict[str, Any], dict[str, Any]]:
    """Thm 2 on exact values: (lin, KL) of the mixture over a dense lambda grid, and its check."""
    from cbdp_jax import analytic

    ex_a = analytic.laplace_lin_kl(EPS_A)
    ex_b = analytic.gaussian_lin_kl(SIGMA_B)
    dense = np.linspace(0.0, 1.0, 101)
    ex_curve = np.array([mixture_lin_kl(float(lam), EPS_A, SIGMA_B) for lam in dense])
    comb_curve = dense * ex_a + (1 - dense) * ex_b
    worst = float(np.max(ex_curve - comb_curve))
    curves = {"a": ex_a, "b": ex_b, "dense": dense, "mixture": ex_curve, "combination": comb_curve}
    return curves, check(
        "Thm 2 (exact, linear class): (lin, KL) of the mixture <= lambda-combination of the "
        "components' exact values on a 101-point lambda grid",
        worst <= 1e-9,
        f"max over lambda of exact(mixture) - combination = {worst:.3g}; components "
        f"{ex_a:.6f} (Laplace eps={EPS_A:g}), {ex_b:.6f} (Gaussian sigma={SIGMA_B:g}); "
        f"exact mixture at lambda=0.5: {mixture_lin_kl(0.5, EPS_A, SIGMA_B):.6f}",
    )


def _kl_estimates(
    lambdas: tuple[float, ...],
    results: dict,
    exact_kl: dict[str, Any],
    rows: list[dict[str, Any]],
    checks: list[dict[str, Any]],
) -> tuple[dict[float, Any], dict[float, Any]]:
    """The KL estimates at each lambda (rows and checks appended): linear and network class."""
    lin_res: dict[float, Any] = {}
    net_res: dict[float, Any] = {}
    for lam in lambdas:
        exact_mix = mixture_lin_kl(float(lam), EPS_A, SIGMA_B)
        kl_mix = mixture_unrestricted(float(lam), EPS_A, SIGMA_B, "kl")
        comb = lam * exact_kl["a"] + (1 - lam) * exact_kl["b"]
        if 0.0 < lam < 1.0:
            res = StoredEstimate.from_dict(results[_unit_id("linear", lam)])
            lin_res[lam] = res
            rows.append(
                result_row(
                    res,
                    part="KL, linear class",
                    weight=lam,
                    exact_mixture=exact_mix,
                    combination_exact=comb,
                    kl_unrestricted=kl_mix,
                )
            )
            checks.append(
                check(
                    f"Thm 2, linear class, lambda={lam:g}: family-wise lower bound of the "
                    "mixture <= lambda-combination of the exact component values",
                    res.lower_bound <= comb,
                    f"lower bound {res.lower_bound:.4f} (estimate {res.estimate:.4f} +- "
                    f"{res.std_error:.4f}; exact mixture {exact_mix:.4f}) <= combination "
                    f"{comb:.4f}",
                )
            )
        res = StoredEstimate.from_dict(results[_unit_id("network", lam)])
        net_res[lam] = res
        rows.append(
            result_row(
                res,
                part="KL, network class",
                weight=lam,
                exact_mixture=None,
                combination_exact=None,
                kl_unrestricted=kl_mix,
            )
        )
        checks.append(
            check(
                f"network class, lambda={lam:g}: family-wise lower bound <= unrestricted KL of "
                "the mixture",
                res.lower_bound <= kl_mix,
                f"{res.lower_bound:.4f} <= {kl_mix:.4f}",
            )
        )
    return lin_res, net_res


def _network_checks(
    lambdas: tuple[float, ...], net_res: dict[float, Any], net_label: str
) -> list[dict[str, Any]]:
    """Thm 2 for the network class: the mixture's estimate against the components' combination."""
    ra, rb = net_res[1.0], net_res[0.0]
    checks = []
    for lam in lambdas:
        if not 0.0 < lam < 1.0:
            continue
        rm = net_res[lam]
        comb = lam * ra.estimate + (1 - lam) * rb.estimate
        se = math.sqrt(
            rm.std_error**2 + (lam * ra.std_error) ** 2 + ((1 - lam) * rb.std_error) ** 2
        )
        checks.append(
            check(
                f"Thm 2, network class {net_label}, lambda={lam:g}: estimated KL of the mixture "
                "<= lambda-combination of the components' estimates within 2 combined SE",
                rm.estimate <= comb + 2.0 * se,
                f"mixture {rm.estimate:.4f} +- {rm.std_error:.4f} vs combination {comb:.4f} "
                f"(+ 2 SE = {comb + 2 * se:.4f})",
            )
        )
    return checks


def _renyi(
    res_r: StoredEstimate, rows: list[dict[str, Any]], checks: list[dict[str, Any]]
) -> dict[str, Any]:
    """Renyi is not convex: the network estimate against the unrestricted combination (row, checks)."""
    from cbdp_jax import analytic

    r_a = analytic.laplace_renyi(RENYI_ALPHA, RENYI_EPS)
    r_b = analytic.gaussian_renyi(RENYI_ALPHA, RENYI_SIGMA)
    lam = RENYI_WEIGHT
    r_comb = lam * r_a + (1 - lam) * r_b
    r_mix = mixture_unrestricted(lam, RENYI_EPS, RENYI_SIGMA, "renyi", RENYI_ALPHA)
    lin_a = mixture_lin_renyi(1.0, RENYI_EPS, RENYI_SIGMA, RENYI_ALPHA)
    lin_b = mixture_lin_renyi(0.0, RENYI_EPS, RENYI_SIGMA, RENYI_ALPHA)
    lin_mix = mixture_lin_renyi(lam, RENYI_EPS, RENYI_SIGMA, RENYI_ALPHA)
    lin_comb = lam * lin_a + (1 - lam) * lin_b
    rows.append(
        result_row(
            res_r,
            part=f"Renyi alpha={RENYI_ALPHA:g}, network class (non-convexity)",
            weight=lam,
            combination_unrestricted=r_comb,
            renyi_unrestricted_mixture=r_mix,
            lin_renyi_exact_mixture=lin_mix,
            lin_renyi_exact_combination=lin_comb,
        )
    )
    lb = res_r.lower_bound
    checks.append(
        check(
            f"Renyi non-convexity measured: family-wise lower bound of the network-restricted Renyi "
            f"(alpha={RENYI_ALPHA:g}) of the mixture EXCEEDS lambda R(A) + (1-lambda) R(B) with "
            "unrestricted (hence larger) component values",
            lb > r_comb,
            f"Laplace eps={RENYI_EPS:g} / Gaussian sigma={RENYI_SIGMA:g}, lambda={lam:g}: lower "
            f"bound {lb:.4f} (estimate {res_r.estimate:.4f} +- "
            f"{res_r.std_error:.4f}) > combination {r_comb:.4f} (R(A) = {r_a:.4f}, R(B) = "
            f"{r_b:.4f}); unrestricted Renyi of the mixture {r_mix:.4f}. Linear class, exact: "
            f"mixture {lin_mix:.4f} vs combination {lin_comb:.4f} (convex here)",
        )
    )
    checks.append(
        check(
            "Renyi part: family-wise lower bound <= unrestricted Renyi of the mixture (quadrature)",
            lb <= r_mix,
            f"{lb:.4f} <= {r_mix:.4f}",
        )
    )
    return {"res": res_r, "combination": r_comb, "mixture": r_mix}


def _figure(
    plt: Any,
    exact_kl: dict[str, Any],
    lin_res: dict[float, Any],
    net_res: dict[float, Any],
    renyi: dict[str, Any],
    net_label: str,
    z: float,
) -> Any:
    """Left: restricted KL of the mixture over lambda. Right: the Renyi non-convexity bars."""
    dense = exact_kl["dense"]
    ra, rb = net_res[1.0], net_res[0.0]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11.5, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    ax1.plot(dense, exact_kl["mixture"], "C0-", label="(lin, KL) exact, mixture")
    ax1.plot(dense, exact_kl["combination"], "C0:", label="(lin, KL) exact, combination")
    lam_l = sorted(lin_res)
    ax1.errorbar(lam_l, [lin_res[v].estimate for v in lam_l],
                 yerr=[z * lin_res[v].std_error for v in lam_l], fmt="o", color="C0", capsize=3,
                 label="(lin, KL) estimate")  # fmt: skip
    lam_n = sorted(net_res)
    ax1.errorbar(lam_n, [net_res[v].estimate for v in lam_n],
                 yerr=[z * net_res[v].std_error for v in lam_n], fmt="s", color="C1", capsize=3,
                 label=f"({net_label}, KL) estimate")  # fmt: skip
    ax1.plot([0, 1], [rb.estimate, ra.estimate], "C1:", label="network: combination of estimates")
    ax1.plot(dense, [mixture_unrestricted(float(v), EPS_A, SIGMA_B, "kl") for v in dense], "k--",
             lw=1, label="unrestricted KL, mixture")  # fmt: skip
    ax1.set_xlabel(f"lambda (weight of Laplace eps={EPS_A:g}; else Gaussian sigma={SIGMA_B:g})")
    ax1.set_ylabel("KL")
    ax1.set_title("Thm 2: restricted KL of a coin-flip mixture")
    ax1.legend(fontsize=7)
    labels = ["mixture\n(network est.)", "lambda-comb.\n(unrestricted)", "mixture\n(unrestricted)"]
    res_r = renyi["res"]
    ax2.bar([0], [res_r.estimate], yerr=[z * res_r.std_error], capsize=4, color="C1")
    ax2.bar([1], [renyi["combination"]], color="0.6")
    ax2.bar([2], [renyi["mixture"]], color="0.3")
    ax2.set_xticks([0, 1, 2], labels, fontsize=8)
    ax2.set_title(f"Renyi (alpha={RENYI_ALPHA:g}) is not convex", fontsize=10)
    fig.tight_layout()
    return fig
