"""Float64 helpers shared by the exact layer: the x64 scope, an exp that flushes tiny values, log weights.

The exact layer integrates in float64 (it enables 64-bit JAX around each public call and restores the
caller's setting); node counts are padded to powers of two of at least ``_N_BUCKET`` so that JAX programs
over them are reused across calls.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

_N_BUCKET = 4096  # node counts are padded to a power of two >= this (fewer recompilations)


def _x64(fn: Callable) -> Callable:
    """Runs ``fn`` with float64 enabled (the exact layer needs it; the caller's setting is restored)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with jax.enable_x64(True):
            return fn(*args, **kwargs)

    return wrapper


def _exp(x: np.ndarray) -> np.ndarray:
    """exp(x) with results below 1e-300 flushed to 0 (subnormal arithmetic is ~100x slower)."""
    x = np.asarray(x, dtype=np.float64)
    return np.exp(np.where(x > -690.0, x, -np.inf))


def _log_weights(w: np.ndarray, logdens: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(w) + logdens
