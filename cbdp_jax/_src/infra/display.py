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


def _pieces(word: str, room: int) -> list[str]:
    """A word longer than ``room`` cut after its commas (never inside a ``key=value``), packed."""
    if len(word) <= room or "," not in word:
        return [word]
    parts = [p + "," for p in word.split(",")]
    parts[-1] = parts[-1][:-1]
    out = [""]
    for part in parts:
        if out[-1] and len(out[-1]) + len(part) > room:
            out.append("")
        out[-1] += part
    return [p for p in out if p]


def wrap(text: str, width: int, indent: str = "  ", *, hard: bool = False) -> str:
    """``text`` in lines of at most ``width`` columns (the next ones indented by ``indent``).

    Unlike :func:`textwrap.fill`, a word is never cut inside (``de`` / ``lta=1e-05``) nor at a
    hyphen (``add`` / ``-remove``): a word too long for a line (a claim such as
    ``dpsgd:noise=0.5,...,relation=add-remove``) is cut only after a comma, and a piece longer than
    the line stays whole (``hard``: cut at the line's end, for a figure's title, whose page has no
    room for more).
    """
    lines: list[str] = []
    cur = ""
    for word in text.split():
        pieces = _pieces(word, width - len(indent))
        if hard:
            room = width - len(indent)
            pieces = [p[j : j + room] for p in pieces for j in range(0, len(p), room)]
        for i, piece in enumerate(pieces):
            room = width - (len(indent) if lines else 0)
            joined = cur + piece if (i > 0 or not cur) else f"{cur} {piece}"
            if len(joined) <= room or not cur:
                cur = joined
            else:
                lines.append(cur)
                cur = piece
    lines.append(cur)
    return "\n".join([lines[0], *(indent + line for line in lines[1:])])


__all__ = ["DIGITS", "NOTHING", "NOTHING_MEANS", "certified_text", "number", "wrap"]
