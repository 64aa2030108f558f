"""One result as a table that fits the terminal, with every number readable.

A result is one record of named fields. It is drawn as one row under a header when that fits the
terminal's width, otherwise as a vertical key/value table (one field per line), which fits 80 columns.
A float is rounded for reading (:func:`cbdp_jax._src.infra.display.number`: 4 significant digits); the
``--format json`` output and ``result.json`` keep every digit. A value too long for its column is
wrapped onto several lines at its spaces (a list of numbers between numbers, prose between words),
never cut.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

# Box characters per column (rich's default box: "| " before, " " after) and the closing border.
_COLUMN_OVERHEAD = 3
_TABLE_OVERHEAD = 1


def cell(value: Any) -> str:
    """A value as text: floats rounded for reading (4 significant digits), +inf / -inf, None as -."""
    from cbdp_jax._src.infra.display import number

    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return number(value)
    if isinstance(value, (list, tuple)):
        return ", ".join(cell(v) for v in value)
    return str(value)


def _fits_horizontally(fields: Sequence[tuple[str, str]], width: int) -> bool:
    total = _TABLE_OVERHEAD + sum(max(len(k), len(v)) + _COLUMN_OVERHEAD for k, v in fields)
    return total <= width


def render_record(title: str, fields: Sequence[tuple[str, Any]], width: int) -> str:
    """Draws one record as a table no wider than ``width`` columns.

    Args:
      title: The table's title.
      fields: ``(name, value)`` pairs in display order.
      width: The terminal's width in columns.

    Returns:
      The table as text (with box-drawing characters), every line at most ``width`` wide.

    """
    from rich.console import Console
    from rich.table import Table

    texts = [(name, cell(value)) for name, value in fields]
    console = Console(width=width, record=True, file=_Null(), color_system=None, soft_wrap=False)
    if _fits_horizontally(texts, width):
        table = Table(title=title)
        for name, text in texts:
            table.add_column(name, no_wrap=True, min_width=max(len(name), len(text)))
        table.add_row(*[text for _, text in texts])
    else:
        key_width = max(len(name) for name, _ in texts)
        room = width - _TABLE_OVERHEAD - 2 * _COLUMN_OVERHEAD - key_width
        table = Table(title=title)
        table.add_column("field", no_wrap=True, min_width=key_width)
        table.add_column("value", no_wrap=True)
        for name, text in texts:
            table.add_row(name, _wrapped(text, room))
    console.print(table)
    return console.export_text()


def _wrapped(text: str, room: int) -> str:
    """``text`` on lines of at most ``room`` characters, broken at spaces.

    A word longer than a line (a path) is broken inside; a number never is: its longest form fits.
    """
    if len(text) <= room:
        return text
    return "\n".join(textwrap.wrap(text, max(room, 24), break_on_hyphens=False))


class _Null:
    """A file that discards what is written (the console records it instead)."""

    def write(self, _text: str) -> int:
        return 0

    def flush(self) -> None:
        pass
