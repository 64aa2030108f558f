"""Mechanisms built from mechanisms: mixtures, joint releases and post-processing."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from cbdp_jax._src.infra.validation import (
    _fail,
    check_in_range,
    check_int_at_least,
)
from cbdp_jax._src.mechanisms.base import (
    Dataset,
    Mechanism,
    _as_matrix,
    _check_points,
    _matrix_tuple,
    _no_density,
)


def _check_mechanism(name: str, value: Any) -> None:
    if not isinstance(value, Mechanism):
        _fail(name, value, "must be a Mechanism (e.g. LaplaceMechanism(epsilon=1.0))")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mixture(Mechanism):
    """A coin-flip mixture: each sample comes from ``first`` w.p. ``weight``, else from ``second``.

    The output law is weight * first(D) + (1 - weight) * second(D), both components run on the same
    dataset; its density is the mixture of the components' densities. For any f-divergence and any class
    H, D_f^H of the mixture is at most weight * D_f^H(first) + (1 - weight) * D_f^H(second) (paper Thm 2,
    convexity; not for Renyi). Canonical pair: the components' (which must agree).

    Attributes:
      first: The mechanism chosen with probability ``weight``.
      second: The mechanism chosen otherwise; must have the same ``dim``.
      weight: The probability lambda in [0, 1] of running ``first``.

    Examples:
      >>> import jax
      >>> from cbdp_jax.mechanisms import GaussianMechanism, LaplaceMechanism
      >>> mix = Mixture(first=LaplaceMechanism(epsilon=1.0), second=GaussianMechanism(sigma=1.0),
      ...               weight=0.3)
      >>> mix.sample(jax.random.key(0), 0.0, 6).shape
      (6, 1)

    References:
      Chaudhuri et al. (2019), Theorem 2 (convexity).

    """

    first: Mechanism
    second: Mechanism
    weight: float

    family: ClassVar[str] = "mixture"

    def __post_init__(self) -> None:
        _check_mechanism("first", self.first)
        _check_mechanism("second", self.second)
        if self.first.dim != self.second.dim:
            _fail(
                "second",
                self.second.label,
                f"must have the same output dimension as first ({self.first.dim}), "
                f"got {self.second.dim}",
            )
        object.__setattr__(self, "weight", check_in_range("weight", self.weight, 0.0, 1.0))

    @property
    def dim(self) -> int:
        """The common output dimension of the two components."""
        return self.first.dim

    @property
    def label(self) -> str:
        """E.g. ``'Mixture(0.3 Laplace(...) + 0.7 Gaussian(...))'``."""
        w = self.weight
        return f"Mixture({w:g} {self.first.label} + {1 - w:g} {self.second.label})"

    def _check_dataset(self, dataset: Dataset) -> None:
        self.first._check_dataset(dataset)
        self.second._check_dataset(dataset)

    def _sample(self, key: jax.Array, dataset: Dataset, n: int, dtype: np.dtype) -> jax.Array:
        k_coin, k_first, k_second = jax.random.split(key, 3)
        a = self.first.sample(k_first, dataset, n, dtype=dtype)
        b = self.second.sample(k_second, dataset, n, dtype=dtype)
        coin = jax.random.bernoulli(k_coin, self.weight, (n,))
        return jnp.where(coin[:, None], a, b)

    def log_density(self, dataset: Dataset, x: ArrayLike) -> jax.Array:
        """logaddexp(log w + log p_first, log(1 - w) + log p_second); raises if a component has none."""
        x = _check_points(self, x)
        lp_first = self.first.log_density(dataset, x)
        lp_second = self.second.log_density(dataset, x)
        w = self.weight
        log_w = math.log(w) if w > 0 else -math.inf
        log_1mw = math.log1p(-w) if w < 1 else -math.inf
        return jnp.logaddexp(log_w + lp_first, log_1mw + lp_second)


@dataclasses.dataclass(frozen=True, kw_only=True)
class JointRelease(Mechanism):
    """The concatenated outputs of independent runs of several mechanisms (non-adaptive composition).

    The dataset is a tuple with one dataset per component, and the output is
    (M_1(D_1), ..., M_k(D_k)) in R^(d_1 + ... + d_k), components independent, so the log density is the
    sum of the components'. Two uses (docs/theory/capacity_bounded_dp.md):

    * sequential composition on the same data (paper Thm 4, eps_1 + eps_2 for H = {h_1 + h_2}): pass the
      same dataset for every component, ``(d, d)``;
    * parallel composition on disjoint data (paper Thm 3, max(eps_1, eps_2)): pass the disjoint parts,
      ``(d_1, d_2)``; a neighbouring dataset then changes only one part.

    Canonical pair: the tuple of the components' canonical datasets vs the tuple of their neighbours,
    i.e. every component changes (the sequential-composition pair).

    Attributes:
      mechanisms: The components, a non-empty tuple (a list is converted).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from cbdp_jax.mechanisms import GaussianMechanism, LaplaceMechanism
      >>> lap, gau = LaplaceMechanism(epsilon=1.0), GaussianMechanism(sigma=1.0)
      >>> joint = JointRelease(mechanisms=(lap, gau))
      >>> d = jnp.zeros(1)
      >>> joint.sample(jax.random.key(0), (d, d), 4).shape  # sequential: same data twice
      (4, 2)
      >>> joint.sample(jax.random.key(0), (jnp.ones(1), d), 4).shape  # parallel: disjoint parts
      (4, 2)
      >>> joint.component_slices
      (slice(0, 1, None), slice(1, 2, None))

    References:
      Chaudhuri et al. (2019), Theorems 3 (parallel) and 4 (sequential composition).

    """

    mechanisms: tuple[Mechanism, ...]

    family: ClassVar[str] = "joint"

    def __post_init__(self) -> None:
        if isinstance(self.mechanisms, Mechanism) or not isinstance(self.mechanisms, (tuple, list)):
            _fail("mechanisms", self.mechanisms, "must be a non-empty tuple of Mechanism objects")
        mechs = tuple(self.mechanisms)
        if not mechs:
            _fail("mechanisms", mechs, "must be a non-empty tuple of Mechanism objects")
        for i, m in enumerate(mechs):
            _check_mechanism(f"mechanisms[{i}]", m)
        object.__setattr__(self, "mechanisms", mechs)

    @property
    def dim(self) -> int:
        """The sum of the components' dimensions."""
        return sum(m.dim for m in self.mechanisms)

    @property
    def component_slices(self) -> tuple[slice, ...]:
        """The column slice of each component's output in the concatenated ``[n, dim]`` samples."""
        out, start = [], 0
        for m in self.mechanisms:
            out.append(slice(start, start + m.dim))
            start += m.dim
        return tuple(out)

    def split(self, x: ArrayLike) -> tuple[jax.Array, ...]:
        """Splits ``[n, dim]`` samples into the components' ``[n, d_i]`` blocks (for h_1(x_1) + h_2(x_2))."""
        x = jnp.asarray(x)
        return tuple(x[..., s] for s in self.component_slices)

    @property
    def label(self) -> str:
        """E.g. ``'Joint(Laplace(...), Gaussian(...))'``."""
        return "Joint(" + ", ".join(m.label for m in self.mechanisms) + ")"

    def _datasets(self, dataset: Dataset) -> tuple:
        k = len(self.mechanisms)
        if not isinstance(dataset, (tuple, list)) or len(dataset) != k:
            got = f"a {type(dataset).__name__}"
            if isinstance(dataset, (tuple, list)):
                got += f" of length {len(dataset)}"
            _fail(
                "dataset",
                f"<{got}>",
                f"must be a tuple of {k} datasets, one per component (pass the same dataset "
                "twice for sequential composition)",
            )
        return tuple(dataset)

    def _check_dataset(self, dataset: Dataset) -> None:
        for m, d in zip(self.mechanisms, self._datasets(dataset), strict=True):
            m._check_dataset(d)

    def _sample(self, key: jax.Array, dataset: Dataset, n: int, dtype: np.dtype) -> jax.Array:
        datasets = self._datasets(dataset)
        keys = jax.random.split(key, len(self.mechanisms))
        parts = [
            m.sample(keys[i], d, n, dtype=dtype)
            for i, (m, d) in enumerate(zip(self.mechanisms, datasets, strict=True))
        ]
        return jnp.concatenate(parts, axis=1)

    def log_density(self, dataset: Dataset, x: ArrayLike) -> jax.Array:
        """The sum of the components' log densities on their slices; raises if one has none."""
        x = _check_points(self, x)
        datasets = self._datasets(dataset)
        total = jnp.zeros(x.shape[0], dtype=x.dtype)
        for m, d, s in zip(self.mechanisms, datasets, self.component_slices, strict=True):
            total = total + m.log_density(d, x[:, s])
        return total


@dataclasses.dataclass(frozen=True)
class _LinearMap:
    """y -> G y applied row-wise (``[n, d_in] -> [n, d_out]``); hashable by the value of G."""

    matrix: tuple[tuple[float, ...], ...]

    def __call__(self, y: jax.Array) -> jax.Array:
        return y @ jnp.asarray(self.matrix, dtype=y.dtype).T


@dataclasses.dataclass(frozen=True, kw_only=True)
class PostProcessed(Mechanism):
    """g(M(D)): a function applied to every output of a mechanism (paper Thm 1, post-processing).

    If i o g lies in H for every g in G and i in I, then g o M is (I, Gamma) private with the parameter of
    M (e.g. G, H, I all linear). The law is the push-forward of M(D) by g; ``log_density`` is not
    implemented. Canonical pair: the inner mechanism's.

    Attributes:
      mechanism: The inner mechanism M.
      fn: The post-processing g, applied row-wise: a jnp-traceable ``[n, mechanism.dim] -> [n, out_dim]``.
      out_dim: The output dimension of g.
      name: A label for g.

    Examples:
      >>> import jax
      >>> from cbdp_jax.mechanisms import LaplaceMechanism
      >>> pp = PostProcessed(mechanism=LaplaceMechanism(epsilon=1.0), fn=lambda y: y**2, out_dim=1)
      >>> pp.sample(jax.random.key(0), 0.0, 3).shape
      (3, 1)

    References:
      Chaudhuri et al. (2019), Theorem 1 (post-processing).

    """

    mechanism: Mechanism
    fn: Callable[[jax.Array], jax.Array]
    out_dim: int
    name: str = "g"

    family: ClassVar[str] = "post_processed"

    def __post_init__(self) -> None:
        _check_mechanism("mechanism", self.mechanism)
        if not callable(self.fn):
            _fail("fn", self.fn, "must be a callable [n, d_in] -> [n, out_dim]")
        object.__setattr__(self, "out_dim", check_int_at_least("out_dim", self.out_dim, 1))

    @property
    def dim(self) -> int:
        """``out_dim``."""
        return self.out_dim

    @property
    def label(self) -> str:
        """E.g. ``'g(Laplace(...))'``."""
        return f"{self.name}({self.mechanism.label})"

    def _check_dataset(self, dataset: Dataset) -> None:
        self.mechanism._check_dataset(dataset)

    def _sample(self, key: jax.Array, dataset: Dataset, n: int, dtype: np.dtype) -> jax.Array:
        y = self.mechanism.sample(key, dataset, n, dtype=dtype)
        z = jnp.asarray(self.fn(y))
        if z.shape != (n, self.out_dim) or not jnp.issubdtype(z.dtype, jnp.floating):
            _fail(
                "fn",
                self.name,
                f"must map [n, {self.mechanism.dim}] to a floating [n, {self.out_dim}] array "
                f"= ({n}, {self.out_dim}); got a {z.dtype} array of shape {z.shape}",
            )
        return z.astype(dtype)

    def log_density(self, dataset: Dataset, x: ArrayLike) -> jax.Array:
        """Always raises: the push-forward density is not implemented."""
        raise _no_density(self, "the density of a post-processed output is not implemented")


def linear_post_processing(mechanism: Mechanism, matrix: ArrayLike) -> PostProcessed:
    """The linear post-processing y -> G y of a mechanism (paper Thm 1 with G linear).

    Args:
      mechanism: The inner mechanism, output dimension d_in.
      matrix: G, shape ``[d_out, d_in]``; each output row y becomes ``G @ y``.

    Returns:
      A :class:`PostProcessed` of dimension d_out, hashable by the value of G.

    Raises:
      InvalidParameterError: If G is not a finite 2-D matrix with ``mechanism.dim`` columns.

    Examples:
      >>> import jax
      >>> from cbdp_jax.mechanisms import LaplaceMechanism
      >>> pp = linear_post_processing(LaplaceMechanism(epsilon=1.0, sensitivity=(1, 1)), [[1.0, -1.0]])
      >>> pp.dim, pp.sample(jax.random.key(0), [0.0, 0.0], 5).shape
      (1, (5, 1))

    """
    _check_mechanism("mechanism", mechanism)
    g = _as_matrix("matrix", matrix)
    if g.shape[1] != mechanism.dim:
        _fail(
            "matrix",
            f"<matrix of shape {g.shape}>",
            f"must have {mechanism.dim} columns (the mechanism's output dimension)",
        )
    return PostProcessed(
        mechanism=mechanism, fn=_LinearMap(_matrix_tuple(g)), out_dim=g.shape[0], name="linear"
    )
