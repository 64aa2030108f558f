"""Numbers as a reader sees them in tables: rounded, and "none" where nothing is certified.

Tables round (:data:`DIGITS` significant digits); ``--format json`` and ``result.json`` keep every
digit. A certified lower bound at or below 0 bounds a quantity that cannot be negative (a divergence, a
hockey-stick divergence ``E_gamma``, a delta) by what every mechanism meets: it certifies nothing, and
a table says so instead of printing a negative number (``-3.904e+04`` read as a result).
"""

from __future__ import annotations

import math
from typing import Any

DIGITS = 4
NOTHING = "none"
NOTHING_MEANS = (
    "the certified lower bound is at or below 0, which every mechanism meets (the quantity cannot "
    "be negative): nothing is certified there"
)


def number(value: Any, digits: int = DIGITS) -> str:
    """A number for a table: floats to ``digits`` significant digits, ``+inf`` / ``-inf`` / ``nan``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    return f"{value:.{digits}g}"


def certified_text(value: float | None, digits: int = DIGITS) -> str:
    """A certified lower bound on a non-negative quantity: :func:`number`, or ``'none'`` at or below 0."""
    if value is None or not value > 0:  # NaN too: nothing certified
        return NOTHING
    return number(float(value), digits)


__all__ = ["DIGITS", "NOTHING", "NOTHING_MEANS", "certified_text", "number"]
