"""Exact (Clopper-Pearson) confidence bounds on a probability from a binomial count.

For k successes in n i.i.d. Bernoulli(p) trials, the one-sided Clopper-Pearson bounds invert the
binomial tail exactly:

    lower(k) = the a-quantile of Beta(k, n - k + 1)       (0 when k = 0),
    upper(k) = the (1 - a)-quantile of Beta(k + 1, n - k)  (1 when k = n),

so that P(p < lower(K)) <= a and P(p > upper(K)) <= a for every p (a = 1 - confidence). They are
finite-sample and assumption-free beyond independence, and, unlike a bound on a bounded mean that
only knows the range, they use the binomial's variance p (1 - p): when p is tiny (a tail event) the
upper bound is about (k + log(1/a)) / n rather than sqrt(log(1/a) / n). That is what an audit at a
small delta needs: the probability of a rare set under the neighbour's law.

References:
  Clopper, Pearson, "The use of confidence or fiducial limits illustrated in the case of the
  binomial", Biometrika 26 (1934); Brown, Cai, DasGupta, "Interval estimation for a binomial
  proportion", Statistical Science 16 (2001), section 2.1 (the Beta-quantile form).

"""

from __future__ import annotations

import numpy as np
from scipy import special

from cbdp_jax._src.infra.validation import InvalidParameterError, check_in_range


def _checked(k, n):
    k = np.asarray(k, np.float64)
    n = np.asarray(n, np.float64)
    if np.any(n < 1) or np.any(k < 0) or np.any(k > n) or np.any(k != np.round(k)):
        raise InvalidParameterError(
            "k is invalid: counts must be integers with 0 <= k <= n and n >= 1"
        )
    return k, n


def clopper_pearson_lower(k, n, confidence: float) -> np.ndarray:
    """The exact one-sided lower bound on p from k successes in n trials, at ``confidence``.

    Args:
      k: Successes (array or scalar), 0 <= k <= n.
      n: Trials (array or scalar), >= 1.
      confidence: The level 1 - a, in (0, 1).

    Returns:
      L (same shape as the broadcast of k and n) with P(p < L) <= 1 - confidence for every p.

    """
    check_in_range("confidence", confidence, 0.0, 1.0, low_open=True, high_open=True)
    k, n = _checked(k, n)
    safe = np.maximum(k, 1.0)
    return np.where(k > 0, special.betaincinv(safe, n - k + 1.0, 1.0 - confidence), 0.0)


def clopper_pearson_upper(k, n, confidence: float) -> np.ndarray:
    """The exact one-sided upper bound on p from k successes in n trials, at ``confidence``.

    Returns:
      U with P(p > U) <= 1 - confidence for every p (1 when k = n).

    """
    check_in_range("confidence", confidence, 0.0, 1.0, low_open=True, high_open=True)
    k, n = _checked(k, n)
    safe = np.maximum(n - k, 1.0)
    return np.where(k < n, special.betaincinv(k + 1.0, safe, confidence), 1.0)
