"""The Poisson-subsampled Gaussian mechanism (one step of DP-SGD's sum), and the pair uniforms.

The pair uniforms (:func:`pair_uniforms`, :func:`canonical_pair_from_uniforms`) are what the sweep
draws once and turns into Laplace or Gaussian samples of both sides of a pair.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from cbdp_jax._src.infra.validation import (
    _fail,
    check_choice,
    check_in_range,
    check_positive,
)
from cbdp_jax._src.mechanisms.additive import GaussianMechanism, LaplaceMechanism
from cbdp_jax._src.mechanisms.base import (
    Dataset,
    Mechanism,
    _as_float_tuple,
    _check_points,
    _fmt,
    _no_density,
)

_MAX_SUBSET_RECORDS = 12  # log_density enumerates the 2^m subsets of the records


def pair_uniforms(key: jax.Array, n: int, dim: int, dtype) -> jax.Array:
    """Uniforms on (-1, 1) for ``n`` samples of each side of a canonical pair, ``[2, n, dim]``.

    ``jax.random.laplace`` and ``jax.random.normal`` transform exactly these uniforms, so
    :func:`canonical_pair_from_uniforms` gives their noise for the same key, and one draw serves a batch
    that mixes the two families (the sweep's members share a program across families this way).
    """
    dt = jnp.dtype(dtype)
    lo = np.nextafter(np.array(-1.0, dt), np.array(0.0, dt))
    return jax.random.uniform(key, (2, n, dim), dt, lo, 1.0)


def canonical_pair_from_uniforms(
    u: jax.Array, *, family: str, noise_scale, sensitivity, gaussian=None
) -> jax.Array:
    """Samples of P = M(0) and Q = M(v) of an additive-noise mechanism, ``[2, n, d]``, from uniforms.

    Laplace noise is sign(u) log(1 - |u|) (scale 1), Gaussian noise sqrt(2) erfinv(u); both are scaled by
    ``noise_scale`` (1 / epsilon or sigma) and Q is shifted by the sensitivity vector v. Traceable in
    every argument but ``family``.

    Args:
      u: Uniforms from :func:`pair_uniforms`, ``[2, n, d]``.
      family: ``'laplace'``, ``'gaussian'``, or ``'mixed'`` (then ``gaussian`` picks per call).
      noise_scale: The noise scale, a scalar (traced or concrete).
      sensitivity: The shift v, ``[d]``.
      gaussian: For ``family='mixed'``: a boolean scalar, True for Gaussian noise.

    Returns:
      ``[2, n, d]``: index 0 samples P, index 1 samples Q.

    """
    dt = u.dtype
    laplace = lambda: jnp.sign(u) * jnp.log1p(-jnp.abs(u))  # noqa: E731
    normal = lambda: np.sqrt(2.0).astype(dt) * jax.lax.erf_inv(u)  # noqa: E731
    if family == "laplace":
        noise = laplace()
    elif family == "gaussian":
        noise = normal()
    else:
        noise = jnp.where(gaussian, normal(), laplace())
    v = jnp.asarray(sensitivity).astype(dt)
    centres = jnp.stack([jnp.zeros_like(v), v])
    return centres[:, None, :] + jnp.asarray(noise_scale).astype(dt) * noise


# The noise parameter is a pytree leaf (an array under jit / vmap / grad); the sensitivity fixes the
# output dimension and the query is code, so both are static. ``jax.vmap`` over an array of epsilons or
# sigmas therefore runs one compiled program (README: "vmap over mechanism parameters").
jax.tree_util.register_dataclass(
    LaplaceMechanism, data_fields=["epsilon"], meta_fields=["sensitivity", "query"]
)
jax.tree_util.register_dataclass(
    GaussianMechanism, data_fields=["sigma"], meta_fields=["sensitivity", "query"]
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SubsampledGaussianMechanism(Mechanism):
    """One step of DP-SGD: a Poisson-sampled sum of the records' contributions plus Gaussian noise.

    The dataset is the array ``x [m, dim]`` of the m records' (clipped) contributions, m >= 0. Each
    record enters independently with probability q, and M(D) = sum_i B_i x_i + Z with B_i ~
    Bernoulli(q) i.i.d. and Z ~ N(0, sigma^2 I), so the output density is the 2^m-component mixture

        p(y) = sum_{S subset of [m]} q^|S| (1 - q)^(m - |S|) N(y; sum_{i in S} x_i, sigma^2 I).

    The canonical pair is one record with contribution v (``sensitivity``) against none. Direction
    ``'remove'`` (D' = D without the record): P = M([v]) = (1 - q) N(0, sigma^2 I) + q N(v, sigma^2 I)
    and Q = M([]) = N(0, sigma^2 I); ``'add'`` swaps them. With ||v||_2 = 1 (the clipping norm) sigma is
    DP-SGD's noise multiplier (docs/theory/subsampled_gaussian.md).

    Attributes:
      sigma: The noise standard deviation, finite and > 0.
      sampling_rate: The Poisson sampling rate q in (0, 1] (q = 1 is the plain Gaussian mechanism).
      sensitivity: The record's contribution v, entries finite and >= 0.
      direction: ``'remove'`` or ``'add'``: which of the two laws is P in :func:`canonical_pair`.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> mech = SubsampledGaussianMechanism(sigma=1.0, sampling_rate=0.01)
      >>> mech.sample(jax.random.key(0), jnp.ones((3, 1)), 4).shape
      (4, 1)

    References:
      Abadi et al., "Deep Learning with Differential Privacy", CCS 2016 (DP-SGD); Mironov, Talwar,
      Zhang, "Renyi Differential Privacy of the Sampled Gaussian Mechanism", 2019.

    """

    sigma: float
    sampling_rate: float
    sensitivity: tuple[float, ...] = (1.0,)
    direction: str = "remove"

    family: ClassVar[str] = "subsampled_gaussian"

    def __post_init__(self) -> None:
        object.__setattr__(self, "sigma", check_positive("sigma", self.sigma))
        rate = check_in_range("sampling_rate", self.sampling_rate, 0.0, 1.0, low_open=True)
        object.__setattr__(self, "sampling_rate", rate)
        object.__setattr__(self, "sensitivity", _as_float_tuple("sensitivity", self.sensitivity))
        check_choice("direction", self.direction, ("remove", "add"))

    @property
    def dim(self) -> int:
        """The output dimension, ``len(sensitivity)``."""
        return len(self.sensitivity)

    @property
    def noise_scale(self) -> float:
        """The noise standard deviation sigma."""
        return self.sigma

    @property
    def label(self) -> str:
        """E.g. ``'SubsampledGaussian(sigma=1, q=0.01, v=(1), remove)'``."""
        return (
            f"SubsampledGaussian(sigma={self.sigma:g}, q={self.sampling_rate:g}, "
            f"v={_fmt(self.sensitivity)}, {self.direction})"
        )

    def _records(self, dataset: Dataset, dtype: np.dtype) -> jax.Array:
        x = jnp.asarray(dataset)
        if not jnp.issubdtype(x.dtype, jnp.floating):
            x = x.astype(jnp.result_type(float))
        if x.ndim != 2 or x.shape[1] != self.dim:
            _fail(
                "dataset",
                f"<array of shape {x.shape}>",
                f"must be the records' contributions, shape [m, {self.dim}] (m >= 0)",
            )
        return x.astype(dtype)

    def _sample(self, key: jax.Array, dataset: Dataset, n: int, dtype: np.dtype) -> jax.Array:
        x = self._records(dataset, dtype)
        k_sel, k_noise = jax.random.split(key)
        chosen = jax.random.bernoulli(k_sel, self.sampling_rate, (n, x.shape[0])).astype(dtype)
        noise = jax.random.normal(k_noise, (n, self.dim), dtype=dtype)
        return chosen @ x + self.sigma * noise

    def log_density(self, dataset: Dataset, x: ArrayLike) -> jax.Array:
        """Log of the 2^m-component mixture density (class docstring), shape ``[n]``; m <= 12."""
        y = _check_points(self, x)
        recs = self._records(dataset, y.dtype)
        m = recs.shape[0]
        if m > _MAX_SUBSET_RECORDS:
            raise _no_density(self, f"the mixture has 2^{m} components (at most 2^12 supported)")
        subsets = np.array(
            [[(s >> i) & 1 for i in range(m)] for s in range(2**m)], dtype=np.float64
        ).reshape(2**m, m)
        sizes = subsets.sum(axis=1)
        q = self.sampling_rate
        log_out = math.log1p(-q) if q < 1.0 else -np.inf
        with np.errstate(invalid="ignore"):
            log_w = np.where(sizes > 0, sizes * math.log(q), 0.0)
            log_w = log_w + np.where(m - sizes > 0, (m - sizes) * log_out, 0.0)
        centres = jnp.asarray(subsets, dtype=y.dtype) @ recs  # [2^m, dim]
        s = self.sigma
        z = (y[:, None, :] - centres[None, :, :]) / s
        comp = jnp.sum(-0.5 * math.log(2.0 * math.pi * s * s) - 0.5 * z * z, axis=2)
        return jax.scipy.special.logsumexp(
            comp + jnp.asarray(log_w, dtype=y.dtype)[None, :], axis=1
        )
