"""One-run eps lower bound from the canaries' continuous scores, under a Gaussian model of the scores.

The guess-based bounds of :mod:`cbdp_jax._src.mechanism_auditor.one_run` reduce each score to "in", "out" or abstain.
When the scores are continuous and their law is known up to a few parameters, the scores say more:
this module fits that law and turns a lower confidence bound on its separation into eps at delta.

The argument, in three steps (docs/theory/one_run.md, section 3b):

1. The per-canary marginal pair. Canary i's score has law Q_in^i given S_i = +1 and Q_out^i given
   S_i = -1, the other canaries' inclusion S_{-i} random. Each is the same mixture over S_{-i} of the
   outputs of neighbouring data sets (post-processed by the score), so by the joint convexity of the
   hockey-stick divergence (equivalently: type I and II errors of a test average over the mixture and
   the trade-off curve is convex) the pair (Q_in^i, Q_out^i) is at least as private as the mechanism
   with respect to one canary: delta_pair(eps) <= delta_M(eps) for every eps. The pooled pair (the
   average over canaries) is a mixture of such pairs, hence also.
2. The Gaussian model (the ASSUMPTION): the in-scores are independent draws of N(a, s_in^2) and the
   out-scores of N(b, s_out^2). Then, with theta = (a - b) / max(s_in, s_out), the threshold test on
   the score alone already gives delta_pair(eps) >= delta_{G_theta}(eps) for every eps >= 0 (equality
   when s_in = s_out), so eps_M(delta) >= eps_{G_theta}(delta): a valid (eps, delta) lower bound, not
   only a GDP statement, because the Gaussian shape is assumed of the scores, not of the mechanism.
3. A one-sided lower confidence bound on theta: theta = min(theta_in, theta_out) with
   theta_k = (a - b) / s_k, and min(L_in, L_out) <= theta fails only if the L_k of the smaller theta_k
   fails, so each L_k at level 1 - beta suffices (no union correction). L_k is the delta-method bound
   theta_hat_k - z_{1-beta} se_k with se_k^2 = (s_in^2 / n_in + s_out^2 / n_out) / s_k^2 +
   theta_hat_k^2 / (2 (n_k - 1)) (sample mean and variance are independent under normality).
   Asymptotic: its coverage is checked by simulation (benchmarks/one_run_gaussian_scores.py).

Scores the model cannot describe are refused (:class:`InvalidParameterError`): fewer than
``MIN_DISTINCT`` distinct values in a group (binary or few-level scores, e.g. randomized response,
whose privacy curve is nothing like a Gaussian one), fewer than ``MIN_GROUP`` scores in a group, or a
D'Agostino-Pearson normality test rejecting at ``normality_level`` on either group or on the two
groups' standardized scores pooled (heavy tails such as Laplace noise: their privacy loss is bounded,
so a Gaussian fit would over-claim). Under the model the test's statistics (functions of the
standardized scores) are independent of the groups' means and standard deviations (Basu's theorem),
so passing the check does not bias the bound. The check sees the bulk of the scores; the eps at small
delta lives in tails no test on m scores can see, so the bound rests on the assumption there:
Student-t scores with 30 degrees of freedom pass it and are over-claimed (docs/theory/one_run.md).

References:
  Agrawal, Wei, Singh, Magdon-Ismail, Zikas 2026, "Let's Ask Gauss: improved one-run privacy
  auditing" (arXiv:2606.12733): canary-aligned signals of white-box DP-SGD are asymptotically
  Gaussian. Dong, Roth, Su 2022, "Gaussian differential privacy" (G_mu, Corollary 2.13).
  D'Agostino, Pearson 1973, "Tests for departure from normality" (Biometrika 60).

"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy import special, stats

from cbdp_jax._src.infra.validation import InvalidParameterError, check_in_range

MIN_DISTINCT = 20  # fewer distinct scores in a group: not a continuous score (binary, few levels)
MIN_GROUP = 20  # the normality test's skewness and kurtosis parts need about this many


class GaussianScoresFit(NamedTuple):
    """The Gaussian fit of the in- and out-scores and its lower confidence bound.

    Attributes:
      mu_lower: theta's one-sided lower confidence bound at ``level`` (0 when it is negative).
      mu_estimate: The point estimate (mean_in - mean_out) / max(sd_in, sd_out).
      mean_in: Mean of the included canaries' scores.
      mean_out: Mean of the excluded canaries' scores.
      sd_in: Their standard deviation (ddof 1).
      sd_out: Likewise for the excluded canaries.
      n_in: Included canaries.
      n_out: Excluded canaries.
      normality_p_in: D'Agostino-Pearson p-value of the in-scores.
      normality_p_out: Likewise for the out-scores.
      normality_p_pooled: Likewise for both groups' standardized scores together.
      level: 1 - beta.

    """

    mu_lower: float
    mu_estimate: float
    mean_in: float
    mean_out: float
    sd_in: float
    sd_out: float
    n_in: int
    n_out: int
    normality_p_in: float
    normality_p_out: float
    normality_p_pooled: float
    level: float


def normality_p_value(x: np.ndarray) -> float:
    """D'Agostino-Pearson omnibus p-value (skewness and kurtosis) of one group's scores."""
    return float(stats.normaltest(np.asarray(x, np.float64)).pvalue)


_HINT = "use method='fdp' or 'steinke', which hold for any scores"


def check_scores(scores, included) -> tuple[np.ndarray, np.ndarray]:
    """``(scores, included)`` as float64 and bool ``[m]`` arrays, or an error naming the bad one."""
    s = np.asarray(scores, np.float64)
    if s.ndim != 1 or s.size < 1 or not np.all(np.isfinite(s)):
        raise InvalidParameterError(
            f"scores of shape {s.shape} is invalid: must be a 1-D array of m >= 1 finite numbers"
        )
    inc = np.asarray(included)
    if inc.shape != s.shape or not np.all((inc == 0) | (inc == 1)):
        raise InvalidParameterError(
            f"included of shape {inc.shape} is invalid: must be [m] = {s.shape} of 0/1 or booleans"
        )
    return s, inc.astype(bool)


def _check_group(name: str, x: np.ndarray) -> None:
    """Refuses a group too small or too discrete for the Gaussian model."""
    if x.size < MIN_GROUP:
        raise InvalidParameterError(
            f"scores has {x.size} {name}-canaries: method='gaussian-scores' needs at least "
            f"{MIN_GROUP} in each group ({_HINT})"
        )
    distinct = np.unique(x).size
    if distinct < MIN_DISTINCT:
        raise InvalidParameterError(
            f"scores takes {distinct} distinct values among the {name}-canaries: "
            f"method='gaussian-scores' needs continuous scores (at least {MIN_DISTINCT} distinct "
            f"values per group); binary or few-level scores such as randomized response are not "
            f"Gaussian ({_HINT})"
        )


def _check_normal(name: str, x: np.ndarray, normality_level: float) -> float:
    """Refuses scores whose normality p-value is below ``normality_level``; returns the p-value."""
    p = normality_p_value(x)
    if p < normality_level:
        raise InvalidParameterError(
            f"scores of the {name} fail the normality check (D'Agostino-Pearson p = {p:.3g} < "
            f"normality_level = {normality_level:g}): method='gaussian-scores' assumes Gaussian "
            f"scores, and heavy tails (e.g. Laplace noise) would make its bound over-claim ({_HINT})"
        )
    return p


def theta_lower_bound(
    mean_in: float, mean_out: float, sd_in: float, sd_out: float, n_in: int, n_out: int,
    level: float,
) -> tuple[float, float]:  # fmt: skip
    """``(lower, estimate)`` of theta = (a - b) / max(s_in, s_out) from the groups' moments.

    lower = max(0, min_k L_k), L_k = theta_hat_k - z_level se_k (module docstring, step 3).
    """
    diff = mean_in - mean_out
    var_diff = sd_in**2 / n_in + sd_out**2 / n_out
    z = float(special.ndtri(level))
    bounds = []
    for sd, n in ((sd_in, n_in), (sd_out, n_out)):
        theta = diff / sd
        se = np.sqrt(var_diff / sd**2 + theta**2 / (2.0 * (n - 1)))
        bounds.append(theta - z * se)
    return max(0.0, float(min(bounds))), float(diff / max(sd_in, sd_out))


def gaussian_scores_fit(
    scores, included, *, level: float = 0.95, normality_level: float = 1e-3
) -> GaussianScoresFit:
    """Fits the Gaussian model to the in- and out-scores and bounds theta from below (module docstring).

    Args:
      scores: ``[m]`` finite scores, higher meaning "more likely included" (the bound is one-sided:
        in-scores below out-scores give 0).
      included: ``[m]`` booleans, canary i in the run.
      level: 1 - beta of the one-sided bound, in (0, 1).
      normality_level: Each D'Agostino-Pearson p-value (in-scores, out-scores, both standardized
        and pooled) must be at least this, in (0, 1). Under the model the three tests refuse a
        few times ``normality_level`` of the runs (the test's p-value is a little liberal that far
        in its tail); benchmarks/measured/one-run/gaussian_scores.json counts the refusals.

    Returns:
      A :class:`GaussianScoresFit`.

    Raises:
      InvalidParameterError: Naming the parameter (scores, included, level, normality_level) and
        its allowed range; naming ``scores`` when a group has fewer than ``MIN_GROUP`` scores or
        ``MIN_DISTINCT`` distinct values, or fails the normality check.

    """
    s, inc = check_scores(scores, included)
    check_in_range("level", level, 0.0, 1.0, low_open=True, high_open=True)
    check_in_range("normality_level", normality_level, 0.0, 1.0, low_open=True, high_open=True)
    x_in, x_out = s[inc], s[~inc]
    _check_group("in", x_in)
    _check_group("out", x_out)
    sd_in, sd_out = float(x_in.std(ddof=1)), float(x_out.std(ddof=1))
    pooled = np.concatenate([(x_in - x_in.mean()) / sd_in, (x_out - x_out.mean()) / sd_out])
    p_in = _check_normal("in-canaries", x_in, normality_level)
    p_out = _check_normal("out-canaries", x_out, normality_level)
    p_pooled = _check_normal("two groups, standardized and pooled,", pooled, normality_level)
    lower, estimate = theta_lower_bound(
        float(x_in.mean()), float(x_out.mean()), sd_in, sd_out, x_in.size, x_out.size, level
    )
    return GaussianScoresFit(
        lower, estimate, float(x_in.mean()), float(x_out.mean()), sd_in, sd_out, int(x_in.size),
        int(x_out.size), p_in, p_out, p_pooled, float(level),
    )  # fmt: skip
