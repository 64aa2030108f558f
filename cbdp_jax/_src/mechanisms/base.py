"""The mechanism interface and the helpers every mechanism shares.

A mechanism is a frozen, hashable dataclass whose docstring states its exact output law and
sensitivity (the package docstring of :mod:`cbdp_jax._src.mechanisms` lists the interface).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from cbdp_jax._src.infra.programs import persistent_jit
from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    _fail,
    check_int_at_least,
    check_positive,
    check_vector,
)

MECHANISM_NAMES = (
    "laplace",
    "gaussian",
    "randomized_response",
    "nonprivate",
    "subsampled_gaussian",
)

Dataset = Any  # a pytree of arrays or Python numbers; its meaning is stated by each mechanism
DTypeLike = Any


def _resolve_dtype(dtype: DTypeLike | None) -> np.dtype:
    """The floating dtype of the samples: float32 by default; float64 only with ``jax_enable_x64``."""
    if dtype is None:
        return np.dtype(np.float32)
    try:
        dt = np.dtype(dtype)
    except TypeError:
        _fail("dtype", dtype, "must be a floating dtype such as jnp.float32 or jnp.float64")
    if not jnp.issubdtype(dt, jnp.floating):
        _fail("dtype", dtype, "must be a floating dtype such as jnp.float32 or jnp.float64")
    if jax.dtypes.canonicalize_dtype(dt) != dt:
        _fail(
            "dtype",
            dtype,
            f"{dt} is not available",
            "enable it with jax.config.update('jax_enable_x64', True) or jax.enable_x64(True)",
        )
    return dt


def _check_n(n: Any) -> int:
    if isinstance(n, jax.core.Tracer):
        _fail("n", "<traced value>", "must be a static Python int >= 1 (it fixes the output shape)")
    return check_int_at_least("n", n, 1)


def _check_key(key: Any) -> None:
    if isinstance(key, (int, np.integer, float)):
        _fail("key", key, "must be a JAX PRNG key", "make one with jax.random.key(seed)")


def _as_float_tuple(name: str, value: Any, *, length: int | None = None) -> tuple[float, ...]:
    return tuple(float(v) for v in check_vector(name, value, length=length, positive=True))


def _as_matrix(name: str, value: Any) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        _fail(name, value, "must be a 2-D matrix of real numbers")
    if arr.ndim != 2 or arr.size == 0:
        _fail(name, f"<array of shape {arr.shape}>", "must be a non-empty 2-D matrix")
    if not np.all(np.isfinite(arr)):
        _fail(name, f"<array of shape {arr.shape}>", "every entry must be finite")
    return arr


def _matrix_tuple(arr: np.ndarray) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(float(v) for v in row) for row in arr)


def _answer_vector(
    dataset: Dataset, query: Callable | None, dim: int, dtype: np.dtype
) -> jax.Array:
    """The query answer ``[dim]`` (the dataset itself when ``query`` is None), cast to ``dtype``."""
    answer = dataset if query is None else query(dataset)
    try:
        answer = jnp.asarray(answer)
    except TypeError as exc:
        name = "dataset" if query is None else "query"
        raise InvalidParameterError(
            f"{name} must give a numeric query answer of shape ({dim},): {exc}"
        ) from exc
    if answer.ndim == 0 and dim == 1:
        answer = answer.reshape(1)
    if answer.shape != (dim,):
        name = "dataset" if query is None else "query(dataset)"
        _fail(
            name,
            f"<array of shape {answer.shape}>",
            f"the query answer must have shape ({dim},), one entry per sensitivity coordinate",
        )
    return answer.astype(dtype)


def _check_points(mechanism: Mechanism, x: ArrayLike) -> jax.Array:
    """Returns ``x`` as a floating ``[n, dim]`` array or raises naming ``x``."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.result_type(float))
    if x.ndim != 2 or x.shape[1] != mechanism.dim:
        _fail(
            "x",
            f"<array of shape {x.shape}>",
            f"must have shape [n, {mechanism.dim}] (points of R^d)",
        )
    return x


def _no_density(mechanism: Mechanism, why: str) -> NotImplementedError:
    return NotImplementedError(f"{mechanism.label} has no log_density: {why}")


def _fmt(values: tuple[float, ...]) -> str:
    return "(" + ", ".join(f"{v:g}" for v in values) + ")"


def _fmt_param(value: Any) -> str:
    """A noise parameter in a label: ``1`` for a float, the array or ``'traced'`` otherwise."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, jax.core.Tracer):
        return "traced"
    return np.array2string(np.asarray(value), precision=4, separator=", ")


def _check_scale(name: str, value: Any) -> Any:
    """A noise parameter, validated where it is concrete and passed through where it is traced.

    A Python or 0-d number becomes a float (finite, > 0). An array (a batch of parameters, e.g. for
    ``jax.vmap``) keeps its type and must be finite and > 0 everywhere. A tracer (the parameter inside a
    user's ``jit`` / ``vmap`` / ``grad``) cannot be checked and is kept as is.
    """
    if isinstance(value, jax.core.Tracer):
        return value
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return check_positive(name, value)  # raises, naming the parameter
    if arr.ndim == 0:
        return check_positive(name, float(arr))
    if not np.all(np.isfinite(arr) & (arr > 0)):
        _fail(name, value, "must be finite and > 0 in every entry")
    return value


def _is_array_tree(dataset: Dataset) -> bool:
    leaves = jax.tree_util.tree_leaves(dataset)
    return all(isinstance(x, (jax.Array, np.ndarray, np.generic, int, float, bool)) for x in leaves)


def _is_hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


@persistent_jit(static_argnames=("mechanism", "n", "dtype"))
def _compiled_sample(
    key: jax.Array, dataset: Dataset, *, mechanism: Mechanism, n: int, dtype: np.dtype
) -> jax.Array:
    return mechanism._sample(key, dataset, n, dtype)


class Mechanism(abc.ABC):
    """A randomized mechanism D -> R^dim (the base of every mechanism in this module).

    Subclasses are frozen, keyword-only dataclasses: hashable value objects whose docstring states the
    exact output law. They implement ``dim`` (a field or a property), ``_sample`` and, where the law has a
    density, ``log_density``.

    Attributes:
      dim: The output dimension d; :meth:`sample` returns ``[n, d]``.
      family: A short name of the noise family (``'laplace'``, ``'gaussian'``, ...); ``'generic'`` here.

    """

    dim: int
    family: ClassVar[str] = "generic"

    @property
    def label(self) -> str:
        """A short human-readable description, e.g. ``'Laplace(eps=1, v=(1))'``."""
        return type(self).__name__

    def sample(
        self, key: jax.Array, dataset: Dataset, n: int, *, dtype: DTypeLike | None = None
    ) -> jax.Array:
        """Draws ``n`` independent outputs of the mechanism run on ``dataset``.

        Pure JAX: the same key gives bit-identical samples, and the call may sit inside ``jax.jit`` or
        ``lax.scan`` with a traced key and dataset (``n`` and ``dtype`` must be static), giving the same
        bits as an eager call. The sampler is compiled once per mechanism value, ``n`` and ``dtype``.

        Args:
          key: A JAX PRNG key (``jax.random.key(seed)``); it is split inside, never stored.
          dataset: The input; its form is stated by each mechanism.
          n: The number of samples, a static Python int >= 1.
          dtype: The floating dtype of the samples; None means float32. float64 needs
            ``jax_enable_x64``.

        Returns:
          The samples, shape ``[n, dim]``, in ``dtype``.

        Raises:
          InvalidParameterError: For a bad ``n``, ``dtype``, ``key`` or a dataset of the wrong shape.

        """
        _check_key(key)
        n = _check_n(n)
        dt = _resolve_dtype(dtype)
        self._check_dataset(dataset)
        # One jax.jit around _sample (the mechanism, n and dtype static) makes eager calls bit-identical
        # to calls inside the caller's jax.jit / lax.scan: XLA rounds fused arithmetic differently from
        # op-by-op execution. Each distinct mechanism value compiles once per (n, dtype).
        if _is_array_tree(dataset) and _is_hashable(self):
            return _compiled_sample(key, dataset, mechanism=self, n=n, dtype=dt)
        return self._sample(key, dataset, n, dt)

    def _check_dataset(self, dataset: Dataset) -> None:
        """Checks that need concrete values, run before tracing (shape checks happen in ``_sample``)."""
        del dataset

    @abc.abstractmethod
    def _sample(self, key: jax.Array, dataset: Dataset, n: int, dtype: np.dtype) -> jax.Array:
        """Draws ``[n, dim]`` samples in ``dtype`` (arguments already validated)."""

    def log_density(self, dataset: Dataset, x: ArrayLike) -> jax.Array:
        """The log density of the output law at each row of ``x``.

        Args:
          dataset: The input, as for :meth:`sample`.
          x: Points, shape ``[n, dim]``.

        Returns:
          ``[n]`` log densities (``-inf`` outside the support).

        Raises:
          NotImplementedError: If the law has no density (a point mass) or it is not implemented.

        """
        raise _no_density(self, "the output law has no known density")
