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

``relation`` is the neighbouring relation the claim is accounted under (dp_accounting's
``NeighboringRelation``): ``'add-remove'`` (``ADD_OR_REMOVE_ONE``, dp_accounting's default: D' lacks
the example), ``'zero-out'`` (``REPLACE_SPECIAL``: the example replaced by a zero record) and
``'replace-one'`` (``REPLACE_ONE``: the example replaced by any other). ``accountant`` is ``'pld'``
(the privacy-loss-distribution accountant, the default) or ``'rdp'`` (Renyi DP, as Opacus and older
jax_privacy report). What dp_accounting 0.6.0 can account, read from its source: the PLD
accountant composes a ``PoissonSampledDpEvent`` of a ``GaussianDpEvent`` under all three relations
(add-remove and zero-out give the same distribution; replace-one is the pair q N(-1) + (1 - q) N(0)
against q N(1) + (1 - q) N(0)); the RDP accountant composes it under add-remove and zero-out only
(its ``SampledWithoutReplacementDpEvent`` is replace-one only). A claim the accountant cannot
account for is refused, naming both.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    check_choice,
    check_in_range,
    check_int_at_least,
    check_positive,
)

SAMPLINGS = ("poisson", "shuffle", "fixed")
RELATIONS = ("add-remove", "zero-out", "replace-one")
ACCOUNTANTS = ("pld", "rdp")
_DP_ACCOUNTING_NAMES = {
    "add-remove": "ADD_OR_REMOVE_ONE",
    "zero-out": "REPLACE_SPECIAL",
    "replace-one": "REPLACE_ONE",
}
_ACCOUNTANT_NAMES = {"pld": "PLD", "rdp": "RDP"}


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
      accountant: Which accountant computed epsilon, and under which relation (in words).
      relation: The neighbouring relation it is accounted under (``RELATIONS``).
      method: ``'pld'`` or ``'rdp'``.

    """

    epsilon: float
    delta: float
    noise: float
    rate: float
    steps: int
    sampling: str
    accountant: str = (
        "dp_accounting PLD, Poisson-subsampled Gaussian, add-remove (ADD_OR_REMOVE_ONE)"
    )
    relation: str = "add-remove"
    method: str = "pld"

    def delta_at(self, eps: float) -> float:
        """The accountant's delta at ``eps``: the run claims (eps, this delta)-DP at every eps."""
        return dpsgd_delta(
            self.noise, self.rate, self.steps, eps, relation=self.relation, accountant=self.method
        )


def describe_accountant(relation: str = "add-remove", accountant: str = "pld") -> str:
    """The accountant in words: ``'dp_accounting PLD, Poisson-subsampled Gaussian, add-remove (...)'``."""
    return (
        f"dp_accounting {_ACCOUNTANT_NAMES[accountant]}, Poisson-subsampled Gaussian, {relation} "
        f"({_DP_ACCOUNTING_NAMES[relation]})"
    )


def check_accountable(relation: str, accountant: str = "pld") -> None:
    """Raises unless dp_accounting's ``accountant`` composes a Poisson-subsampled Gaussian under ``relation``.

    Asks the installed dp_accounting itself (``PrivacyAccountant.supports``), so the answer is the
    library's, not a copy of it.
    """
    check_choice("relation", relation, RELATIONS)
    check_choice("accountant", accountant, ACCOUNTANTS)
    dp_event, make = _dp_accounting(accountant)
    event = dp_event.PoissonSampledDpEvent(0.5, dp_event.GaussianDpEvent(1.0))
    if not make(_neighboring(relation)).supports(event):
        others = [r for r in RELATIONS if make(_neighboring(r)).supports(event)]
        raise InvalidParameterError(
            f"relation={relation!r} is invalid with accountant={accountant!r}: dp_accounting's "
            f"{_ACCOUNTANT_NAMES[accountant]} accountant cannot account a Poisson-subsampled "
            f"Gaussian under {_DP_ACCOUNTING_NAMES[relation]}; it accounts "
            f"{', '.join(others)}"
            + (
                ""
                if accountant == "pld"
                else "; the PLD accountant (accountant=pld) accounts all three"
            )
        )


def _dp_accounting(accountant: str):
    try:
        from dp_accounting import dp_event
        from dp_accounting.pld import pld_privacy_accountant
        from dp_accounting.rdp import rdp_privacy_accountant
    except ImportError as exc:  # a core dependency: a broken or partial install
        raise InvalidParameterError(
            "claim='dpsgd:...' is invalid here: dp-accounting, a dependency of cbdp_jax, does not "
            f"import ({exc}); reinstall it (pip install 'dp-accounting>=0.4.4')"
        ) from exc
    if accountant == "pld":
        make = lambda rel: pld_privacy_accountant.PLDAccountant(neighboring_relation=rel)
    else:
        make = lambda rel: rdp_privacy_accountant.RdpAccountant(neighboring_relation=rel)
    return dp_event, make


def _neighboring(relation: str):
    from dp_accounting.privacy_accountant import NeighboringRelation

    return NeighboringRelation[_DP_ACCOUNTING_NAMES[relation]]


@functools.lru_cache(maxsize=32)
def _composed(noise: float, rate: float, steps: int, relation: str = "add-remove",
              accountant: str = "pld"):  # fmt: skip
    """The accountant after T Poisson-subsampled Gaussian steps, under ``relation``."""
    check_accountable(relation, accountant)
    dp_event, make = _dp_accounting(accountant)
    event = dp_event.PoissonSampledDpEvent(rate, dp_event.GaussianDpEvent(noise))
    composed = make(_neighboring(relation))
    composed.compose(dp_event.SelfComposedDpEvent(event, int(steps)))
    return composed


def dpsgd_delta(noise: float, rate: float, steps: int, eps: float, *,
                relation: str = "add-remove", accountant: str = "pld") -> float:  # fmt: skip
    """Delta of T Poisson-subsampled Gaussian steps at ``eps`` (the accountant's whole curve)."""
    return float(
        _composed(float(noise), float(rate), int(steps), relation, accountant).get_delta(float(eps))
    )


def dpsgd_epsilon(noise: float, rate: float, steps: int, delta: float, *,
                  relation: str = "add-remove", accountant: str = "pld") -> float:  # fmt: skip
    """Epsilon of T Poisson-subsampled Gaussian steps at ``delta`` (dp_accounting's accountant).

    Args:
      noise: The noise multiplier sigma, > 0.
      rate: The sampling rate q in (0, 1].
      steps: T >= 1.
      delta: In (0, 1).
      relation: The neighbouring relation (``RELATIONS``; dp_accounting's default add-remove).
      accountant: ``'pld'`` or ``'rdp'``.

    Raises:
      InvalidParameterError: For parameters out of range, a relation the accountant cannot account
        for, or when dp_accounting is not installed.

    """
    check_positive("noise", noise)
    check_in_range("rate", rate, 0.0, 1.0, low_open=True)
    check_int_at_least("steps", steps, 1)
    check_in_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    composed = _composed(float(noise), float(rate), int(steps), relation, accountant)
    eps = float(composed.get_epsilon(delta))
    if not math.isfinite(eps):
        raise InvalidParameterError(
            f"noise={noise!r} is invalid: the accountant gives epsilon = {eps} at delta = {delta:g}"
        )
    return eps


def parse_dpsgd(text: str) -> DpsgdClaim:
    """``dpsgd:noise=S,rate=Q,steps=T,delta=D[,sampling=...][,relation=...][,accountant=...]`` as a claim.

    ``relation`` defaults to add-remove (dp_accounting's default) and ``accountant`` to pld.

    Raises:
      InvalidParameterError: Naming the claim, the part that is wrong and the form expected.

    """
    form = (
        "dpsgd:noise=S,rate=Q,steps=T,delta=D[,sampling=poisson|shuffle|fixed]"
        "[,relation=add-remove|zero-out|replace-one][,accountant=pld|rdp]"
    )
    body = text.split(":", 1)[1] if ":" in text else ""
    fields: dict[str, str] = {}
    for part in filter(None, body.split(",")):
        if "=" not in part:
            raise InvalidParameterError(f"claim={text!r} is invalid: must be {form}")
        name, value = part.split("=", 1)
        fields[name.strip()] = value.strip()
    known = {"noise", "rate", "steps", "delta", "sampling", "relation", "accountant"}
    for k, kind in (("noise", float), ("rate", float), ("steps", int), ("delta", float)):
        try:  # a bad value is named before a missing key (the key is there, its value is wrong)
            if k in fields:
                kind(fields[k])
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise InvalidParameterError(
                f"claim={text!r} is invalid: {k}={fields[k]!r} must be {what}; must be {form}"
            ) from None
    missing = [k for k in ("noise", "rate", "steps", "delta") if k not in fields]
    unknown = sorted(set(fields) - known)
    if missing or unknown:
        what = f"missing {', '.join(missing)}" if missing else f"unknown {', '.join(unknown)}"
        raise InvalidParameterError(f"claim={text!r} is invalid ({what}): must be {form}")
    sampling = fields.get("sampling", "poisson")
    check_choice("claim sampling", sampling, SAMPLINGS)
    relation = fields.get("relation", "add-remove")
    accountant = fields.get("accountant", "pld")
    check_choice("claim relation", relation, RELATIONS)
    check_choice("claim accountant", accountant, ACCOUNTANTS)
    try:
        noise, rate, delta = (float(fields[k]) for k in ("noise", "rate", "delta"))
        steps = int(fields["steps"])
    except ValueError as exc:
        raise InvalidParameterError(f"claim={text!r} is invalid: {exc}; must be {form}") from exc
    eps = dpsgd_epsilon(noise, rate, steps, delta, relation=relation, accountant=accountant)
    return DpsgdClaim(
        eps, delta, noise, rate, steps, sampling, describe_accountant(relation, accountant),
        relation, accountant,
    )  # fmt: skip


def dpsgd_noise(epsilon: float, delta: float, rate: float, steps: int, *,
                relation: str = "add-remove", accountant: str = "pld") -> float:  # fmt: skip
    """The noise multiplier whose T Poisson-subsampled Gaussian steps give ``epsilon`` at ``delta``.

    Bisection on :func:`dpsgd_epsilon` (epsilon decreases in the noise) to a relative 1e-6 of the
    noise, returning the upper end: the accountant's epsilon at the returned noise is at most
    ``epsilon`` (up to the accountant's own discretisation).

    Raises:
      InvalidParameterError: For parameters out of range.

    """
    target = check_positive("epsilon", epsilon)
    eps_at = lambda s: dpsgd_epsilon(
        s, rate, steps, delta, relation=relation, accountant=accountant
    )
    lo, hi = 1e-2, 1.0
    while eps_at(hi) > target:
        lo, hi = hi, 2.0 * hi
        if hi > 1e6:
            raise InvalidParameterError(
                f"epsilon={epsilon!r} is invalid: no noise below 1e6 reaches it"
            )
    while hi - lo > 1e-6 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if eps_at(mid) <= target else (mid, hi)
    return hi
