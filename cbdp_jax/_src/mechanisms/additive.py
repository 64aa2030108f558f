"""Additive-noise mechanisms: Laplace and Gaussian noise added to a query answer."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from cbdp_jax._src.infra.validation import (
    _fail,
)
from cbdp_jax._src.mechanisms.base import (
    Dataset,
    Mechanism,
    _answer_vector,
    _as_float_tuple,
    _check_points,
    _check_scale,
    _fmt,
    _fmt_param,
)


class _AdditiveNoise(Mechanism):
    """f(D) + noise_scale * Z with Z i.i.d. standard noise per coordinate (Laplace and Gaussian).

    Subclasses are dataclasses with fields ``sensitivity`` and ``query`` and one positive scale
    parameter; they name it in ``_validate`` and provide ``noise_scale`` and ``_standard_noise``.
    """

    def _validate(self, scale_param: str) -> None:
        object.__setattr__(self, scale_param, _check_scale(scale_param, getattr(self, scale_param)))
        object.__setattr__(self, "sensitivity", _as_float_tuple("sensitivity", self.sensitivity))
        if self.query is not None and not callable(self.query):
            _fail("query", self.query, "must be None or a callable dataset -> [dim] answer")

    @property
    def dim(self) -> int:
        """The output dimension, ``len(sensitivity)``."""
        return len(self.sensitivity)

    def _standard_noise(self, key: jax.Array, shape: tuple[int, int], dtype: np.dtype) -> jax.Array:
        raise NotImplementedError

    def _sample(self, key: jax.Array, dataset: Dataset, n: int, dtype: np.dtype) -> jax.Array:
        centre = _answer_vector(dataset, self.query, self.dim, dtype)
        return centre[None, :] + self.noise_scale * self._standard_noise(key, (n, self.dim), dtype)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LaplaceMechanism(_AdditiveNoise):
    """The Laplace mechanism: the query answer plus i.i.d. Laplace noise on each coordinate.

    M(D) = f(D) + Z, Z_i i.i.d. Lap(0, b) with b = 1/epsilon, so the output density is

        p(x) = prod_i (epsilon / 2) exp(-epsilon |x_i - f(D)_i|).

    ``sensitivity`` is the vector v of per-coordinate global sensitivities, |f(D)_i - f(D')_i| <= v_i; it
    fixes ``dim = len(v)`` and the canonical neighbouring pair f(D) = 0, f(D') = v (paper section 5;
    docs/theory/mechanisms.md). With ||v||_1 <= 1 the mechanism is epsilon-DP.

    Attributes:
      epsilon: The privacy parameter, finite and > 0; the noise scale is ``1 / epsilon``.
      sensitivity: The sensitivity vector v, entries finite and >= 0 (a scalar means ``(v,)``).
      query: Optional callable ``dataset -> [dim]`` answer, written with ``jnp`` (it runs under
        ``jax.jit``; the dataset is then a pytree of arrays). When None (the default) the dataset passed
        to :meth:`sample` *is* the query answer f(D), shape ``[dim]`` (a scalar is accepted when
        dim = 1).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> mech = LaplaceMechanism(epsilon=1.0, sensitivity=(1.0, 2.0))
      >>> mech.sample(jax.random.key(0), jnp.zeros(2), 5).shape
      (5, 2)
      >>> mech.noise_scale, mech.family
      (1.0, 'laplace')

    References:
      Chaudhuri et al. (2019), section 5 "Laplace Mechanism" and Table 1.

    """

    epsilon: float
    sensitivity: tuple[float, ...] = (1.0,)
    query: Callable[[Dataset], ArrayLike] | None = None

    family: ClassVar[str] = "laplace"

    def __post_init__(self) -> None:
        self._validate("epsilon")

    @property
    def noise_scale(self) -> float:
        """The Laplace scale b = 1 / epsilon of each noise coordinate."""
        return 1.0 / self.epsilon

    @property
    def label(self) -> str:
        """E.g. ``'Laplace(eps=1, v=(1))'``."""
        return f"Laplace(eps={_fmt_param(self.epsilon)}, v={_fmt(self.sensitivity)})"

    def _standard_noise(self, key: jax.Array, shape: tuple[int, int], dtype: np.dtype) -> jax.Array:
        return jax.random.laplace(key, shape, dtype=dtype)

    def log_density(self, dataset: Dataset, x: ArrayLike) -> jax.Array:
        """sum_i log(epsilon / 2) - epsilon |x_i - f(D)_i|, shape ``[n]``; see the class docstring."""
        x = _check_points(self, x)
        centre = _answer_vector(dataset, self.query, self.dim, x.dtype)
        eps = self.epsilon
        return jnp.sum(jnp.log(eps / 2.0) - eps * jnp.abs(x - centre[None, :]), axis=1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GaussianMechanism(_AdditiveNoise):
    """The Gaussian mechanism: the query answer plus N(0, sigma^2 I) noise.

    M(D) = f(D) + Z, Z ~ N(0, sigma^2 I_d), so the output density is

        p(x) = prod_i (2 pi sigma^2)^(-1/2) exp(-(x_i - f(D)_i)^2 / (2 sigma^2)).

    ``sensitivity`` is the vector v of per-coordinate sensitivities; it fixes ``dim = len(v)`` and the
    canonical pair f(D) = 0, f(D') = v (paper section 5; docs/theory/mechanisms.md).

    Attributes:
      sigma: The noise standard deviation, finite and > 0.
      sensitivity: The sensitivity vector v, entries finite and >= 0.
      query: Optional callable ``dataset -> [dim]``; None means the dataset is the answer f(D) itself.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> mech = GaussianMechanism(sigma=2.0)
      >>> mech.sample(jax.random.key(0), 0.0, 3).shape
      (3, 1)

    References:
      Chaudhuri et al. (2019), section 5 "Gaussian Mechanism" and Table 1.

    """

    sigma: float
    sensitivity: tuple[float, ...] = (1.0,)
    query: Callable[[Dataset], ArrayLike] | None = None

    family: ClassVar[str] = "gaussian"

    def __post_init__(self) -> None:
        self._validate("sigma")

    @property
    def noise_scale(self) -> float:
        """The noise standard deviation sigma."""
        return self.sigma

    @property
    def label(self) -> str:
        """E.g. ``'Gaussian(sigma=1, v=(1))'``."""
        return f"Gaussian(sigma={_fmt_param(self.sigma)}, v={_fmt(self.sensitivity)})"

    def _standard_noise(self, key: jax.Array, shape: tuple[int, int], dtype: np.dtype) -> jax.Array:
        return jax.random.normal(key, shape, dtype=dtype)

    def log_density(self, dataset: Dataset, x: ArrayLike) -> jax.Array:
        """sum_i -log(2 pi sigma^2)/2 - (x_i - f(D)_i)^2 / (2 sigma^2), shape ``[n]``."""
        x = _check_points(self, x)
        centre = _answer_vector(dataset, self.query, self.dim, x.dtype)
        s = self.sigma
        z = (x - centre[None, :]) / s
        return jnp.sum(-0.5 * jnp.log(2.0 * math.pi * s * s) - 0.5 * z * z, axis=1)
