"""A certified bound as the estimator reports it: its fields on both scales, and the warnings.

:func:`bound_fields` puts the estimate, its standard error and the bound on the f-scale and the
reported scale; :func:`diagnostics` warns of overflow, heavy tails, the sample-size ceiling
(:func:`cap_for`), convergence and overfitting.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from cbdp_jax._src.estimator.certification_support import (
    _conj64,
)
from cbdp_jax._src.privacy.divergences import Divergence, get_divergence
from cbdp_jax._src.statistics import bounds
from cbdp_jax._src.statistics.bounds import Bound, renyi_slope, to_reported
from cbdp_jax._src.statistics.held_out import HEAVY_TAIL_SHARE, UNRELIABLE_SHARE, HeldOut


def cap_for(div: Divergence, n: int, confidence: float) -> float:
    """The largest f-scale value ``n`` paired samples can certify (bounded critics of any B)."""
    return _cap(div.name, div.alpha, div.convention, int(n), float(confidence))


@functools.lru_cache(maxsize=256)
def _cap(name: str, alpha, convention: str, n: int, confidence: float) -> float:
    div = get_divergence(name, alpha=alpha, convention=convention)
    return bounds.certifiable_max(lambda s: _conj64(div, s), n, confidence)


def reported_bound(div, bound: Bound, spec) -> float:
    """A bound on the reported scale; a refused bound is the trivial one (0 when H has constants)."""
    trivial = 0.0 if spec.contains_constants else -math.inf
    if not bound.certified:
        return trivial
    value = to_reported(div, bound.value)
    return max(value, trivial)


def bound_fields(div, held: HeldOut, bound: Bound, spec, cap: float, warnings: list[str]) -> dict:
    """The estimate, its standard error and the bound on both scales.

    The estimate and its standard error come from ``held.estimate_terms`` (the critic of the named
    class, when the certified critic is a shrunk or bounded version of it); the bound from ``bound``.
    """
    terms = held.estimate_terms
    overflow = not (math.isfinite(float(terms.p.mean)) and math.isfinite(float(terms.p.m2)))
    finite_q = math.isfinite(float(terms.q.mean))
    f_est = terms.estimate if finite_q and not overflow else -math.inf
    f_se = terms.std_error if math.isfinite(f_est) else math.inf
    se = f_se * renyi_slope(div, f_est) if math.isfinite(f_se) else math.inf
    if not bound.certified:
        warnings.append(f"bound not certified: {bound.reason}")
    return {
        "estimate": to_reported(div, f_est),
        "lower_bound": reported_bound(div, bound, spec),
        "std_error": se,
        "f_estimate": f_est,
        "f_lower_bound": bound.value,
        "f_std_error": f_se,
        "bound_reliable": bound.certified,
        "refusal": bound.reason,
        "heavy_tail_share": terms.heavy_tail_share() if math.isfinite(f_est) else 0.0,
        # The held-out value of the critic the bound is for (the estimate's critic, shrunk or bounded).
        "certified_estimate": _finite_reported(div, held.estimate),
        "certifiable_max": to_reported(div, cap),
        # The CLT bound on the same held-out data, for comparison only (unchecked, not certified).
        "f_clt_lower_bound": bounds.clt_lower_bound(
            held.p, held.q, confidence=bound.confidence
        ).value,
    }


def _finite_reported(div, f_value: float) -> float:
    """A held-out f-scale value on the reported scale; -inf where it is not finite."""
    return float(to_reported(div, f_value)) if math.isfinite(f_value) else -math.inf


def diagnostics(
    div, held: HeldOut, fields: dict, val_curve: np.ndarray, insample: HeldOut | None = None
) -> list[str]:
    """Warnings about overflow, heavy tails, the sample-size ceiling, convergence and overfitting."""
    out: list[str] = []
    f_est, f_se = fields["f_estimate"], fields["f_std_error"]
    terms = held.estimate_terms
    if not (math.isfinite(float(terms.p.mean)) and math.isfinite(float(terms.p.m2))):
        out.append(
            "the adversary's outputs overflowed (non-finite) on held-out samples: no estimate; "
            "retry with dtype='float64' or a smaller learning rate"
        )
    elif not math.isfinite(f_est):
        out.append(
            "f*(h) overflowed (non-finite) on held-out Q samples: no estimate; retry with "
            "dtype='float64', more samples or a smaller class"
        )
    share = fields["heavy_tail_share"]
    if HEAVY_TAIL_SHARE < share <= UNRELIABLE_SHARE:
        out.append(
            f"heavy tail: one held-out sample carries {share:.0%} of the variance of f*(h) under Q; "
            "the standard error may be underestimated (docs/theory/bounds.md)"
        )
    n = int(min(float(terms.p.count), float(terms.q.count)))
    cap = fields["certifiable_max"]
    if cap == -math.inf:
        out.append(
            f"{n} samples per side cannot certify any positive value with a finite-sample bound; "
            "use more held-out samples"
        )
    elif math.isfinite(f_est) and fields["estimate"] > cap:
        out.append(
            f"{n} samples per side can certify at most {cap:.4g} with any finite-sample bound; the "
            f"estimate {fields['estimate']:.4g} is beyond what this many samples can confirm"
        )
    elif fields["lower_bound"] <= 0.0 and cap < 1.0:
        out.append(
            f"{n} samples per side can certify at most {cap:.4g} with any finite-sample bound; "
            "use more held-out samples"
        )
    out.extend(_convergence(val_curve, f_se))
    if insample is None:
        return out
    terms = insample.estimate_terms
    gap = terms.estimate - f_est
    # The in-sample value is computed on a subsample of the training pairs at most (the estimator's
    # INSAMPLE_PAIRS): its own standard error is part of the gap's noise.
    se_in = terms.std_error
    noise = math.hypot(f_se, se_in) if math.isfinite(se_in) else f_se
    if math.isfinite(gap) and gap > 3.0 * noise + 0.01 * abs(f_est) + 1e-3:
        out.append(
            f"train/test gap: in-sample value exceeds the held-out estimate by {gap:.3g} "
            f"(> 3 standard errors); the adversary overfits -- use more samples or a smaller class"
        )
    return out


def _convergence(val_curve: np.ndarray, f_se: float) -> list[str]:
    blocks = len(val_curve)
    if blocks < 4 or not math.isfinite(f_se):
        return []
    tail = max(blocks // 4, 1)
    if not np.all(np.isfinite(val_curve[-1 - tail :])):
        return []
    gain = float(val_curve[-1] - val_curve[-1 - tail])
    if np.argmax(val_curve) >= blocks - max(blocks // 10, 1) and gain > max(f_se, 1e-3):
        return [
            f"not converged: validation objective still rose by {gain:.3g} over the last {tail} "
            "evaluation blocks; increase steps"
        ]
    return []
