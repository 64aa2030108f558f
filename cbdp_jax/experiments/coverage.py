"""Coverage of the estimator's one-sided 95% lower bound over repeated runs.

For the linear class the exact restricted value is known (quadrature + concave solver), so the fraction
of independent runs (different keys: different samples, initialisations and minibatches) whose 95% lower
bound lies below the exact value estimates the bound's coverage. A held-out estimate targets
objective(h_trained) <= D^H, so coverage at or above the nominal 95% is expected; the issue requires at
least 90% over at least 50 runs.
"""

from __future__ import annotations

import math
from pathlib import Path

import jax
import numpy as np

from cbdp_jax.experiments._common import (
    Timer,
    check,
    pyplot,
    save_outputs,
)

CASES = (("laplace", "kl", None), ("laplace", "renyi", 4.0), ("gaussian", "renyi", 4.0))


def run(out_dir: str | Path, *, quick: bool = False) -> dict:
    """Runs the coverage study; returns the summary with its checks."""
    plt = pyplot()

    from cbdp_jax import exact
    from cbdp_jax.estimator import EstimatorConfig, estimate
    from cbdp_jax.mechanisms import GaussianMechanism, LaplaceMechanism

    runs = 20 if quick else 60
    samples = 10_000 if quick else 20_000
    cases = CASES[:1] if quick else CASES
    config = EstimatorConfig(steps=300, eval_every=50, ensemble=2, batch_size=1024)
    rows, checks = [], []
    fig, axes = plt.subplots(1, len(cases), figsize=(5 * len(cases), 3.6), squeeze=False)
    with Timer() as timer:
        for c, (mech, div, alpha) in enumerate(cases):
            pair = exact.laplace_pair(1.0) if mech == "laplace" else exact.gaussian_pair(1.0)
            truth = float(exact.restricted_divergence(pair, div, "linear", alpha=alpha).value)
            m = LaplaceMechanism(epsilon=1.0) if mech == "laplace" else GaussianMechanism(sigma=1.0)
            keys = jax.random.split(jax.random.key(1234 + c), runs)
            ests, lbs = [], []
            for i in range(runs):
                res = estimate(
                    keys[i],
                    m,
                    samples=samples,
                    adversary="linear",
                    divergence=div,
                    alpha=alpha,
                    config=config,
                )
                ests.append(res.estimate)
                lbs.append(res.lower_bound)
                rows.append(
                    {
                        "mechanism": mech,
                        "divergence": res.divergence,
                        "run": i,
                        "estimate": res.estimate,
                        "lower_bound": res.lower_bound,
                        "std_error": res.std_error,
                        "exact": truth,
                        "covered": res.lower_bound <= truth,
                    }
                )
            lbs_a, ests_a = np.array(lbs), np.array(ests)
            rate = float(np.mean(lbs_a <= truth))
            # binomial standard error of the coverage rate, for the detail string
            se = math.sqrt(max(rate * (1 - rate), 1e-12) / runs)
            label = f"{mech} {rows[-1]['divergence']} (lin)"
            checks.append(
                check(
                    f"{label}: 95% lower bound below the exact value in >= 90% of {runs} runs",
                    rate >= 0.90,
                    f"coverage {rate:.1%} +- {se:.1%}; exact {truth:.6f}; mean estimate "
                    f"{ests_a.mean():.6f} (sd {ests_a.std(ddof=1):.4f})",
                )
            )
            ax = axes[0, c]
            order = np.argsort(lbs_a)
            ax.plot(ests_a[order], "o", ms=3, label="estimate")
            ax.plot(lbs_a[order], "v", ms=3, label="95% lower bound")
            ax.axhline(truth, color="k", lw=1, label="exact (lin)")
            ax.set_title(f"{label}: coverage {rate:.0%}")
            ax.set_xlabel("run (sorted by bound)")
            ax.legend(fontsize=7)
    summary = {"checks": checks, "runs": runs, "samples": samples, "seconds": timer.seconds}
    return save_outputs(out_dir, "coverage", rows=rows, summary=summary, figure=fig)
