"""Everything a held-out evaluation of one fixed critic records, and the bound it certifies.

For a fixed critic h and held-out samples X_1..X_n ~ P, Y_1..Y_m ~ Q (independent of h), the f-form
terms are t_p = h(X_i) and t_q = f*(h(Y_j)). :class:`HeldOut` keeps, mergeably across chunks:

- the moments of t_p and of t_q (the estimate mean(t_p) - mean(t_q) and the CLT bound);
- the moments of the paired differences Z_i = t_p,i - t_q,i (i <= min(n, m)) and of their pair
  statistics (the Berry-Esseen finite-sample bound), and optionally the Z_i themselves (betting);
- tail sketches of both terms (Hill's index: is the CLT's finite variance plausible?);
- optionally the moments of the terms of a second critic of the same class evaluated on the same
  samples (:class:`Terms`): the critic the estimate is reported for, when the certified critic is a
  shrunk or bounded version of it (docs/theory/bounds.md, "The estimate and the bound").

:func:`certify` turns it into one :class:`~.bounds.Bound` under a stated guarantee. The estimator, the
sweep and the experiments all certify through it.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from cbdp_jax._src.statistics import berry_esseen, bounds, tails
from cbdp_jax._src.statistics import moments as mom

# The CLT bound is refused unless both terms' tail indices are shown to exceed 2 + TAIL_MARGIN at
# one-sided level TAIL_CONFIDENCE -- Hill's estimate minus z * its standard error -- or when one
# observation carries more than UNRELIABLE_SHARE of the variance of f*(h) (docs/theory/bounds.md,
# "Heavy tails"). The margin is 1: an index above 3 means a finite third moment, where Berry-Esseen
# gives the CLT's level error at rate n^(-1/2); between 2 and 3 the variance is finite but the rate
# is n^(-(index - 2) / 2), and at 10^4-10^5 samples per side the 95% bound missed 5.4-6.4% of the time.
TAIL_MARGIN = 1.0
TAIL_CONFIDENCE = 0.95
UNRELIABLE_SHARE = 0.5
HEAVY_TAIL_SHARE = 0.05


class Terms(NamedTuple):
    """Moments of the two f-form terms of one critic: h(X) under P and f*(h(Y)) under Q.

    Attributes:
      p: Moments of h(X).
      q: Moments of f*(h(Y)).

    """

    p: mom.Moments
    q: mom.Moments

    @property
    def estimate(self) -> float:
        """The held-out f-form value mean(t_p) - mean(t_q): unbiased for v(h)."""
        return float(self.p.mean) - float(self.q.mean)

    @property
    def std_error(self) -> float:
        """Its standard error from the two samples' variances."""
        return math.sqrt(
            float(self.p.variance) / float(self.p.count)
            + float(self.q.variance) / float(self.q.count)
        )

    def heavy_tail_share(self) -> float:
        """The largest single Q-term's share of the centred sum of squares of f*(h) under Q.

        Near 1/m for light tails; above a few percent, one sample carries the variance estimate.
        """
        q = self.q
        m2 = float(q.m2)
        if m2 <= 0 or not math.isfinite(m2):
            return 0.0 if m2 == 0 else 1.0
        worst = max((float(q.hi) - float(q.mean)) ** 2, (float(q.lo) - float(q.mean)) ** 2)
        return worst / m2


def merge_terms(a: Terms | None, b: Terms | None) -> Terms | None:
    """The terms' moments of two disjoint stretches of the stream (None if either has none)."""
    if a is None or b is None:
        return None
    return Terms(mom.merge(a.p, b.p), mom.merge(a.q, b.q))


class HeldOut(NamedTuple):
    """Statistics of one critic on held-out samples (host-side, float64).

    Attributes:
      p: Moments of h(X) under P.
      q: Moments of f*(h(Y)) under Q.
      z: Moments of the paired differences.
      pairs: Pair moments of the paired differences.
      tail_p: Tail sketch of |h(X) - c_p|.
      tail_q: Tail sketch of |f*(h(Y)) - c_q|.
      z_samples: The paired differences in draw order, when kept (the betting bound needs them).
      named: The terms of the critic the estimate is reported for, when it differs from the
        certified one (else None: the certified critic is that critic).

    """

    p: mom.Moments
    q: mom.Moments
    z: mom.Moments
    pairs: berry_esseen.PairMoments
    tail_p: tails.TailSketch
    tail_q: tails.TailSketch
    z_samples: np.ndarray | None = None
    named: Terms | None = None

    @property
    def terms(self) -> Terms:
        """The certified critic's terms."""
        return Terms(self.p, self.q)

    @property
    def estimate_terms(self) -> Terms:
        """The terms the estimate is reported from: ``named`` if there is one, else the certified."""
        return self.named if self.named is not None else self.terms

    @property
    def estimate(self) -> float:
        """The certified critic's held-out f-form value mean(t_p) - mean(t_q): unbiased for v(h)."""
        return self.terms.estimate

    @property
    def std_error(self) -> float:
        """Its standard error from the two samples' variances."""
        return self.terms.std_error

    def heavy_tail_share(self) -> float:
        """The largest single Q-term's share of the centred sum of squares of f*(h) under Q."""
        return self.terms.heavy_tail_share()


def merge(a: HeldOut, b: HeldOut) -> HeldOut:
    """The statistics of two disjoint stretches of the held-out stream (``a`` drawn first)."""
    if a.z_samples is None or b.z_samples is None:
        zs = None
    else:
        zs = np.concatenate([a.z_samples, b.z_samples], axis=-1)
    return HeldOut(
        mom.merge(a.p, b.p),
        mom.merge(a.q, b.q),
        mom.merge(a.z, b.z),
        berry_esseen.merge_pairs(a.pairs, b.pairs),
        tails.merge(a.tail_p, b.tail_p),
        tails.merge(a.tail_q, b.tail_q),
        zs,
        merge_terms(a.named, b.named),
    )


def take(held: HeldOut, index) -> HeldOut:
    """One member of batched statistics (a leading member axis, as in sweeps)."""
    return HeldOut(
        mom.take(held.p, index),
        mom.take(held.q, index),
        mom.take(held.z, index),
        berry_esseen.PairMoments(mom.take(held.pairs.w, index), mom.take(held.pairs.v, index)),
        tails.TailSketch(held.tail_p.top[index], held.tail_p.count[index]),
        tails.TailSketch(held.tail_q.top[index], held.tail_q.count[index]),
        None if held.z_samples is None else held.z_samples[index],
        None
        if held.named is None
        else Terms(mom.take(held.named.p, index), mom.take(held.named.q, index)),
    )


def empty(
    keep_samples: bool = False, capacity: int = tails.DEFAULT_CAPACITY, named: bool = False
) -> HeldOut:
    """Statistics of no samples (the identity of :func:`merge`); ``named``: with empty named terms."""
    e = mom.empty()
    return HeldOut(
        e,
        e,
        e,
        berry_esseen.PairMoments(e, e),
        tails.empty(capacity),
        tails.empty(capacity),
        np.zeros(0) if keep_samples else None,
        Terms(e, e) if named else None,
    )


class TailCheck(NamedTuple):
    """The CLT's finite-variance check.

    Attributes:
      index_p: Hill's tail index of h(X) under P.
      index_q: Hill's tail index of f*(h(Y)) under Q.
      lower_p: Its one-sided lower confidence limit, index - z * index / sqrt(k).
      lower_q: The same for f*(h(Y)).
      heavy_tail_share: The largest single Q-term's share of the variance of f*(h).
      passed: Both lower limits >= 2 + margin and no single observation carries the variance.
      reason: Why it failed, or None.

    """

    index_p: float
    index_q: float
    lower_p: float
    lower_q: float
    heavy_tail_share: float
    passed: bool
    reason: str | None


def tail_check(held: HeldOut, margin: float = TAIL_MARGIN) -> TailCheck:
    """Checks that the held-out sample does not point to an infinite variance of either term."""
    z = bounds.z_quantile(TAIL_CONFIDENCE)
    hp, hq = tails.hill(held.tail_p), tails.hill(held.tail_q)
    lp, lq = hp.index - z * hp.std_error, hq.index - z * hq.std_error
    share = held.heavy_tail_share()
    need = 2.0 + margin
    reason = None
    if min(lp, lq) < need:
        which, est, low = (
            ("f*(h) under Q", hq.index, lq) if lq <= lp else ("h under P", hp.index, lp)
        )
        reason = (
            f"heavy tail: the tail index of {which} is estimated at {est:.2f} (Hill; "
            f"{TAIL_CONFIDENCE:.0%} lower limit {low:.2f}), not shown to exceed {need:g}; its "
            "variance may be infinite, or finite with a CLT too slow to trust at this sample size, "
            "so the CLT bound would not be valid"
        )
    elif share > UNRELIABLE_SHARE:
        reason = (
            f"heavy tail: one held-out sample carries {share:.0%} of the variance of f*(h) under Q; "
            "the variance estimate is unusable"
        )
    return TailCheck(hp.index, hq.index, lp, lq, share, reason is None, reason)


def certify(
    held: HeldOut,
    *,
    guarantee: str,
    confidence: float,
    family_size: int = 1,
    method: str = "berry-esseen",
    support: tuple[float, float] | None = None,
    cap: float = math.inf,
    tail_margin: float = TAIL_MARGIN,
) -> tuple[bounds.Bound, TailCheck]:
    """The lower confidence bound on v(h) from held-out statistics, under ``guarantee``.

    Args:
      held: The held-out statistics.
      guarantee: ``'finite-sample'`` (needs ``support``: the known range of the paired differences)
        or ``'asymptotic'``.
      confidence: The overall level.
      family_size: Bonferroni family size.
      method: The finite-sample method (``'berry-esseen'`` or ``'betting'``), chosen beforehand.
      support: ``(lo, hi)`` of Z for the finite-sample bound.
      cap: The largest f-scale value the sample size can certify (:func:`.bounds.certifiable_max`);
        an asymptotic bound above it is refused.
      tail_margin: The margin of the tail-index check.

    Returns:
      The :class:`~.bounds.Bound` and the :class:`TailCheck` (computed for both guarantees, as a
      diagnostic).

    """
    check = tail_check(held, tail_margin)
    if guarantee == "finite-sample":
        if support is None:
            raise ValueError("a finite-sample bound needs the support of the paired differences")
        if not (math.isfinite(support[0]) and math.isfinite(support[1])):
            level = bounds.family_confidence(confidence, family_size)
            refused = bounds.Bound(-math.inf, "finite-sample", method, level, family_size)
            return refused.refused(
                "the critic's range makes f*(h) overflow, so the paired differences have no finite "
                "support and no finite-sample bound exists for it; use a smaller bound B"
            ), check
        bound = bounds.finite_sample_lower_bound(
            lo=support[0],
            hi=support[1],
            confidence=confidence,
            method=method,
            z=held.z,
            pairs=held.pairs,
            samples=held.z_samples,
            family_size=family_size,
        )
        return bound, check
    bound = bounds.clt_lower_bound(held.p, held.q, confidence=confidence, family_size=family_size)
    if not math.isfinite(held.estimate):
        return bound.refused("the estimate is not finite"), check
    if not check.passed:
        return bound.refused(check.reason), check
    if bound.value > cap:
        n = int(min(float(held.p.count), float(held.q.count)))
        return bound.refused(
            f"{n} samples per side can certify at most {cap:.4g} (f-scale) with any finite-sample "
            f"bound, and the CLT bound {bound.value:.4g} exceeds it: its assumption cannot be "
            "checked this far out"
        ), check
    return bound, check
