"""One-run auditing: epsilon lower bounds from the scores of canaries included at random in ONE run.

The setting (Steinke, Nasr, Jagielski 2023). Each of m canaries is included in the training set
independently with probability 1/2 (S_i = +1 in, -1 out). After the single run the auditor scores every
canary (higher = more likely in), guesses "in" for the ``k_plus`` highest scores and "out" for the
``k_minus`` lowest, abstains on the rest, and counts the correct guesses C among the r = k_plus +
k_minus it made. A mechanism that is private with respect to each canary cannot make C large; the
bounds below turn an observed C into the largest privacy parameter that C refutes at level 1 - beta.

* ``'steinke'`` -- if M is (eps, delta)-DP then for every v (Steinke et al. 2023, main theorem)

      P[C >= v] <= B(v) + 2 m delta max_{1 <= i <= v} (B(v - i) - B(v)) / i,
      B(v) = P[Binomial(r, e^eps / (1 + e^eps)) >= v];

  with delta = 0 this is the statement that C is stochastically dominated by the binomial.
* ``'fdp'`` -- the f-DP analysis of Mahloujifar, Melis, Chaudhuri 2024 with the trade-off curve of
  (eps, delta)-DP, f(a) = max(0, 1 - delta - e^eps a, e^-eps (1 - delta - a)): refutes the same
  (eps, delta) claims, usually more sharply (:func:`fdp_refutes` states the test).
* ``'gdp'`` -- the same analysis with the Gaussian curve G_mu: refutes mu-GDP for every mu below
  ``gdp_mu``. Refuting mu-GDP says nothing about one (eps, delta) unless the mechanism's privacy curve
  is exactly Gaussian, so ``epsilon`` is the ``'fdp'`` bound on the same guesses and family (valid
  for every mechanism) and mu's eps at delta, the number jax_privacy reports as its f-DP one-run
  epsilon, goes to ``epsilon_gaussian_curve``: an (eps, delta) bound only for an exactly Gaussian
  curve (on randomized response eps = 1 it exceeds 1 in nearly every run).
* ``'gaussian-scores'`` -- no guesses: the continuous scores, modelled as Gaussian given in or out
  (:mod:`cbdp_jax._src.mechanism_auditor.one_run_scores`), give a lower confidence bound ``gdp_mu`` on the separation
  of the per-canary score pair and ``epsilon`` = its eps at delta, an (eps, delta) lower bound under
  that model (asymptotic). Binary, few-level and non-normal scores are refused.

Each bound holds for a FIXED number of guesses. :func:`one_run_audit` tries a fixed family of K
(k_plus, k_minus) choices chosen before looking at the scores (:func:`guess_candidates`) and tests
choice j at beta w_j, with weights w_j >= 0 summing to 1 that are also fixed in advance: a weighted
union (Bonferroni) bound, so the maximum over the family holds at level 1 - beta. The default weights
(:func:`family_weights`) give half of beta to guessing on every canary, the choice that uses all m of
them and the best one whenever the scores take few values (a binary score has nothing else to offer),
and split the other half equally among the smaller guess counts, which win on scores with a long tail.

The ``'steinke'``, ``'fdp'`` and ``'gdp'`` bounds are finite-sample and hold for any mechanism with
the stated privacy (and with both of ``'gdp'``'s statements at once: per choice both tests reject on
an upper set of the same count, so a false rejection of either is the event of one of them).

References:
  Steinke, Nasr, Jagielski 2023, "Privacy auditing with one (1) training run", NeurIPS 2023
  (arXiv:2305.08846), main theorem (Theorem 3.1) and its p-value routine. Mahloujifar, Melis,
  Chaudhuri 2024, "Auditing f-differential privacy in one run" (arXiv:2410.22235; ICML 2025), the
  bound on correct guesses of an f-DP mechanism and its recursive audit. Dong, Roth, Su 2022,
  "Gaussian differential privacy" (G_mu, Corollary 2.13).

"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
from scipy import special, stats

from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    check_choice,
    check_in_range,
    check_int_at_least,
)
from cbdp_jax._src.mechanism_auditor.epsilon import gdp_delta
from cbdp_jax._src.mechanism_auditor.one_run_scores import check_scores, gaussian_scores_fit

METHODS = ("steinke", "fdp", "gdp", "gaussian-scores")
_GUARANTEE = {
    "steinke": "finite-sample, any (eps, delta)-DP mechanism (Steinke et al. 2023)",
    "fdp": "finite-sample, any (eps, delta)-DP mechanism (Mahloujifar et al. 2024, f = f_eps,delta)",
    "gdp": (
        "finite-sample: epsilon as 'fdp' (any (eps, delta)-DP mechanism), and every mu-GDP claim "
        "with mu < gdp_mu refuted (f = G_mu); epsilon_gaussian_curve (mu's eps at delta) is an "
        "(eps, delta) bound only if the mechanism's privacy curve is exactly Gaussian"
    ),
    "gaussian-scores": (
        "asymptotic (delta method), under the ASSUMPTION that each group's scores are independent "
        "Gaussian draws (in: N(a, s_in^2), out: N(b, s_out^2)); then eps >= epsilon at delta for "
        "the mechanism, whatever its own privacy curve; the normality check sees the bulk of the "
        "scores, not the tails that epsilon extrapolates to"
    ),
}


class OneRunBound(NamedTuple):
    """An epsilon lower bound from one run.

    Attributes:
      epsilon: Every eps below this is refuted at (eps, ``delta``) with probability >= ``level``
        (0 when nothing is refuted); for ``'gaussian-scores'`` under its Gaussian model of the
        scores (``guarantee``).
      method: One of ``METHODS``.
      k_plus: "In" guesses (highest scores) of the choice that gave ``epsilon`` (0 for
        ``'gaussian-scores'``, which makes no guesses).
      k_minus: "Out" guesses (lowest scores) of that choice.
      correct: Correct guesses of that choice.
      canaries: m, the number of canaries.
      level: 1 - beta, the family-wise level.
      delta: The delta of the refuted claims.
      family_size: K, the number of (k_plus, k_minus) choices tried (0 for ``'gaussian-scores'``).
      gdp_mu: For ``'gdp'`` and ``'gaussian-scores'``, every mu-GDP claim with mu below it is refuted
        (nan for the other methods).
      guarantee: The kind of bound and its assumption, in words.
      epsilon_gaussian_curve: mu's eps at ``delta``, G_mu's: for ``'gdp'`` the GDP-convention number
        (jax_privacy's f-DP one-run epsilon), an (eps, delta) bound only for a mechanism whose privacy
        curve is exactly Gaussian; for ``'gaussian-scores'`` equal to ``epsilon``; nan otherwise.
      mu_estimate: For ``'gaussian-scores'``, the point estimate of the scores' separation (nan
        otherwise); :func:`cbdp_jax.one_run.gaussian_scores_fit` gives the whole fit.

    """

    epsilon: float
    method: str
    k_plus: int
    k_minus: int
    correct: int
    canaries: int
    level: float
    delta: float
    family_size: int
    gdp_mu: float = math.nan
    guarantee: str = ""
    epsilon_gaussian_curve: float = math.nan
    mu_estimate: float = math.nan


def steinke_p_value(m: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """Upper bound on P[C >= correct] for an (epsilon, delta)-DP run (Steinke et al. 2023, Thm 3.1).

    B(v) = P[Binomial(r, q) >= v], q = e^eps / (1 + e^eps), r = ``guesses``; the bound is
    B(v) + 2 m delta max_{1 <= i <= v} (B(v - i) - B(v)) / i, capped at 1.
    """
    v, r = int(correct), int(guesses)
    if v <= 0:
        return 1.0
    q = special.expit(epsilon)
    tail = float(stats.binom.sf(v - 1, r, q))
    if delta == 0.0:
        return min(tail, 1.0)
    below = stats.binom.pmf(np.arange(v - 1, -1, -1), r, q)  # P[X = v-1], P[X = v-2], ...
    alpha = float(np.max(np.cumsum(below) / np.arange(1, v + 1)))
    return min(tail + 2.0 * m * delta * alpha, 1.0)


def _largest_refuted(refutes: Callable[[float], bool], hi: float = 40.0, tol: float = 1e-4):
    """The largest x in [0, hi] found with ``refutes(x)`` True by bracketing and bisection (0 if none).

    The returned point is itself refuted, so it never exceeds the supremum of the refuted set even if
    that set is not an interval (a claim at eps implies the claims at every larger eps, so any
    refuted point is a valid lower bound).
    """
    if not refutes(0.0):
        return 0.0
    lo, up = 0.0, 0.5
    while refutes(up):
        lo, up = up, 2.0 * up
        if up > hi:
            return lo
    while up - lo > tol * max(1.0, lo):
        mid = 0.5 * (lo + up)
        lo, up = (mid, up) if refutes(mid) else (lo, mid)
    return lo


def steinke_epsilon(m: int, guesses: int, correct: int, *, delta: float, beta: float) -> float:
    """The largest eps whose (eps, delta) claim ``correct`` of ``guesses`` refutes at level 1 - beta."""
    if steinke_p_value(m, guesses, correct, 0.0, 0.0) > beta:
        return 0.0
    return _largest_refuted(lambda e: steinke_p_value(m, guesses, correct, e, delta) <= beta)


def dp_false_rate(r: np.ndarray, epsilon: np.ndarray, delta: float) -> np.ndarray:
    """Least wrong-guess rate that allows correct-guess rate r under (eps, delta)-DP.

    The inverse of f_{eps,delta}: min{a : f(a) <= 1 - r} = max(0, (r - delta) e^-eps,
    1 - delta - e^eps (1 - r)).
    """
    return np.maximum(
        0.0,
        np.maximum((r - delta) * np.exp(-epsilon), 1.0 - delta - np.exp(epsilon) * (1.0 - r)),
    )


def gdp_false_rate(r: np.ndarray, mu: np.ndarray) -> np.ndarray:
    """Least wrong-guess rate that allows correct-guess rate r under mu-GDP: Phi(Phi^-1(r) - mu)."""
    return special.ndtr(special.ndtri(np.clip(r, 0.0, 1.0)) - mu)


def fdp_refutes(m, guesses, correct, tau: float, false_rate: Callable) -> np.ndarray:
    """Whether P[C >= correct] >= tau is impossible for f-DP (Mahloujifar et al. 2024), vectorised.

    Per canary, write R_j (H_j) for the mass of correct (wrong) guesses made on outcomes with at least
    j correct guesses, divided by m. The paper's bound says every such pair obeys H_j >= g(R_j), with
    g = ``false_rate`` the inverse of the trade-off curve. If P[C >= c] >= tau then R_c >= tau c / m and
    H_c >= tau (r - c) / m; going down j = c-1, ..., 0, any wrong-guess mass added to restore
    H_j >= g(R_j) comes from outcomes with exactly j correct guesses and brings j / (r - j) of correct
    mass with it. Every outcome makes r guesses, so R_0 + H_0 <= r / m; the claim is refuted when the
    least R_0 + H_0 this recursion allows exceeds r / m.

    Args:
      m: Canaries.
      guesses: r, shape broadcastable with ``correct`` and ``false_rate``'s parameter.
      correct: c.
      tau: The level of the test (beta / K in a family of K).
      false_rate: ``r -> least wrong rate``, vectorised (closing over an array of eps or mu).

    Returns:
      A boolean array: True where the claim is refuted.

    """
    k, c = np.asarray(guesses, np.float64), np.asarray(correct, np.float64)
    shape = np.broadcast_shapes(k.shape, c.shape, np.shape(false_rate(np.full(1, 0.5))))
    k, c = np.broadcast_to(k, shape), np.broadcast_to(c, shape)
    r = tau * c / m
    h = tau * (k - c) / m
    live = c > 0
    for t in range(int(c.max(initial=0))):
        i = c - 1.0 - t
        live &= i >= 0
        if not live.any():
            break
        h_new = np.where(live, np.maximum(h, false_rate(r)), h)
        grew = h_new > h
        step = np.where(grew, i / np.maximum(k - i, 1.0) * (h_new - h), 0.0)
        r, h = np.minimum(r + step, 1.0), h_new
        live &= grew
    return r + h > k / m * (1.0 + 1e-12)


def _grid_search(m, guesses, correct, tau, rate_for: Callable, hi: float) -> tuple[float, int]:
    """The largest parameter (eps or mu) on a grid that some choice refutes, and that choice's index.

    A geometric grid up to ``hi``, then 32 points between the largest refuted point and the next; the
    result is a refuted grid point (0 and index -1 when none is refuted).
    """
    k = np.asarray(guesses, np.float64)[:, None]
    c = np.asarray(correct, np.float64)[:, None]
    tau = np.asarray(tau, np.float64)
    tau = tau[:, None] if tau.ndim == 1 else tau  # one level per choice

    def best(grid: np.ndarray) -> tuple[int, int]:
        hit = fdp_refutes(m, k, c, tau, rate_for(grid[None, :]))
        cols = np.flatnonzero(hit.any(axis=0))
        if cols.size == 0:
            return -1, -1
        j = int(cols[-1])
        return j, int(np.argmax(hit[:, j]))

    coarse = np.concatenate([[0.0], 0.02 * 1.25 ** np.arange(int(math.log(hi / 0.02, 1.25)) + 2)])
    j, who = best(coarse)
    if j < 0:
        return 0.0, -1
    if j == coarse.size - 1:
        return float(coarse[j]), who
    fine = np.linspace(coarse[j], coarse[j + 1], 33)
    j2, who2 = best(fine)
    return (float(fine[j2]), who2) if j2 > 0 else (float(coarse[j]), who)


def fdp_epsilon(m, guesses, correct, *, delta: float, beta: float) -> tuple[float, int]:
    """Largest eps some (guesses, correct) pair refutes at (eps, delta) with f-DP's test, and its index.

    Each pair is tested at ``beta``: a number, or one level per pair (beta w_j in a weighted family).
    """
    rate_for = lambda eps: lambda r: dp_false_rate(r, eps, delta)
    return _grid_search(m, guesses, correct, beta, rate_for, hi=40.0)


def fdp_gdp_mu(m, guesses, correct, *, beta: float) -> tuple[float, int]:
    """Largest GDP mu some (guesses, correct) pair refutes with f-DP's test, and its index."""
    rate_for = lambda mu: lambda r: gdp_false_rate(r, mu)
    return _grid_search(m, guesses, correct, beta, rate_for, hi=20.0)


def gdp_epsilon(mu: float, delta: float) -> float:
    """The eps of mu-GDP at ``delta``, the root of Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) = delta.

    0 when mu = 0 (or delta is already met at eps = 0), infinite when delta = 0 and mu > 0.
    """
    if mu <= 0.0 or gdp_delta(mu, 0.0) <= delta:
        return 0.0
    if delta <= 0.0:
        return math.inf
    lo, hi = 0.0, 1.0
    while gdp_delta(mu, hi) > delta:
        lo, hi = hi, 2.0 * hi
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gdp_delta(mu, mid) > delta else (lo, mid)
    return hi


def guess_candidates(
    m: int, *, ratio: float = 2.0, smallest: int = 8, one_sided: bool = False
) -> tuple[tuple[int, int], ...]:
    """The default family of (k_plus, k_minus) choices, fixed before any score is seen.

    Guess counts r = m, m / ratio, m / ratio^2, ... down to ``smallest``; for each a two-sided choice
    (ceil(r / 2), floor(r / 2)) and, with ``one_sided``, also (r, 0). For m = 1,000 the default is 7
    choices (each tested at beta / 7), for m = 10,000 it is 11. A small family matters: every
    doubling of K costs about as much as losing a quarter of the canaries (benchmark in
    docs/theory/one_run.md).
    """
    m = check_int_at_least("m", m, 1)
    check_in_range("ratio", ratio, 1.0, math.inf, low_open=True)
    counts, r = [], float(m)
    while r >= min(smallest, m) and int(round(r)) not in counts:
        counts.append(int(round(r)))
        r /= ratio
    out = []
    for r in counts:
        out += [((r + 1) // 2, r // 2)] + ([(r, 0)] if one_sided else [])
    return tuple(dict.fromkeys(out))


def family_weights(choices: Sequence[tuple[int, int]], m: int) -> np.ndarray:
    """The default share of beta of each choice, fixed before any score is seen: ``[K]``, summing to 1.

    Half to the choice that guesses on all m canaries (when the family has it), the other half split
    equally among the rest; a family without that choice, or of one choice, is weighted equally.
    """
    k = len(choices)
    full = [j for j, (kp, km) in enumerate(choices) if kp + km == m]
    if k == 1 or not full:
        return np.full(k, 1.0 / k)
    w = np.full(k, 0.5 / (k - 1))
    w[full[0]] = 0.5
    return w


def count_correct(
    scores, included, choices: Sequence[tuple[int, int]], *, centered: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Correct guesses and realised "in" guesses of each (k_plus, k_minus) choice.

    A one-sided choice (k_minus = 0 or k_plus = 0) guesses "in" on the k_plus highest (or "out" on
    the k_minus lowest) scores. A two-sided choice with ``centered`` makes r = k_plus + k_minus guesses
    on the r scores farthest from the mean score, "in" above it and "out" below (the split follows the
    scores, so ties and unequal groups cost nothing); without ``centered`` the split is fixed.
    Both are functions of the scores alone, i.e. post-processing of the run, as the bounds require.
    Ties are broken by canary index (independent of the inclusions). ``scores``, ``included``: ``[m]``.

    Returns:
      ``(correct, k_plus)``: ``[K]`` correct guesses and ``[K]`` "in" guesses made.

    """
    s, inc = np.asarray(scores, np.float64), np.asarray(included, bool)
    kp = np.array([c[0] for c in choices], int)
    km = np.array([c[1] for c in choices], int)
    order = np.argsort(-s, kind="stable")
    cum_in = np.concatenate([[0], np.cumsum(inc[order])])  # "in" among the j highest
    m, total_in = s.size, int(cum_in[-1])
    correct = cum_in[kp] + km - (total_in - cum_in[m - km])  # "out" among the k_minus lowest
    k_plus = kp.copy()
    if centered:
        d = s - s.mean()
        far = np.argsort(-np.abs(d), kind="stable")
        up = d[far] >= 0.0
        cum_ok = np.concatenate([[0], np.cumsum(up == inc[far])])
        cum_up = np.concatenate([[0], np.cumsum(up)])
        two = (kp > 0) & (km > 0)
        correct = np.where(two, cum_ok[kp + km], correct)
        k_plus = np.where(two, cum_up[kp + km], kp)
    return correct, k_plus


def _check_inputs(scores, included, delta, level, method):
    s, inc = check_scores(scores, included)
    check_in_range("delta", delta, 0.0, 1.0, high_open=True)
    check_in_range("level", level, 0.0, 1.0, low_open=True, high_open=True)
    check_choice("method", method, METHODS)
    return s, inc


def _check_choices(choices, m: int) -> tuple[tuple[int, int], ...]:
    choices = tuple((int(kp), int(km)) for kp, km in choices)
    if not choices:
        raise InvalidParameterError("choices=() is invalid: need at least one (k_plus, k_minus)")
    for kp, km in choices:
        if min(kp, km) < 0 or kp + km < 1 or kp + km > m:
            raise InvalidParameterError(
                f"choices entry {(kp, km)!r} is invalid: need k_plus, k_minus >= 0 and "
                f"1 <= k_plus + k_minus <= m = {m}"
            )
    return choices


def _check_weights(weights, choices, m: int) -> np.ndarray:
    if weights is None:
        return family_weights(choices, m)
    w = np.asarray(weights, np.float64)
    if w.shape != (len(choices),) or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise InvalidParameterError(
            f"weights of shape {w.shape} is invalid: must be {len(choices)} finite non-negative "
            "numbers (one per choice) with a positive sum"
        )
    return w / w.sum()


def _steinke_best(m, choices, correct, delta, taus) -> tuple[float, int]:
    """Largest Steinke eps over the choices (choice j at ``taus[j]``), skipping any that cannot win.

    A choice whose delta = 0 p-value at the current best eps is above its level cannot refute that eps
    (the delta term only adds), so it is skipped; skipping only lowers the maximum, never its validity.
    """
    best, who = 0.0, -1
    precision = correct / np.array([kp + km for kp, km in choices])
    for j in np.argsort(-precision, kind="stable"):
        r, v, tau = sum(choices[j]), int(correct[j]), float(taus[j])
        if steinke_p_value(m, r, v, best, 0.0) > tau:
            continue
        eps = steinke_epsilon(m, r, v, delta=delta, beta=tau)
        if eps > best:
            best, who = eps, int(j)
    return best, who


def _gaussian_scores_audit(s, inc, delta, level, normality_level, choices, weights):
    """The ``'gaussian-scores'`` bound (:func:`one_run_audit` has checked the common inputs)."""
    if choices is not None or weights is not None:
        raise InvalidParameterError(
            "choices and weights are invalid with method='gaussian-scores', which makes no guesses: "
            "pass them only to 'steinke', 'fdp' or 'gdp'"
        )
    if delta <= 0.0:
        raise InvalidParameterError(
            f"delta={delta!r} is invalid with method='gaussian-scores': must be > 0 (under its "
            "Gaussian model every separation > 0 has eps = inf at delta = 0)"
        )
    fit = gaussian_scores_fit(s, inc, level=level, normality_level=normality_level)
    eps = gdp_epsilon(fit.mu_lower, delta)
    return OneRunBound(
        eps, "gaussian-scores", 0, 0, 0, s.size, float(level), float(delta), 0, fit.mu_lower,
        _GUARANTEE["gaussian-scores"], eps, fit.mu_estimate,
    )  # fmt: skip


def one_run_audit(
    scores, included, *, delta: float = 1e-5, level: float = 0.95, method: str = "steinke",
    choices: Sequence[tuple[int, int]] | None = None, centered: bool = True,
    weights: Sequence[float] | None = None, normality_level: float = 1e-3,
) -> OneRunBound:  # fmt: skip
    """An epsilon lower bound from one run's canary scores (module docstring for the bounds).

    Args:
      scores: ``[m]`` scores, higher meaning "more likely included".
      included: ``[m]`` 0/1 or booleans: whether canary i was in the run (each independently with
        probability 1/2; the bounds assume exactly this design).
      delta: The delta of the refuted (eps, delta) claims, in [0, 1) ((0, 1) for
        ``'gaussian-scores'``).
      level: 1 - beta, in (0, 1); the bound holds with this probability over the canaries' inclusion
        and the run's randomness, jointly for the whole family of choices.
      method: One of ``METHODS``: ``'steinke'``, ``'fdp'``, ``'gdp'`` or ``'gaussian-scores'``.
      choices: The (k_plus, k_minus) family, fixed before seeing the scores (default
        :func:`guess_candidates`); each is tested at beta / K and the largest bound is reported.
      weights: Each choice's share of beta, ``[K]`` non-negative numbers fixed before seeing the
        scores (normalised to sum 1; default :func:`family_weights`: half to guessing on every canary).
      centered: Two-sided choices guess on the scores farthest from the mean score, the split
        between "in" and "out" following the scores (:func:`count_correct`).
      normality_level: ``'gaussian-scores'`` only: refuse the scores when a D'Agostino-Pearson
        normality p-value (either group, or both standardized and pooled) is below this, in (0, 1).

    Returns:
      A :class:`OneRunBound`.

    Raises:
      InvalidParameterError: Naming the parameter (scores, included, delta, level, method, choices,
        weights, normality_level) and its allowed range; for ``'gaussian-scores'``, naming
        ``scores`` when they are binary, few-valued or fail the normality check.

    """
    s, inc = _check_inputs(scores, included, delta, level, method)
    check_in_range("normality_level", normality_level, 0.0, 1.0, low_open=True, high_open=True)
    if method == "gaussian-scores":
        return _gaussian_scores_audit(s, inc, delta, level, normality_level, choices, weights)
    choices = _check_choices(guess_candidates(s.size) if choices is None else choices, s.size)
    m, tau = s.size, (1.0 - level) * _check_weights(weights, choices, s.size)
    correct, k_plus = count_correct(s, inc, choices, centered=centered)
    guesses = np.array([kp + km for kp, km in choices])
    mu = eps_gauss = math.nan
    if method == "steinke":
        eps, who = _steinke_best(m, choices, correct, delta, tau)
    else:
        eps, who = fdp_epsilon(m, guesses, correct, delta=delta, beta=tau)
    if method == "gdp":
        mu = fdp_gdp_mu(m, guesses, correct, beta=tau)[0]
        eps_gauss = gdp_epsilon(mu, delta)
    kp, km = (int(k_plus[who]), int(guesses[who] - k_plus[who])) if who >= 0 else (0, 0)
    return OneRunBound(
        float(eps), method, int(kp), int(km), int(correct[who]) if who >= 0 else 0, m,
        float(level), float(delta), len(choices), float(mu), _GUARANTEE[method], float(eps_gauss),
    )  # fmt: skip
