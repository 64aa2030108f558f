"""Row-wise functions of an audit's samples, evaluated a block of rows at a time.

A training audit at 10^7 runs per side holds its samples, ``[n, 1 + T k]`` float32 per side; a
feature group's statistics or a learned critic's input computed on the whole sample at once would
add float64 copies several times that size. Every feature function and every fitted critic of an
audit is ROW-WISE (row i of its output depends on row i of its input alone), so it is evaluated on
blocks of :data:`ROWS` rows written into one output: the same numbers, at the memory of a block.

Exactness. Numpy's per-row reductions (``axis=1``) do not depend on how many rows there are, and
XLA:CPU computes a matrix product's rows in groups of 8: a block that starts at a multiple of 8
rows of the whole array gives every row the same arithmetic as the whole array does (measured:
blocks of 777 or 1001 rows change a few rows' logits in the last bit, blocks of any multiple of 8
change none; a last block of 3 rows changed them too). Hence every block starts at a multiple of
:data:`ALIGN` and none is small: the remainder joins the last full block (:func:`spans`).
tests/test_audit_blocks.py checks the equality, the ragged last block included.
The column means of :func:`mean_std` are sums along the slow axis, which numpy adds row after row
in order; carrying the running sum from block to block keeps that order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

ALIGN = 8  # rows of one XLA:CPU matrix-product tile: a block starting at a multiple is exact
ROWS = 65_536  # rows per block: a multiple of ALIGN; 65,536 x 65 float64 values are 34 MB


def spans(n: int, rows: int | None = None) -> Iterator[slice]:
    """Row slices of ``rows`` rows covering ``n`` rows, the remainder joined to the last slice.

    The slices are ``[0, rows), [rows, 2 rows), ...``; the last holds between ``rows`` and
    ``2 rows - 1`` rows (all ``n`` when ``n < 2 rows``), so that no block is small: XLA:CPU may
    compute a product of a few rows with another kernel than that of many (measured: a block of 3
    rows after 2000 changed the last bit of their logits). ``rows`` defaults to :data:`ROWS` as it
    is when called (a test may set a smaller one).
    """
    rows = ROWS if rows is None else int(rows)
    if rows < 1 or rows % ALIGN:
        raise ValueError(f"rows={rows} must be a positive multiple of {ALIGN}")
    n, start = int(n), 0
    while start < n:
        stop = start + rows if n - start >= 2 * rows else n
        yield slice(start, stop)
        start = stop


def in_blocks(fn: Callable[[np.ndarray], np.ndarray], x, rows: int | None = None) -> np.ndarray:
    """``fn(x)`` for a row-wise ``fn``, evaluated on blocks of ``rows`` rows (one call if fewer).

    Args:
      fn: ``[m, ...] -> [m, ...]`` numpy, row i of the output a function of row i of the input.
      x: The rows ``[n, ...]``.
      rows: Rows per block, a multiple of :data:`ALIGN` (None: :data:`ROWS`).

    Returns:
      The same array as ``np.asarray(fn(x))``: shape, dtype and values (see the module doc).

    """
    n, rows = len(x), ROWS if rows is None else int(rows)
    if n < 2 * rows:  # one block
        return np.asarray(fn(x))
    out = None
    for s in spans(n, rows):
        part = np.asarray(fn(x[s]))
        if out is None:
            out = np.empty((n, *part.shape[1:]), part.dtype)
        if part.shape[1:] != out.shape[1:] or part.dtype != out.dtype or len(part) != len(out[s]):
            raise ValueError(
                f"fn is not row-wise: a block of {len(out[s])} rows gave {part.shape} {part.dtype}"
                f", the first block {out.shape[1:]} {out.dtype}"
            )
        out[s] = part
    return out


def _sum_rows(blocks: Iterator[np.ndarray]) -> np.ndarray:
    """Column sums of the blocks stacked, added row after row as numpy's ``axis=0`` sum does."""
    total = None
    for b in blocks:
        total = np.add.reduce(b if total is None else np.concatenate([total[None], b]), axis=0)
    return total


def mean_std(
    xp: np.ndarray, xq: np.ndarray, *, features: Callable | None = None, rows: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``both.mean(0), both.std(0)`` of ``both = np.concatenate([f(xp), f(xq)])``, without ``both``.

    The same numbers (numpy's ``_mean`` and ``_var``: column sums added row by row, divided by the
    count; squared deviations from that mean summed the same way), holding one block of ``f``'s
    rows at a time instead of the whole sample's features and the copies that ``concatenate`` and
    ``std`` make.

    Args:
      xp: Rows ``[n, ...]`` of one sample.
      xq: Rows ``[m, ...]`` of the other.
      features: A row-wise map ``f`` of the rows (None: the rows themselves).
      rows: Rows per block, a multiple of :data:`ALIGN` (None: :data:`ROWS`).

    """
    f = (lambda b: b) if features is None else features

    def blocks(g=None):
        for a in (xp, xq):
            for s in spans(len(a), rows):
                b = np.asarray(f(a[s]))
                yield b if g is None else g(b)

    first = next(blocks())
    if not np.issubdtype(first.dtype, np.floating) or first.dtype == np.float16:
        both = np.concatenate(list(blocks()))  # numpy accumulates these in another dtype
        return both.mean(0), both.std(0)
    count = len(xp) + len(xq)
    mean = np.true_divide(_sum_rows(blocks()), count)
    var = np.true_divide(_sum_rows(blocks(lambda b: np.square(b - mean))), count)
    return mean, np.sqrt(var)


__all__ = ["ALIGN", "ROWS", "in_blocks", "mean_std", "spans"]
