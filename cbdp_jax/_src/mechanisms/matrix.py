"""The matrix mechanism: a workload answered through a strategy matrix with Laplace or Gaussian noise."""

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
    check_positive,
)
from cbdp_jax._src.mechanisms.base import (
    Dataset,
    Mechanism,
    _as_matrix,
    _check_points,
    _matrix_tuple,
    _no_density,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MatrixMechanism(Mechanism):
    """The matrix mechanism for a workload W with strategy A (paper section 5, Thm 5).

        M_A(W, x, epsilon) = W A^+ (A x + ||A||_1 Z),   Z_j i.i.d. Lap(0, 1/epsilon), j = 1..s,

    for a count vector x in R^m (dataset), workload W [d x m], strategy A [s x m] of rank m (so
    W A^+ A = W and the mean is W x), and ||A||_1 the largest column L1 norm of A (the L1 sensitivity of
    x -> A x when one record is added). Outputs are in R^d with covariance
    2 (||A||_1 / epsilon)^2 (W A^+)(W A^+)^T. It is epsilon-DP and, by post-processing the s-dimensional
    Laplace mechanism, (lin, Renyi) private with parameter <= log(1 + 2^(s(alpha-1)) epsilon^alpha) /
    (alpha - 1). Canonical pair: x = 0 vs x = e_0 (one record of type 0 added).

    A log density exists when W A^+ is square and invertible (then the output is an invertible linear
    image of the Laplace vector); otherwise the law lives on a subspace and ``log_density`` raises.

    Attributes:
      workload: W, shape ``[d, m]`` (stored as a tuple of row tuples).
      strategy: A, shape ``[s, m]`` with rank m (stored as a tuple of row tuples).
      epsilon: The privacy parameter, finite and > 0.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> mm = MatrixMechanism(workload=[[1, 1, 0], [0, 1, 1]],
      ...                      strategy=[[1, 1, 1], [1, 0, 0], [0, 1, 0], [0, 0, 1]], epsilon=1.0)
      >>> mm.dim, mm.noise_dim, mm.domain_size, mm.strategy_norm
      (2, 4, 3, 2.0)
      >>> mm.sample(jax.random.key(0), jnp.array([3.0, 1.0, 2.0]), 10).shape
      (10, 2)

    References:
      Chaudhuri et al. (2019), section 5 "Matrix Mechanism", Theorem 5; Li et al., "The matrix mechanism:
      optimizing linear counting queries under differential privacy", VLDB Journal 2015.

    """

    workload: tuple[tuple[float, ...], ...]
    strategy: tuple[tuple[float, ...], ...]
    epsilon: float

    family: ClassVar[str] = "matrix"

    def __post_init__(self) -> None:
        w = _as_matrix("workload", self.workload)
        a = _as_matrix("strategy", self.strategy)
        if a.shape[1] != w.shape[1]:
            _fail(
                "strategy",
                f"<matrix of shape {a.shape}>",
                f"must have as many columns as the workload ({w.shape[1]}): A is [s, m], W is [d, m]",
            )
        rank = int(np.linalg.matrix_rank(a))
        if rank != a.shape[1]:
            _fail(
                "strategy",
                f"<matrix of shape {a.shape}>",
                f"must have full column rank m = {a.shape[1]}, got rank {rank}",
                "then W A^+ A = W; add rows so that every count is identifiable",
            )
        object.__setattr__(self, "workload", _matrix_tuple(w))
        object.__setattr__(self, "strategy", _matrix_tuple(a))
        object.__setattr__(self, "epsilon", check_positive("epsilon", self.epsilon))

    @property
    def workload_matrix(self) -> np.ndarray:
        """W as a float64 array ``[d, m]``."""
        return np.asarray(self.workload, dtype=np.float64)

    @property
    def strategy_matrix(self) -> np.ndarray:
        """A as a float64 array ``[s, m]``."""
        return np.asarray(self.strategy, dtype=np.float64)

    @property
    def reconstruction(self) -> np.ndarray:
        """W A^+, shape ``[d, s]``: the linear map applied to the noisy strategy answers."""
        return self.workload_matrix @ np.linalg.pinv(self.strategy_matrix)

    @property
    def strategy_norm(self) -> float:
        """||A||_1, the largest column L1 norm of A."""
        return float(np.max(np.sum(np.abs(self.strategy_matrix), axis=0)))

    @property
    def noise_scale(self) -> float:
        """||A||_1 / epsilon, the Laplace scale of each of the s noise coordinates."""
        return self.strategy_norm / self.epsilon

    @property
    def dim(self) -> int:
        """d, the number of workload queries."""
        return len(self.workload)

    @property
    def noise_dim(self) -> int:
        """s, the number of strategy queries (noise coordinates)."""
        return len(self.strategy)

    @property
    def domain_size(self) -> int:
        """m, the length of the count vector."""
        return len(self.strategy[0])

    @property
    def label(self) -> str:
        """E.g. ``'Matrix(eps=1, d=2, s=4, m=3)'``."""
        return (
            f"Matrix(eps={self.epsilon:g}, d={self.dim}, s={self.noise_dim}, m={self.domain_size})"
        )

    def _counts(self, dataset: Dataset, dtype: np.dtype) -> jax.Array:
        x = jnp.asarray(dataset)
        if x.shape != (self.domain_size,):
            _fail(
                "dataset",
                f"<array of shape {x.shape}>",
                f"must be a count vector of shape ({self.domain_size},)",
            )
        return x.astype(dtype)

    def _sample(self, key: jax.Array, dataset: Dataset, n: int, dtype: np.dtype) -> jax.Array:
        x = self._counts(dataset, dtype)
        a = jnp.asarray(self.strategy_matrix, dtype=dtype)
        r = jnp.asarray(self.reconstruction, dtype=dtype)
        noise = self.noise_scale * jax.random.laplace(key, (n, self.noise_dim), dtype=dtype)
        return ((a @ x)[None, :] + noise) @ r.T

    def log_density(self, dataset: Dataset, x: ArrayLike) -> jax.Array:
        """Change of variables when R = W A^+ is square and invertible; raises otherwise.

        log p(y) = sum_j log Lap(z_j; 0, ||A||_1 / epsilon) - log |det R|, with z = R^-1 y - A x.
        """
        r = self.reconstruction
        if r.shape[0] != r.shape[1] or np.linalg.cond(r) > 1e12:
            raise _no_density(
                self,
                f"W A^+ has shape {r.shape} and is not invertible, so the output law lives on a "
                "subspace of R^d",
            )
        y = _check_points(self, x)
        counts = self._counts(dataset, y.dtype)
        r_inv = jnp.asarray(np.linalg.inv(r), dtype=y.dtype)
        a = jnp.asarray(self.strategy_matrix, dtype=y.dtype)
        z = y @ r_inv.T - (a @ counts)[None, :]
        b = self.noise_scale
        log_det = float(np.linalg.slogdet(r)[1])
        return jnp.sum(-math.log(2.0 * b) - jnp.abs(z) / b, axis=1) - log_det
