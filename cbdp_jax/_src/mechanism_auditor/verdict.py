"""An audit's verdict from its certified rows: a certified violation and where, or what was shown.

Without a violation the verdict names the strongest certified bound, and how large a violation the
held-out samples would have certified about half the time.
"""

from __future__ import annotations

import math

from cbdp_jax._src.mechanism_auditor import hockey_stick as hs
from cbdp_jax._src.mechanism_auditor.claims import Claim
from cbdp_jax._src.mechanism_auditor.config import AuditConfig
from cbdp_jax._src.mechanism_auditor.results import Row, ViolationPoint


def _verdict(rows: list[Row], claim: Claim, family: int, config: AuditConfig, n_test: int,
             noun: str = "samples"):  # fmt: skip
    """(violation, text, samples needed, violation point, guarantee) of the certified rows."""
    level = f"{100 * config.confidence:g}%"
    excess = lambda r: r.lower_bound - r.claimed
    violating = [r for r in rows if r.violation]
    if violating:
        sure = [r for r in violating if r.guarantee != "asymptotic"]
        row = max(sure or violating, key=excess)
        grid = "alpha" if claim.kind in ("renyi", "capacity") else "epsilon"
        point = ViolationPoint(
            grid, row.grid, row.lower_bound, row.claimed, row.critic, row.direction, row.guarantee
        )
        text = (
            f"violation certified at {level}: {point.describe(noun)} ({row.critic} {row.direction})"
        )
        if row.guarantee == "asymptotic":
            text += f"; this rests on an asymptotic bound ({row.note})"
        return True, text, math.nan, point, row.guarantee
    best = max(rows, key=excess)
    # a violation of size v needs E_P h >= v, so the terms' spread is at least about sqrt(v)
    spread = max(best.std, math.sqrt(config.violation_size))
    needed = hs.samples_needed(config.violation_size, spread, config.confidence, family)
    if best.lower_bound > 0 and math.isfinite(best.lower_bound):  # as the table shows it
        strongest = f"{best.lower_bound:.4g} ({best.critic} {best.direction})"
    elif math.isfinite(best.lower_bound):
        strongest = "none (every certified lower bound is at or below 0)"
    else:
        strongest = "none (every bound refused or not on the claimed class)"
    guarantee = best.guarantee if math.isfinite(best.lower_bound) else "none"
    if guarantee == "asymptotic":
        strongest += ", an asymptotic bound"
    text = (
        f"no violation certified: the strongest certified bound is {strongest} against the claimed "
        f"{best.claimed:.4g}. What was shown: none of the {len(rows)} bounds of this audit exceeds "
        f"the claim at {100 * config.confidence:g}% (family-wise); this does not prove the claim (a "
        f"worse pair or a stronger critic may exist). Sensitivity: with {n_test} held-out samples "
        f"per side, a violation of about {_detectable(spread, n_test, config.confidence, family):.3g}"
        " above the claim would be certified about half the time"
    )
    return False, text, needed, None, guarantee


def _detectable(spread: float, n: int, confidence: float, family: int) -> float:
    """The violation whose expected bound just clears the claim: z * spread / sqrt(n) (even odds)."""
    from cbdp_jax._src.statistics.bounds import family_confidence, z_quantile

    z = z_quantile(family_confidence(confidence, family))
    return z * spread / math.sqrt(max(n, 1))
