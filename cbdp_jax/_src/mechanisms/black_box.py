"""A mechanism given as any sampling function: :class:`BlackBox`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    _fail,
    check_int_at_least,
)
from cbdp_jax._src.mechanisms.base import Dataset, Mechanism, _check_n


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlackBox(Mechanism):
    """Any user sampler ``(key, dataset, n) -> [n, dim]`` treated as a mechanism with unknown law.

    The sampler must be pure JAX: :meth:`sample` traces it (under ``jax.jit``, with ``n`` static). Its
    output shape and dtype are checked with ``jax.eval_shape`` before it runs (this works with traced
    arguments too): a wrong shape or a non-floating dtype raises naming ``sampler``. The output is cast
    to the requested ``dtype``. There is no density and no canonical pair: build
    :class:`NeighbouringPair` yourself.

    Attributes:
      sampler: The sampler ``(key, dataset, n) -> [n, dim]`` floating array.
      dim: The output dimension.
      name: A label.

    Examples:
      >>> import jax
      >>> bb = BlackBox(sampler=lambda k, d, n: d + jax.random.normal(k, (n, 2)), dim=2)
      >>> bb.sample(jax.random.key(0), 1.0, 3).shape
      (3, 2)

    """

    sampler: Callable[[jax.Array, Dataset, int], jax.Array]
    dim: int
    name: str = "black-box"

    family: ClassVar[str] = "black_box"

    def __post_init__(self) -> None:
        if not callable(self.sampler):
            _fail("sampler", self.sampler, "must be a callable (key, dataset, n) -> [n, dim]")
        object.__setattr__(self, "dim", check_int_at_least("dim", self.dim, 1))

    @property
    def label(self) -> str:
        """The name."""
        return self.name

    def check(self, key: jax.Array, dataset: Dataset, n: int) -> jax.ShapeDtypeStruct:
        """Checks the sampler's output shape and dtype without running it (``jax.eval_shape``).

        Returns:
          The output's ``jax.ShapeDtypeStruct``.

        Raises:
          InvalidParameterError: Naming ``sampler``, with the expected and the actual shape / dtype.

        """
        n = _check_n(n)
        try:
            out = jax.eval_shape(lambda k: self.sampler(k, dataset, n), key)
        except InvalidParameterError:
            raise
        except Exception as exc:  # noqa: BLE001 - report any tracing failure against the sampler
            raise InvalidParameterError(
                f"sampler {self.name!r} failed when traced with (key, dataset, n={n}): {exc}"
            ) from exc
        expected = f"a floating array of shape ({n}, {self.dim})"
        if not isinstance(out, jax.ShapeDtypeStruct):
            _fail("sampler", self.name, f"must return {expected}; got {out!r}")
        if out.shape != (n, self.dim) or not jnp.issubdtype(out.dtype, jnp.floating):
            _fail(
                "sampler",
                self.name,
                f"must return {expected}; got a {out.dtype} array of shape {out.shape}",
            )
        return out

    def _sample(self, key: jax.Array, dataset: Dataset, n: int, dtype: np.dtype) -> jax.Array:
        self.check(key, dataset, n)
        return jnp.asarray(self.sampler(key, dataset, n)).astype(dtype)
