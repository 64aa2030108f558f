"""What an audit reports: its certified rows, where a violation is, what it could not see or check.

:class:`Row` (one certified bound), :class:`ViolationPoint`, :class:`BlindSpot`, :class:`Defect` and
the whole :class:`AuditResult`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

from cbdp_jax._src.mechanism_auditor.epsilon import EmpiricalEpsilon


class Row(NamedTuple):
    """One certified bound: class, direction, grid point, the claim there and the bound.

    ``guarantee`` is the bound's kind (``'finite-sample'`` or ``'asymptotic'``); ``note`` says why a
    row certifies nothing (a refused bound, or a bound not on the claimed class), else is empty.
    For an indicator critic h = 1_S certified with exact binomial bounds (``AuditConfig.tail_bounds``)
    ``p_lower`` <= P(S) and ``q_upper`` >= Q(S) hold together with ``lower_bound``; else NaN.
    """

    critic: str
    direction: str
    grid: float
    claimed: float
    estimate: float
    lower_bound: float
    std: float
    violation: bool
    guarantee: str = "finite-sample"
    note: str = ""
    p_lower: float = math.nan
    q_upper: float = math.nan


class ViolationPoint(NamedTuple):
    """Where a certified violation is: the grid point, what the samples certify there, what the claim allows.

    Attributes:
      grid: ``'epsilon'`` (a hockey-stick row: ``certified`` bounds delta(at)) or ``'alpha'`` (an
        estimator row: ``certified`` bounds the divergence).
      at: The grid point (eps, or the Renyi order alpha).
      certified: The certified lower bound there.
      claimed: What the claim allows there.
      critic: The critic (class) that certified it.
      direction: ``'P||Q'`` or ``'Q||P'``.
      guarantee: ``'finite-sample'`` or ``'asymptotic'``.

    """

    grid: str
    at: float
    certified: float
    claimed: float
    critic: str
    direction: str
    guarantee: str

    def describe(self, noun: str = "samples") -> str:
        """``'at eps 0.25 the runs certify delta >= 0.51, the claim allows 0.448'``."""
        if self.grid == "epsilon":
            return (
                f"at eps {self.at:.4g} the {noun} certify delta >= {self.certified:.4g}, the claim "
                f"allows {self.claimed:.4g}"
            )
        return (
            f"at alpha {self.at:.4g} the {noun} certify a divergence >= {self.certified:.4g}, the "
            f"claim allows {self.claimed:.4g}"
        )


class BlindSpot(NamedTuple):
    """What an audit could not see by construction (e.g. a threat that cannot see a kind of bug).

    Attributes:
      kind: A short tag (``'clip-not-binding'``, ``'unnoised-parameters'``, ``'batch-normalisation'``,
        ``'dataset-size'``).
      message: One sentence: what is not seen, why, and what would see it.

    """

    kind: str
    message: str


class Defect(NamedTuple):
    """A failed probe of what the accountant assumes of a DP step (e.g. noise reused across steps).

    A defect is found before any training, by a test at a stated level (or by an exact check), and
    means the claim's accountant does not describe the step: an audit that names one never ends in
    a plain "no violation" (docs/theory/training_audit.md, section 11).

    Attributes:
      kind: A short tag (``'noise-not-keyed'``, ``'noise-missing'``, ``'noise-not-fresh'``,
        ``'noise-dependent-coordinates'``, ``'noise-too-small'``, ``'noise-unchecked'``).
      message: One sentence: what the probe measured, and which assumption of the accountant fails.
      statistic: The test's statistic, as the message states it (NaN for an exact check).
      p_value: The bound on the test's p-value (0 for an exact check).
      level: The level it was compared with: the family-wise level split over the probes' tests.

    """

    kind: str
    message: str
    statistic: float = math.nan
    p_value: float = 0.0
    level: float = 0.0


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """The outcome of an audit (``to_dict`` for JSON).

    Attributes:
      mechanism: The mechanism's name.
      claim: The claim as written.
      violation: True only when some certified lower bound exceeds the claim.
      verdict: One line in words.
      pair: The certified pair ``(D, D')`` as lists.
      rows: Every certified bound (:class:`Row`).
      family_size: K, the Bonferroni family of the certification.
      confidence: The family-wise level.
      screened: The candidate pairs screened with their scores.
      samples: Certification samples per side.
      samples_needed: Held-out pairs a violation of ``violation_size`` would need (best row).
      seconds: Wall time.
      grid_name: ``'epsilon'`` (hockey-stick rows) or ``'alpha'`` (estimator rows).
      empirical: The empirical epsilon and GDP mu of a pure / approximate claim, else None.
      claimed: The claim as checked: its kind, epsilon and delta, and for a ``dpsgd:`` claim the run's
        parameters and the accountant that turned them into (epsilon, delta).
      violation_point: Where the violation is certified (:class:`ViolationPoint`), else None.
      guarantee: The kind of bound the verdict rests on: ``'finite-sample'`` or ``'asymptotic'``
        (then the verdict says so, with the assumption), ``'none'`` when no bound was certified.
      relation: The neighbouring relation of the pair audited, when known (training audits).
      blind_spots: What the audit could not see by construction (:class:`BlindSpot`).
      defects: What the step does that its claim's accountant does not assume (:class:`Defect`);
        a result with a defect and no violation is not a clean bill.

    """

    mechanism: str
    claim: str
    violation: bool
    verdict: str
    pair: tuple[Any, Any]
    rows: tuple[Row, ...]
    family_size: int
    confidence: float
    screened: tuple[dict, ...]
    samples: int
    samples_needed: float
    violation_size: float
    seconds: float
    grid_name: str = "epsilon"
    empirical: EmpiricalEpsilon | None = None
    claimed: dict | None = None
    violation_point: ViolationPoint | None = None
    guarantee: str = "finite-sample"
    relation: str | None = None
    blind_spots: tuple[BlindSpot, ...] = ()
    defects: tuple[Defect, ...] = ()

    def strongest(self) -> Row:
        """The row whose certified bound exceeds its claim by the most (or falls short least)."""
        return max(self.rows, key=lambda r: r.lower_bound - r.claimed)

    def to_dict(self) -> dict:
        """A JSON-ready dict (non-finite numbers as None)."""

        def clean(x):
            if isinstance(x, float):
                return x if math.isfinite(x) else None
            return x

        return {
            "mechanism": self.mechanism,
            "claim": self.claim,
            "violation": self.violation,
            "verdict": self.verdict,
            "pair": {"d": self.pair[0], "d_prime": self.pair[1]},
            "certified_bounds": [{k: clean(v) for k, v in r._asdict().items()} for r in self.rows],
            "grid": self.grid_name,
            "family_size": self.family_size,
            "confidence": self.confidence,
            "samples_per_side": self.samples,
            "screened": list(self.screened),
            "samples_needed": clean(float(self.samples_needed)),
            "violation_size": self.violation_size,
            "seconds": self.seconds,
            "empirical": None if self.empirical is None else self.empirical.to_dict(),
            "claimed": self.claimed,
            "violation_point": None
            if self.violation_point is None
            else {k: clean(v) for k, v in self.violation_point._asdict().items()},
            "guarantee": self.guarantee,
            "relation": self.relation,
            "blind_spots": [b._asdict() for b in self.blind_spots],
            "defects": [{k: clean(v) for k, v in d._asdict().items()} for d in self.defects],
        }
