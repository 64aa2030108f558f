"""The true divergences that benchmarks/vs_dp_auditorium.py judges soundness against.

Fast (well under a second): quadrature against closed forms, and the mean-v2 lower bound's two
probabilities against draws of the mechanism (a numpy copy of DP-Auditorium's mechanisms/mean.py,
which lives in its own venv and is not importable here).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

from cbdp_jax import analytic

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "vs_dp_auditorium.py"
_SPEC = importlib.util.spec_from_file_location("vs_dp_auditorium", _PATH)
vs = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(vs)


def _gil_closed_form(m1, m2, b1, b2, alpha):
    """D_alpha(Lap(m1, b1) || Lap(m2, b2)), Gil, Alajaji and Linder (2013), Table 2."""
    d = abs(m1 - m2)
    g = alpha * math.exp(-(1 - alpha) * d / b2) / b1 - (1 - alpha) * math.exp(-alpha * d / b1) / b2
    den = alpha**2 * b2**2 - (1 - alpha) ** 2 * b1**2
    return math.log(b2 / b1) + math.log(b1 * b2 * b2 * g / den) / (alpha - 1)


@pytest.mark.parametrize("alpha", [1.5, 1.9, 2.0, 5.0])
def test_mean_v1_quadrature_matches_the_closed_form(alpha):
    # Q || P = Lap(0.5, 0.5) || Lap(0, 1): finite at every alpha; quadrature error ~1e-12.
    got = vs._laplace_scales_renyi(alpha, 0.5, 0.5, 0.0, 1.0)
    assert got == pytest.approx(_gil_closed_form(0.5, 0.0, 0.5, 1.0, alpha), rel=1e-8)
    # P || Q diverges exactly when alpha * 0.5 + (1 - alpha) * 1 <= 0, i.e. alpha >= 2.
    pq = vs._laplace_scales_renyi(alpha, 0.0, 1.0, 0.5, 0.5)
    if alpha >= 2:
        assert pq == math.inf
    else:
        assert pq == pytest.approx(_gil_closed_form(0.0, 0.5, 1.0, 0.5, alpha), rel=1e-8)
    # Negative control: the equal-scale quadrature reproduces the library's Laplace closed form.
    assert vs._laplace_scales_renyi(alpha, 0.0, 1.0, 1.0, 1.0) == pytest.approx(
        analytic.laplace_renyi(alpha, 1.0), rel=1e-8
    )


def _mean_v2(data, n, rng):
    """DP-Auditorium's MeanMechanism, epsilon 1, delta 0, noised count in the noise scale only."""
    count = len(data) + rng.laplace(0.0, 2.0, (n, 1))
    scale = np.maximum(1e-12, 2.0 / count)
    return np.sum(data) / len(data) + rng.laplace(0.0, scale, (n, 1))


def test_mean_v2_lower_bound_rests_on_probabilities_the_mechanism_has():
    rng = np.random.default_rng(0)
    n = 400_000
    p, q = _mean_v2(np.array([0.0]), n, rng), _mean_v2(np.array([0.0, 1.0]), n, rng)
    in_a_p, in_a_q = np.mean(np.abs(p) < 1e-9), np.sum(np.abs(q) < 1e-9)
    # P(A) = exp(-1/2) / 2 = 0.3033; the binomial SE at n = 4e5 is 7.3e-4, so 5 SE is 0.0037.
    assert abs(in_a_p - 0.5 * math.exp(-0.5)) < 0.0037
    # Q(A) <= 7.4e-10: 4e5 draws land in A with probability <= 3e-4; the count must be 0.
    assert in_a_q == 0
    # Negative control: on the true-count mechanism's P = Lap(0, 1) (v1, no clamped scale) the first
    # check fails: A is then a sampling accident of probability 2e-9, not a 0.30 atom.
    in_a_v1 = np.mean(np.abs(rng.laplace(0.0, 1.0, n)) < 1e-9)
    assert abs(in_a_v1 - 0.5 * math.exp(-0.5)) >= 0.0037
    bound = vs.truth("mean-v2", 2.0)
    assert bound["kind"].startswith("lower bound") and 18 < bound["max"] < 19
