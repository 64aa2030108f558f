"""A DP-SGD run's own privacy statement, turned into the (epsilon, delta) claim an audit checks.

DP-SGD with noise multiplier sigma (Gaussian noise of standard deviation sigma times the clipping norm),
sampling rate q and T steps is accounted, as jax_privacy and Opacus report it, by composing T
Poisson-subsampled Gaussian mechanisms with the privacy-loss-distribution (PLD) accountant of Google's
``dp_accounting``, and reading epsilon at the run's delta. That number is the claim; the audit then
tries to refute it from the trained models (docs/theory/auditing.md).

``sampling`` records how the batches were really drawn. ``'poisson'`` is what the accountant assumes.
``'shuffle'`` (fixed-size batches of a shuffled dataset, epoch by epoch) and ``'fixed'`` (fixed-size
batches drawn independently) are accounted by implementations as if Poisson: the claim is that same
number, which is exactly what an audit of such a run tests (Chua et al. 2024, "How private are DP-SGD
implementations?"; Annamalai et al. 2024, "To shuffle or not to shuffle").
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

from cbdp_jax._src.validation import (
    InvalidParameterError,
    check_choice,
    check_in_range,
    check_int_at_least,
    check_positive,
)

SAMPLINGS = ("poisson", "shuffle", "fixed")


class DpsgdClaim(NamedTuple):
    """The (epsilon, delta) a DP-SGD run claims, with the parameters it was computed from.

    Attributes:
      epsilon: The accountant's epsilon at ``delta``.
      delta: The run's delta.
      noise: The noise multiplier sigma.
      rate: The sampling rate q (batch size / dataset size).
      steps: The number of steps T.
      sampling: How the batches were drawn (``'poisson'``, ``'shuffle'`` or ``'fixed'``); all are
        accounted as Poisson, as implementations report them.
      accountant: Which accountant computed epsilon.

    """

    epsilon: float
    delta: float
    noise: float
    rate: float
    steps: int
    sampling: str
    accountant: str = "dp_accounting PLD, Poisson-subsampled Gaussian"

    def delta_at(self, eps: float) -> float:
        """The accountant's delta at ``eps``: the run claims (eps, this delta)-DP at every eps."""
        return dpsgd_delta(self.noise, self.rate, self.steps, eps)


@functools.lru_cache(maxsize=32)
def _composed(noise: float, rate: float, steps: int):
    """The PLD accountant after T Poisson-subsampled Gaussian steps (one per parameter set)."""
    try:
        from dp_accounting import dp_event
        from dp_accounting.pld import pld_privacy_accountant
    except ImportError as exc:  # an optional dependency
        raise InvalidParameterError(
            "claim='dpsgd:...' is invalid here: it needs dp-accounting (pip install "
            "'cbdp_jax[audit]')"
        ) from exc
    event = dp_event.PoissonSampledDpEvent(rate, dp_event.GaussianDpEvent(noise))
    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(dp_event.SelfComposedDpEvent(event, int(steps)))
    return accountant


def dpsgd_delta(noise: float, rate: float, steps: int, eps: float) -> float:
    """Delta of T Poisson-subsampled Gaussian steps at ``eps`` (the accountant's whole curve)."""
    return float(_composed(float(noise), float(rate), int(steps)).get_delta(float(eps)))


def dpsgd_epsilon(noise: float, rate: float, steps: int, delta: float) -> float:
    """Epsilon of T Poisson-subsampled Gaussian steps at ``delta`` (dp_accounting's PLD accountant).

    Raises:
      InvalidParameterError: For parameters out of range, or when dp_accounting is not installed.

    """
    check_positive("noise", noise)
    check_in_range("rate", rate, 0.0, 1.0, low_open=True)
    check_int_at_least("steps", steps, 1)
    check_in_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    eps = float(_composed(float(noise), float(rate), int(steps)).get_epsilon(delta))
    if not math.isfinite(eps):
        raise InvalidParameterError(
            f"noise={noise!r} is invalid: the accountant gives epsilon = {eps} at delta = {delta:g}"
        )
    return eps


def parse_dpsgd(text: str) -> DpsgdClaim:
    """``dpsgd:noise=S,rate=Q,steps=T,delta=D[,sampling=poisson|shuffle|fixed]`` as a claim.

    Raises:
      InvalidParameterError: Naming the claim, the part that is wrong and the form expected.

    """
    form = "dpsgd:noise=S,rate=Q,steps=T,delta=D[,sampling=poisson|shuffle|fixed]"
    body = text.split(":", 1)[1] if ":" in text else ""
    fields: dict[str, str] = {}
    for part in filter(None, body.split(",")):
        if "=" not in part:
            raise InvalidParameterError(f"claim={text!r} is invalid: must be {form}")
        name, value = part.split("=", 1)
        fields[name.strip()] = value.strip()
    missing = [k for k in ("noise", "rate", "steps", "delta") if k not in fields]
    unknown = sorted(set(fields) - {"noise", "rate", "steps", "delta", "sampling"})
    if missing or unknown:
        what = f"missing {', '.join(missing)}" if missing else f"unknown {', '.join(unknown)}"
        raise InvalidParameterError(f"claim={text!r} is invalid ({what}): must be {form}")
    sampling = fields.get("sampling", "poisson")
    check_choice("claim sampling", sampling, SAMPLINGS)
    try:
        noise, rate, delta = (float(fields[k]) for k in ("noise", "rate", "delta"))
        steps = int(fields["steps"])
    except ValueError as exc:
        raise InvalidParameterError(f"claim={text!r} is invalid: {exc}; must be {form}") from exc
    eps = dpsgd_epsilon(noise, rate, steps, delta)
    return DpsgdClaim(eps, delta, noise, rate, steps, sampling)
