"""The two laws of a 1-D problem in standardised units: Laplace, Gaussian or a Gaussian mixture."""

from __future__ import annotations

import dataclasses

import numpy as np

from cbdp_jax._src.exact import quadrature as quad


@dataclasses.dataclass(frozen=True)
class _Law1D:
    """The two laws of a 1-D problem in standardised units (hashable: caches key on it).

    ``'laplace'`` / ``'gaussian'``: P = F(0, 1), Q = F(delta, 1). ``'mixture'``: one side is the mixture
    sum_j weights_j N(centres_j, 1) and the other N(0, 1) (P is the mixture when ``mixture_is_p``): the
    Poisson-subsampled Gaussian (two components) and the law of its T-step sum (a binomial mixture).
    ``delta`` is then the largest centre, the problem's length scale.
    """

    family: str
    delta: float
    weights: tuple[float, ...] = ()
    centres: tuple[float, ...] = ()
    mixture_is_p: bool = True

    @property
    def tails(self) -> str:
        """``'laplace'`` (exponential tails) or ``'gaussian'``."""
        return "laplace" if self.family == "laplace" else "gaussian"

    @property
    def kinks(self) -> list[float]:
        return [0.0, self.delta] if self.family == "laplace" else []

    @property
    def grid_centres(self) -> list[float]:
        """Points the uniform panels must cover (at most 6 units apart, so no gap opens)."""
        if self.family != "mixture":
            return [0.0, self.delta]
        top = max(self.centres)
        return [0.0, *np.arange(min(self.centres), top, 6.0).tolist(), top]

    def _log_mixture(self, z: np.ndarray) -> np.ndarray:
        z = np.asarray(z, dtype=np.float64)
        c = np.asarray(self.centres)
        lw = np.log(np.asarray(self.weights))
        terms = lw[None, :] - 0.5 * (z[:, None] - c[None, :]) ** 2
        top = np.max(terms, axis=1)
        return top + np.log(np.sum(np.exp(terms - top[:, None]), axis=1)) - quad._LOG_SQRT_2PI

    def _mixture_score(self, z: np.ndarray, noise: float) -> np.ndarray:
        c = np.asarray(self.centres)
        terms = np.log(np.asarray(self.weights))[None, :] - 0.5 * (z[:, None] - c[None, :]) ** 2
        resp = np.exp(terms - np.max(terms, axis=1, keepdims=True))
        resp /= resp.sum(axis=1, keepdims=True)
        return np.sum(resp * ((z[:, None] - c[None, :]) ** 2 - 1.0), axis=1) / noise

    def scores(self, z: np.ndarray, noise: float) -> tuple[np.ndarray, np.ndarray]:
        """d/ds log p and d/ds log q at x = scale z, s the noise parameter (epsilon or sigma).

        The shift in standardised units moves with s (delta = eps v or v / sigma), and so does the
        scale; both are accounted for by differentiating the density in x at fixed x: Laplace with
        rate eps: (1 - |z - c|) / eps; Gaussian with sigma: ((z - c)^2 - 1) / sigma, averaged over
        the components with their posterior weights for a mixture (docs/theory/calibration.md).
        """
        z = np.asarray(z, dtype=np.float64)
        if self.family == "laplace":
            return (1.0 - np.abs(z)) / noise, (1.0 - np.abs(z - self.delta)) / noise
        if self.family == "gaussian":
            return (z * z - 1.0) / noise, ((z - self.delta) ** 2 - 1.0) / noise
        mix, plain = self._mixture_score(z, noise), (z * z - 1.0) / noise
        return (mix, plain) if self.mixture_is_p else (plain, mix)

    def log_p(self, z: np.ndarray) -> np.ndarray:
        if self.family != "mixture":
            return quad.log_density(self.family, z, 0.0)
        if self.mixture_is_p:
            return self._log_mixture(z)
        return quad.log_density("gaussian", z, 0.0)

    def log_q(self, z: np.ndarray) -> np.ndarray:
        if self.family != "mixture":
            return quad.log_density(self.family, z, self.delta)
        if self.mixture_is_p:
            return quad.log_density("gaussian", z, 0.0)
        return self._log_mixture(z)
