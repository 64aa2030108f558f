"""From a trained critic to a certified lower bound: what is decided on validation data, and how.

A held-out bound is honest only if everything that shapes it is fixed before the test samples are
seen. This module makes those choices on VALIDATION samples (docs/theory/bounds.md, "What is decided
where"):

- the guarantee (``'finite-sample'`` or ``'asymptotic'``; ``'auto'`` picks finite-sample for bounded
  classes, and for an unbounded class the asymptotic bound on D^H when the critic's validation tails
  clear the check the test will apply, the finite-sample bound of its bounded version otherwise);
- for a finite-sample bound on an unbounded class, the bound B of the critic ``B tanh(h / B)`` (which
  makes the f-form terms bounded, so the bound needs no assumption) and the finite-sample method
  (Berry-Esseen or betting), by the bound each would give at the test sample size;
- for an asymptotic KL bound whose critic has a visibly heavy tail on validation data, a shrunken
  member t * h of the same class (a cone) whose tails clear the margin: a smaller but certifiable
  value. Only KL's exponential conjugate has a tail index that moves with t
  (:func:`shrink_changes_tails`).

It also knows the support of the paired differences of a bounded critic, which the finite-sample bounds
need, and the largest value a sample size can certify; and it says, in one place (:func:`target`), what
a bound is a bound on: the class it certifies, whether that class lies inside the class the user named
(only then is it a bound on D^H of that class), and the assumption it rests on.

The stages live in modules of their own: the support of a bounded critic's differences
(``certification_support``), the finite-sample plan's B and method (``certification_choice``), the
tail check and the shrink (``certification_tails``), what a bound is on (``certification_target``)
and the reported fields and warnings (``certification_report``). This module holds the
:class:`Plan` and the guarantee's choice before any data is seen, and names every stage's public
function, so that ``certification.X`` reaches each.
"""

from __future__ import annotations

from typing import NamedTuple

from cbdp_jax._src.estimator.certification_choice import (
    choose_bound,
    choose_bounds,
    largest_finite_bound,
    predicted_bound,
    predicted_bound_from_moments,
    validation_score,
)
from cbdp_jax._src.estimator.certification_report import (
    bound_fields,
    cap_for,
    diagnostics,
    reported_bound,
)
from cbdp_jax._src.estimator.certification_support import (
    EPS32,
    ROUNDING_ULPS,
    conjugate_range,
    conjugate_ranges,
    interval_support,
    interval_supports,
    rounding_slack,
    rounding_slacks,
    support,
    supports,
)
from cbdp_jax._src.estimator.certification_tails import (
    centres_of,
    clears_tails,
    held_out_of_terms,
    shrink_changes_tails,
    shrink_for_tails,
    shrink_for_tails_traced,
    tail_centres,
    tail_target,
)
from cbdp_jax._src.estimator.certification_target import (
    ASYMPTOTIC_ASSUMPTION,
    FINITE_SAMPLE_ASSUMPTION,
    Target,
    describe,
    target,
)
from cbdp_jax._src.infra.validation import check_choice

GUARANTEE_CHOICES = ("auto", "class", "finite-sample", "asymptotic")
METHOD_CHOICES = ("auto", "berry-esseen", "betting")


class Plan(NamedTuple):
    """How a trained critic will be evaluated and certified, fixed on validation data.

    Attributes:
      guarantee: ``'finite-sample'`` or ``'asymptotic'``.
      method: ``'clt'``, ``'berry-esseen'`` or ``'betting'``.
      bound: B of the bounded critic (``inf``: unbounded).
      scale: The critic's scale (after any shrink).
      shift: The critic's constant (after any shrink).
      tail_shrink: The factor t applied to h to clear the tail check (1.0: none).
      support: ``(lo, hi)`` of the paired differences for a finite-sample bound, else None.
      certified_class: Label of the class the bound is on (``'3.1*tanh(mlp(32x2))'`` for a bounded
        critic built from ``mlp(32x2)``).
      inside_trained_class: Whether the certified critic is a member of the trained class (a shrunk
        member t * h of a cone is; ``B tanh(h / B)`` of an unbounded class is not).
      choice: Why this guarantee was used (``'auto'`` explains its pick).

    """

    guarantee: str
    method: str
    bound: float
    scale: float
    shift: float
    tail_shrink: float
    support: tuple[float, float] | None
    certified_class: str
    inside_trained_class: bool = True
    choice: str = ""


def resolve_guarantee(guarantee: str, spec) -> str:
    """``'auto'`` and ``'class'``: finite-sample for a bounded class (its terms are bounded), else asymptotic.

    This is the guarantee before any data is seen. ``'class'`` keeps it: the bound is always on the
    class itself. The estimator's ``'auto'`` then falls back to the finite-sample bound of ``B tanh(h /
    B)`` when the asymptotic one's tail check fails on validation data (a bound on another class).
    """
    check_choice("guarantee", guarantee, GUARANTEE_CHOICES)
    if guarantee not in ("auto", "class"):
        return guarantee
    return "finite-sample" if spec.bound is not None else "asymptotic"


__all__ = [
    "ASYMPTOTIC_ASSUMPTION",
    "bound_fields",
    "cap_for",
    "centres_of",
    "choose_bound",
    "choose_bounds",
    "clears_tails",
    "conjugate_range",
    "conjugate_ranges",
    "describe",
    "diagnostics",
    "EPS32",
    "FINITE_SAMPLE_ASSUMPTION",
    "GUARANTEE_CHOICES",
    "held_out_of_terms",
    "interval_support",
    "interval_supports",
    "largest_finite_bound",
    "METHOD_CHOICES",
    "Plan",
    "predicted_bound",
    "predicted_bound_from_moments",
    "reported_bound",
    "resolve_guarantee",
    "rounding_slack",
    "rounding_slacks",
    "ROUNDING_ULPS",
    "shrink_changes_tails",
    "shrink_for_tails",
    "shrink_for_tails_traced",
    "support",
    "supports",
    "tail_centres",
    "tail_target",
    "Target",
    "target",
    "validation_score",
]
