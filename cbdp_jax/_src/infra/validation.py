"""Input validation shared by every public entry point.

Every check raises :class:`InvalidParameterError` (a ``ValueError``) whose message names the parameter,
the value received and the allowed range, so the CLI can print it as one line and exit non-zero.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


class InvalidParameterError(ValueError):
    """A parameter is outside its allowed range. The message names the parameter and the range."""


def _plain(value: Any) -> Any:
    """Numpy scalars and containers of them as plain Python values, so messages read naturally."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (tuple, list)):
        return type(value)(_plain(v) for v in value)
    return value


def _fail(name: str, value: Any, allowed: str, hint: str = "") -> None:
    msg = f"{name}={_plain(value)!r} is invalid: {allowed}"
    if hint:
        msg += f" ({hint})"
    raise InvalidParameterError(msg)


def check_finite_scalar(name: str, value: Any) -> float:
    """Returns ``value`` as a float, or raises if it is not a finite real number (bools rejected)."""
    if isinstance(value, (bool, np.bool_)):
        _fail(name, value, "must be a real number, not a boolean")
    try:
        x = float(value)
    except (TypeError, ValueError):
        _fail(name, value, "must be a real number")
    if not math.isfinite(x):
        _fail(name, value, "must be finite")
    return x


def check_positive(name: str, value: Any) -> float:
    """Returns ``value`` as a float, or raises unless it is finite and > 0."""
    x = check_finite_scalar(name, value)
    if x <= 0:
        _fail(name, value, "must be > 0")
    return x


def check_in_range(
    name: str,
    value: Any,
    low: float,
    high: float,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """Returns ``value`` as a float, or raises unless it lies in the stated interval."""
    x = check_finite_scalar(name, value)
    too_low = x <= low if low_open else x < low
    too_high = x >= high if high_open else x > high
    if too_low or too_high:
        lb = "(" if low_open else "["
        rb = ")" if high_open else "]"
        _fail(name, value, f"must lie in {lb}{low}, {high}{rb}")
    return x


def check_alpha(alpha: Any) -> float:
    """Returns the Renyi / alpha-divergence order, which must be a finite number > 1.

    alpha = 1 exactly is the KL divergence (the limit of the Renyi divergence); the message says so.
    """
    if alpha is None:
        _fail("alpha", alpha, "must be given for the Renyi and alpha divergences (a number > 1)")
    a = check_finite_scalar("alpha", alpha)
    if a == 1.0:
        _fail("alpha", alpha, "must be > 1", "alpha = 1 is the KL divergence: use divergence 'kl'")
    if a < 1.0:
        _fail("alpha", alpha, "must be > 1")
    return a


def check_int_at_least(name: str, value: Any, low: int) -> int:
    """Returns ``value`` as an int, or raises unless it is an integer >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            _fail(name, value, f"must be an integer >= {low}")
    if int(value) < low:
        _fail(name, value, f"must be an integer >= {low}")
    return int(value)


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """Returns ``value`` if it is one of ``choices``, else raises listing them."""
    choices = list(choices)
    if value not in choices:
        _fail(name, value, "must be one of " + ", ".join(repr(c) for c in choices))
    return value


def check_vector(name: str, value: Any, *, length: int | None = None, positive: bool = False):
    """Returns ``value`` as a 1-D float64 numpy array; checks finiteness, length and sign."""
    arr = np.atleast_1d(np.asarray(value, dtype=np.float64))
    if arr.ndim != 1 or arr.size == 0:
        _fail(name, value, "must be a non-empty 1-D vector of numbers")
    if not np.all(np.isfinite(arr)):
        _fail(name, value, "every entry must be finite")
    if length is not None and arr.size != length:
        _fail(name, value, f"must have length {length}, got {arr.size}")
    if positive and np.any(arr < 0):
        _fail(name, value, "every entry must be >= 0")
    return arr


def check_samples(name: str, samples: Any) -> np.ndarray:
    """Returns samples as a finite 2-D array ``[n, d]`` (a 1-D input becomes ``[n, 1]``)."""
    try:
        arr = np.asarray(samples)
    except Exception as exc:  # noqa: BLE001 - any conversion failure is a bad input
        raise InvalidParameterError(f"{name} could not be converted to an array: {exc}") from exc
    if arr.dtype.kind not in "fiub":
        _fail(name, f"<array of dtype {arr.dtype}>", "must be a numeric array")
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        _fail(name, f"<array of shape {arr.shape}>", "must have shape [n] or [n, d]")
    if arr.shape[0] == 0:
        _fail(name, "<empty array>", "must contain at least one sample")
    bad = ~np.isfinite(arr)
    if bad.any():
        n_bad = int(bad.any(axis=1).sum())
        _fail(
            name,
            f"<array of shape {arr.shape}>",
            f"every sample must be finite; {n_bad} rows contain NaN or inf",
        )
    return arr


def check_same_dim(p: np.ndarray, q: np.ndarray, names: Sequence[str] = ("p_samples", "q_samples")):
    """Raises unless two ``[n, d]`` sample arrays share the dimension d."""
    if p.shape[1] != q.shape[1]:
        raise InvalidParameterError(
            f"{names[0]} has dimension {p.shape[1]} but {names[1]} has dimension {q.shape[1]}: "
            "both must be samples of the same output space"
        )


def check_output_folder(name: str, path: Any):
    """Creates the output folder ``path`` if needed, or raises if it cannot be a folder.

    Checked before any work starts, so a bad ``--out`` fails at once, not after a long run.
    """
    from pathlib import Path

    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        _fail(name, str(path), "must be a folder; a file of that name (or on its path) exists")
    except OSError as exc:
        _fail(name, str(path), f"must be a folder that can be created ({exc.strerror})")
    return folder


def check_key(key: Any) -> jax.Array:
    """A typed PRNG key (``jax.random.key(seed)``), the first argument of every random entry point.

    Raises:
      InvalidParameterError: For anything else (an int seed, a raw uint32 key, None).

    """
    if not (isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)):
        raise InvalidParameterError(
            "key is invalid: must be a typed PRNG key from jax.random.key(seed) (first argument)"
        )
    return key
