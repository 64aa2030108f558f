"""Neighbouring pairs (M, D, D') and the canonical pair of each built-in mechanism."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from cbdp_jax._src.infra import keys
from cbdp_jax._src.infra.validation import (
    _fail,
)
from cbdp_jax._src.mechanisms.additive import GaussianMechanism, LaplaceMechanism
from cbdp_jax._src.mechanisms.base import (
    Dataset,
    DTypeLike,
    Mechanism,
    _check_key,
    _check_n,
    _resolve_dtype,
)
from cbdp_jax._src.mechanisms.combinators import (
    JointRelease,
    Mixture,
    PostProcessed,
    _check_mechanism,
)
from cbdp_jax._src.mechanisms.discrete import NonPrivateRelease, RandomizedResponse
from cbdp_jax._src.mechanisms.matrix import MatrixMechanism
from cbdp_jax._src.mechanisms.subsampled import SubsampledGaussianMechanism


@dataclasses.dataclass(frozen=True, eq=False)
class NeighbouringPair:
    """A mechanism with two neighbouring datasets: P = law of M(D), Q = law of M(D').

    Construction checks (by tracing, without sampling) that the mechanism accepts both datasets.
    Compared and hashed by identity (datasets may be arrays); close over it rather than passing it
    through ``jax.jit`` as an argument.

    Attributes:
      mechanism: The mechanism M.
      dataset: D, whose output law is P.
      neighbour: D', whose output law is Q.

    Examples:
      >>> import jax
      >>> pair = canonical_pair(LaplaceMechanism(epsilon=1.0))
      >>> p, q = pair.sample(jax.random.key(0), 100)
      >>> p.shape, q.shape
      ((100, 1), (100, 1))
      >>> draw = pair.sampler(100)  # a jitted key -> (p, q)
      >>> bool((draw(jax.random.key(0))[0] == p).all())
      True

    """

    mechanism: Mechanism
    dataset: Dataset
    neighbour: Dataset

    def __post_init__(self) -> None:
        _check_mechanism("mechanism", self.mechanism)
        # Shapes only: the key is made inside the abstract trace, so no program runs.
        for d in (self.dataset, self.neighbour):
            jax.eval_shape(lambda d=d: self.mechanism.sample(jax.random.key(0), d, 1))

    @property
    def dim(self) -> int:
        """The mechanism's output dimension."""
        return self.mechanism.dim

    def sample(
        self, key: jax.Array, n: int, *, dtype: DTypeLike | None = None
    ) -> tuple[jax.Array, jax.Array]:
        """Independent draws from P and Q (the key is split in two).

        Args:
          key: A JAX PRNG key.
          n: Samples per side, a static int >= 1.
          dtype: As for :meth:`Mechanism.sample`.

        Returns:
          ``(p_samples, q_samples)``, each ``[n, dim]``.

        """
        _check_key(key)
        k_p, k_q = keys.split(key)
        p = self.mechanism.sample(k_p, self.dataset, n, dtype=dtype)
        q = self.mechanism.sample(k_q, self.neighbour, n, dtype=dtype)
        return p, q

    def sampler(
        self, n: int, *, dtype: DTypeLike | None = None
    ) -> Callable[[jax.Array], tuple[jax.Array, jax.Array]]:
        """A jitted ``key -> (p_samples, q_samples)`` with ``n`` and ``dtype`` fixed.

        Gives the same values as :meth:`sample`; use it inside training loops.
        """
        n = _check_n(n)
        _resolve_dtype(dtype)
        return jax.jit(lambda key: self.sample(key, n, dtype=dtype))

    def swapped(self) -> NeighbouringPair:
        """The pair in the other direction (P and Q exchanged), for divergences that are not symmetric."""
        return NeighbouringPair(self.mechanism, self.neighbour, self.dataset)


def _trees_equal(a: Any, b: Any) -> bool:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    if ta != tb:
        return False
    return all(
        np.shape(x) == np.shape(y) and np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(la, lb, strict=True)
    )


def _canonical_datasets(mechanism: Mechanism) -> tuple[Dataset, Dataset]:
    if isinstance(mechanism, SubsampledGaussianMechanism):
        one = np.asarray(mechanism.sensitivity, dtype=np.float64)[None, :]
        none = np.zeros((0, mechanism.dim))
        return (one, none) if mechanism.direction == "remove" else (none, one)
    if isinstance(mechanism, (LaplaceMechanism, GaussianMechanism, NonPrivateRelease)):
        if mechanism.query is not None:
            _fail(
                "mechanism",
                mechanism.label,
                "has a custom query, so it has no canonical pair",
                "build NeighbouringPair(mechanism, D, D_prime) with your neighbouring datasets",
            )
        return np.zeros(mechanism.dim), np.asarray(mechanism.sensitivity, dtype=np.float64)
    if isinstance(mechanism, RandomizedResponse):
        return 0, 1
    if isinstance(mechanism, MatrixMechanism):
        neighbour = np.zeros(mechanism.domain_size)
        neighbour[0] = 1.0
        return np.zeros(mechanism.domain_size), neighbour
    if isinstance(mechanism, PostProcessed):
        return _canonical_datasets(mechanism.mechanism)
    if isinstance(mechanism, Mixture):
        first = _canonical_datasets(mechanism.first)
        second = _canonical_datasets(mechanism.second)
        if not (_trees_equal(first[0], second[0]) and _trees_equal(first[1], second[1])):
            _fail(
                "mechanism",
                mechanism.label,
                "has components with different canonical pairs",
                "build NeighbouringPair(mechanism, D, D_prime) explicitly",
            )
        return first
    if isinstance(mechanism, JointRelease):
        pairs = [_canonical_datasets(m) for m in mechanism.mechanisms]
        return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
    _fail(
        "mechanism",
        mechanism.label,
        "has no canonical neighbouring pair",
        "build NeighbouringPair(mechanism, D, D_prime) explicitly",
    )
    raise AssertionError  # unreachable


def canonical_pair(mechanism: Mechanism) -> NeighbouringPair:
    """The paper's standard neighbouring pair for a built-in mechanism (docs/theory/mechanisms.md).

    Laplace / Gaussian / NonPrivateRelease: f(D) = zeros(d), f(D') = v (the sensitivity vector; all ones
    by default for NonPrivateRelease). RandomizedResponse: category 0 vs 1. MatrixMechanism: count
    vectors zeros(m) vs e_0. Mixture and PostProcessed: the components' pair (a Mixture's two components
    must agree). JointRelease: the tuples of the components' datasets, every component changing
    (sequential composition). Datasets are float64 numpy arrays (ints for randomized response).

    Args:
      mechanism: A built-in mechanism without a custom ``query``.

    Returns:
      The pair; ``pair.sample(key, n)`` draws from P and Q.

    Raises:
      InvalidParameterError: For a :class:`BlackBox`, a custom query, a Mixture with disagreeing
        components, or anything that is not a built-in mechanism.

    Examples:
      >>> pair = canonical_pair(LaplaceMechanism(epsilon=1.0, sensitivity=(1.0, 2.0)))
      >>> pair.dataset.tolist(), pair.neighbour.tolist()
      ([0.0, 0.0], [1.0, 2.0])

    """
    _check_mechanism("mechanism", mechanism)
    dataset, neighbour = _canonical_datasets(mechanism)
    return NeighbouringPair(mechanism, dataset, neighbour)
