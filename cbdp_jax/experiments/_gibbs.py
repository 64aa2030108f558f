"""Gibbs posteriors on a grid for the On-Average KL experiment (:mod:`.on_average_kl`).

An :class:`Example` is one posterior-sampling problem; on a trapezoid grid of its hypothesis space the
posterior's log density (:func:`_log_posterior`), the KL between two posteriors by quadrature
(:func:`_kl`), the linear class's restricted KL (:func:`_lin_kl`) and draws by inverse CDF
(:func:`_sample_posterior`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Example:
    """One posterior-sampling problem: data law, loss, hypothesis grid, population risk, DP epsilon."""

    name: str
    lo: float
    hi: float
    loss_range: float
    sample: Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]  # -> [..., k]
    loss: Callable[[np.ndarray, np.ndarray], np.ndarray]  # (theta [G], data [..., k]) -> [..., G]
    risk: Callable[[np.ndarray], np.ndarray]  # population risk R(theta) on a grid [G]

    def dp_epsilon(self, gamma: float) -> float:
        """Exponential mechanism: 2 gamma (sup loss - inf loss)."""
        return 2.0 * gamma * self.loss_range


def _grid(ex: Example, size: int) -> tuple[np.ndarray, np.ndarray]:
    theta = np.linspace(ex.lo, ex.hi, size)
    w = np.full(size, theta[1] - theta[0])
    w[0] = w[-1] = 0.5 * (theta[1] - theta[0])
    return theta, w


def _log_posterior(ex: Example, theta: np.ndarray, w: np.ndarray, data: np.ndarray, gamma: float):
    """Normalised log densities [D, G] of A(Z) for datasets ``data`` [D, n, k] (trapezoid weights)."""
    total = np.zeros((data.shape[0], theta.size))
    for i in range(data.shape[1]):
        total += ex.loss(theta[None, :], data[:, i])
    lp = -gamma * total
    lp -= lp.max(axis=1, keepdims=True)
    return lp - np.log(np.exp(lp) @ w)[:, None]


def _kl(lp: np.ndarray, lq: np.ndarray, w: np.ndarray) -> np.ndarray:
    p = np.exp(lp)
    return (p * (lp - lq)) @ w


def _lin_kl(lp: np.ndarray, lq: np.ndarray, theta: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(lin, KL) per row: sup_a a E_P theta - log E_Q exp(a theta), damped Newton (concave in a)."""
    c = 0.5 * (theta[0] + theta[-1])
    u = theta - c
    p, q = np.exp(lp), np.exp(lq)
    mp = (p * u) @ w

    def value(a):
        s = a[:, None] * u[None, :]
        mx = s.max(axis=1, keepdims=True)
        return a * mp - (np.log((q * np.exp(s - mx)) @ w) + mx[:, 0])

    a = np.zeros(lp.shape[0])
    v = value(a)
    for _ in range(100):
        s = a[:, None] * u[None, :]
        t = q * np.exp(s - s.max(axis=1, keepdims=True))
        t /= (t @ w)[:, None]
        mean = (t * u) @ w
        var = np.maximum((t * u * u) @ w - mean**2, 1e-300)
        step = (mp - mean) / var
        size = np.ones_like(a)
        for _ in range(40):
            trial = value(a + size * step)
            ok = trial >= v - 1e-15
            if ok.all():
                break
            size = np.where(ok, size, 0.5 * size)
        a, v = a + size * step, np.maximum(value(a + size * step), v)
        if np.max(np.abs(size * step)) < 1e-10:
            break
    return np.maximum(v, 0.0)


def _sample_posterior(rng, lp: np.ndarray, theta: np.ndarray, w: np.ndarray, n: int) -> np.ndarray:
    """``n`` draws from the grid density exp(lp) [G] by inverse CDF (piecewise-linear CDF)."""
    p = np.exp(lp)
    cdf = np.concatenate([[0.0], np.cumsum(0.5 * (p[1:] + p[:-1]) * np.diff(theta))])
    cdf /= cdf[-1]
    return np.interp(rng.uniform(size=n), cdf, theta)
