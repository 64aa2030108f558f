"""Releases with atoms: the non-private release and randomized response."""

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
    check_in_range,
    check_int_at_least,
    check_positive,
)
from cbdp_jax._src.mechanisms.base import (
    Dataset,
    Mechanism,
    _answer_vector,
    _as_float_tuple,
    _check_points,
    _no_density,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class NonPrivateRelease(Mechanism):
    """Releases the query answer exactly: the output law is the point mass at f(D).

    Two distinct point masses are infinitely far apart for any class containing linear functions (paper
    Lemma 2), so every estimator should report +inf here. There is no density.

    Attributes:
      dim: The output dimension; defaults to ``len(sensitivity)``, or 1 if neither is given.
      sensitivity: The change v of the answer between the canonical neighbours (default all ones):
        the canonical pair is f(D) = 0, f(D') = v, as for the Laplace and Gaussian mechanisms.
      query: Optional callable ``dataset -> [dim]``; None means the dataset is the answer itself.

    Examples:
      >>> import jax
      >>> NonPrivateRelease(dim=2).sample(jax.random.key(0), [1.0, 2.0], 2).tolist()
      [[1.0, 2.0], [1.0, 2.0]]

    References:
      Chaudhuri et al. (2019), section 5 and Lemma 2 (non-private release).

    """

    dim: int | None = None
    sensitivity: tuple[float, ...] | None = None
    query: Callable[[Dataset], ArrayLike] | None = None

    family: ClassVar[str] = "nonprivate"

    def __post_init__(self) -> None:
        dim = None if self.dim is None else check_int_at_least("dim", self.dim, 1)
        if self.sensitivity is None:
            dim = 1 if dim is None else dim
            sens = (1.0,) * dim
        else:
            sens = _as_float_tuple("sensitivity", self.sensitivity, length=dim)
            dim = len(sens)
        object.__setattr__(self, "dim", dim)
        object.__setattr__(self, "sensitivity", sens)
        if self.query is not None and not callable(self.query):
            _fail("query", self.query, "must be None or a callable dataset -> [dim] answer")

    @property
    def noise_scale(self) -> float:
        """0: no noise is added."""
        return 0.0

    @property
    def label(self) -> str:
        """E.g. ``'NonPrivate(d=1)'``."""
        return f"NonPrivate(d={self.dim})"

    def _sample(self, key: jax.Array, dataset: Dataset, n: int, dtype: np.dtype) -> jax.Array:
        del key
        centre = _answer_vector(dataset, self.query, self.dim, dtype)
        return jnp.broadcast_to(centre[None, :], (n, self.dim))

    def log_density(self, dataset: Dataset, x: ArrayLike) -> jax.Array:
        """Always raises: a point mass has no density."""
        raise _no_density(self, "the output is a point mass (Lebesgue density +inf / 0)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RandomizedResponse(Mechanism):
    """k-ary randomized response, output one-hot.

    The dataset is one category c in {0, ..., k-1}. The mechanism reports c with probability
    p = e^epsilon / (e^epsilon + k - 1) and each of the k - 1 other categories with probability
    q = 1 / (e^epsilon + k - 1), as the one-hot vector in R^k. The log density is with respect to counting
    measure on the k one-hot vertices (``-inf`` elsewhere); it is epsilon-DP, p / q = e^epsilon. Canonical
    pair: c = 0 vs c = 1.

    Attributes:
      epsilon: The privacy parameter, finite and > 0.
      k: The number of categories, an integer >= 2 (also ``dim``).

    Examples:
      >>> import jax
      >>> rr = RandomizedResponse(epsilon=1.0, k=3)
      >>> rr.sample(jax.random.key(0), 2, 4).shape
      (4, 3)
      >>> round(rr.p_true, 6)
      0.576117

    """

    epsilon: float
    k: int = 2

    family: ClassVar[str] = "randomized_response"

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_positive("epsilon", self.epsilon))
        object.__setattr__(self, "k", check_int_at_least("k", self.k, 2))

    @property
    def dim(self) -> int:
        """The number of categories k (the output is one-hot)."""
        return self.k

    @property
    def log_p_true(self) -> float:
        """The log probability of the true category, log p = -log(1 + (k - 1) e^-epsilon)."""
        return -math.log1p((self.k - 1) * math.exp(-self.epsilon))

    @property
    def log_p_other(self) -> float:
        """The log probability of each other category, log q = log p - epsilon."""
        return self.log_p_true - self.epsilon

    @property
    def p_true(self) -> float:
        """The probability of the true category, p = e^epsilon / (e^epsilon + k - 1)."""
        return math.exp(self.log_p_true)

    @property
    def label(self) -> str:
        """E.g. ``'RR(eps=1, k=2)'``."""
        return f"RR(eps={self.epsilon:g}, k={self.k})"

    def _category(self, dataset: Dataset) -> jax.Array:
        c = jnp.asarray(dataset)
        if c.shape != () or not jnp.issubdtype(c.dtype, jnp.integer):
            _fail(
                "dataset",
                f"<{c.dtype} array of shape {c.shape}>",
                f"must be one integer category in [0, {self.k})",
            )
        if not isinstance(c, jax.core.Tracer):
            check_in_range("dataset", int(c), 0, self.k - 1)
        return c.astype(jnp.int32)

    def _check_dataset(self, dataset: Dataset) -> None:
        if not isinstance(dataset, jax.core.Tracer):
            self._category(dataset)

    def _sample(self, key: jax.Array, dataset: Dataset, n: int, dtype: np.dtype) -> jax.Array:
        true = self._category(dataset)
        k_keep, k_other = jax.random.split(key)
        keep = jax.random.bernoulli(k_keep, self.p_true, (n,))
        other = jax.random.randint(k_other, (n,), 0, self.k - 1)
        other = other + (other >= true).astype(
            other.dtype
        )  # uniform over the k - 1 other categories
        report = jnp.where(keep, true, other)
        return jax.nn.one_hot(report, self.k, dtype=dtype)

    def log_density(self, dataset: Dataset, x: ArrayLike) -> jax.Array:
        """Log p at the true one-hot vector, log q at the other vertices, -inf off the vertices."""
        x = _check_points(self, x)
        true = self._category(dataset)
        binary = jnp.all((x == 0) | (x == 1), axis=1)
        one_hot = binary & (jnp.sum(x, axis=1) == 1)
        hit = jnp.take(x, true, axis=1) == 1
        logp = jnp.where(hit, self.log_p_true, self.log_p_other).astype(x.dtype)
        return jnp.where(one_hot, logp, -jnp.inf)
