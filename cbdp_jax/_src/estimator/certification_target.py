"""What a bound is a bound on: its class, whether that lies inside the named class, its assumption.

One rule labels every bound (:func:`target`; docs/theory/bounds.md, "What a bound is a bound on").
"""

from __future__ import annotations

from typing import NamedTuple

from cbdp_jax._src.privacy.divergences import Divergence
from cbdp_jax._src.statistics import held_out as ho


class Target(NamedTuple):
    """What a bound is a bound on (docs/theory/bounds.md, "What a bound is a bound on").

    Attributes:
      certified_class: The class the bound certifies: a lower bound on D^H for this H.
      named_class: The class the user named.
      on_named_class: Whether the certified class lies inside the named class, so that the bound is
        also a bound on D^H of the named class. False for ``B tanh(H / B)`` of an unbounded H.
      bounds: In words, what the bound bounds.
      assumption: What the bound rests on (none for a finite-sample bound).

    """

    certified_class: str
    named_class: str
    on_named_class: bool
    bounds: str
    assumption: str


FINITE_SAMPLE_ASSUMPTION = (
    "none: the critic is bounded, so the paired differences lie in a known interval and the bound "
    "holds at every sample size"
)
ASYMPTOTIC_ASSUMPTION = (
    "the central limit theorem for the held-out mean: both f-form terms have finite variance under "
    "the true laws (including beyond the sampled range) and n is large enough; the tail check found "
    "no sign of a tail index below {need:g}, which supports but cannot prove it"
)


def target(
    div: Divergence,
    *,
    guarantee: str,
    certified_class: str,
    named_class: str,
    inside: bool,
    margin: float = ho.TAIL_MARGIN,
) -> Target:
    """The one rule for labelling a bound: its class, whether it bounds the named class, its assumption.

    Args:
      div: The divergence.
      guarantee: ``'finite-sample'``, ``'asymptotic'`` or ``'exact'``.
      certified_class: The class the bound certifies.
      named_class: The class the user named.
      inside: Whether ``certified_class`` is a subset of ``named_class`` (a shrunk member of a cone, a
        lower-degree polynomial, the class itself); False for a bounded version of an unbounded class.
      margin: The tail check's margin (stated in the assumption of an asymptotic bound).

    """
    if guarantee == "finite-sample":
        assumption = FINITE_SAMPLE_ASSUMPTION
    elif guarantee == "exact":
        assumption = "none: from the mechanism's law"
    else:
        assumption = ASYMPTOTIC_ASSUMPTION.format(need=2.0 + margin)
    return Target(
        certified_class,
        named_class,
        inside,
        describe(div, certified_class, named_class, inside),
        assumption,
    )


def describe(
    div: Divergence, certified_class: str, named_class: str | None = None, inside: bool = True
) -> str:
    """What a bound on v(h) bounds: D^H for the certified class, then what that implies."""
    name = div.label
    if named_class is None or named_class == certified_class:
        return f"{name}^H(P||Q) for H = {certified_class}, hence {name}(P||Q)"
    if inside:
        return (
            f"{name}^H(P||Q) for H = {certified_class}, a subset of {named_class}, hence "
            f"{name}^H for H = {named_class} and {name}(P||Q)"
        )
    return (
        f"{name}^H(P||Q) for H = {certified_class}, hence {name}(P||Q); not a bound on "
        f"{name}^H for H = {named_class} (the bounded class is not inside it)"
    )
