"""The pair an audit certifies: the space of neighbouring datasets, and the search for a worst pair.

A :class:`DatasetSpace` says which datasets exist and which are neighbours (its relation).
:func:`search_pair` screens candidate pairs (the user's, random ones from the space, then a local
search, and optionally :func:`gradient_pair` for a differentiable JAX mechanism) on a small budget of
screening samples (:func:`screen_score`); the audit certifies the best on fresh samples.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable

import jax
import numpy as np

from cbdp_jax._src.infra.validation import InvalidParameterError, check_choice
from cbdp_jax._src.mechanism_auditor import hockey_stick as hs
from cbdp_jax._src.mechanism_auditor.config import AuditConfig
from cbdp_jax._src.mechanism_auditor.loading import AuditMechanism, host_rng

RELATIONS = ("replace-one", "zero-out", "linf")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DatasetSpace:
    """The datasets to search: arrays of ``shape`` with entries in [low, high].

    Attributes:
      shape: The dataset's shape; axis 0 indexes records.
      low: The smallest entry.
      high: The largest entry.
      integer: Entries are integers.
      relation: ``'replace-one'`` (one record differs), ``'zero-out'`` (one record replaced by zeros,
        dp_accounting's ``REPLACE_SPECIAL``) or ``'linf'`` (query-answer vectors: every entry moves
        by at most ``radius``).
      radius: The l-infinity radius for ``'linf'``.

    """

    shape: tuple[int, ...]
    low: float = 0.0
    high: float = 1.0
    integer: bool = False
    relation: str = "replace-one"
    radius: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(s) for s in np.atleast_1d(self.shape)))
        if not self.shape or min(self.shape) < 1:
            raise InvalidParameterError(f"shape={self.shape!r} is invalid: must be positive sizes")
        if not self.high > self.low:
            raise InvalidParameterError(f"high={self.high!r} is invalid: must exceed low")
        check_choice("relation", self.relation, RELATIONS)

    def _value(self, rng: np.random.Generator, size) -> np.ndarray:
        corner = rng.random(size) < 0.5
        x = np.where(
            corner, rng.choice([self.low, self.high], size), rng.uniform(self.low, self.high, size)
        )
        return np.round(x) if self.integer else x

    def neighbour(self, rng: np.random.Generator, d: np.ndarray) -> np.ndarray:
        """A random neighbour of ``d`` under the relation."""
        d2 = d.copy()
        if self.relation == "linf":
            if (
                rng.random() < 0.5
            ):  # the farthest neighbour: every entry moves by radius towards the middle
                step = np.where(d < 0.5 * (self.low + self.high), self.radius, -self.radius)
            else:
                step = self._value(rng, d.shape) - d
            d2 = np.clip(d + np.clip(step, -self.radius, self.radius), self.low, self.high)
            return np.round(d2) if self.integer else d2
        i = rng.integers(d.shape[0])
        if self.relation == "zero-out":
            d2[i] = 0.0
        elif rng.random() < 0.5:  # the farthest record: every entry to the opposite end
            d2[i] = np.where(d[i] > 0.5 * (self.low + self.high), self.low, self.high)
        else:
            d2[i] = self._value(rng, d.shape[1:])
        return d2

    def random_pair(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """A random dataset and a random neighbour of it."""
        d = self._value(rng, self.shape)
        return d, self.neighbour(rng, d)

    def mutate(self, rng: np.random.Generator, pair) -> tuple[np.ndarray, np.ndarray]:
        """A nearby pair: one record (or entry) moved in both datasets, or a new neighbour."""
        d, d2 = (np.asarray(x, np.float64).copy() for x in pair)
        if rng.random() < 0.5:
            return d, self.neighbour(rng, d)
        i = rng.integers(d.shape[0])
        v = self._value(rng, d.shape[1:])
        if self.relation == "linf":
            delta = d2[i] - d[i]
            if np.all(np.abs(delta) == self.radius):  # keep a farthest pair farthest
                delta = np.where(v < 0.5 * (self.low + self.high), self.radius, -self.radius)
            d[i], d2[i] = v, np.clip(v + delta, self.low, self.high)
        elif np.all(d[i] == d2[i]):
            d[i] = d2[i] = v
        else:
            d[i] = v
        return d, d2


def screen_score(mech: AuditMechanism, key: jax.Array, pair, gamma: float, n: int) -> float:
    """Max over directions and cheap critics of (held-out E_gamma estimate) on n samples per side."""
    kp, kq = jax.random.split(key)
    xp, xq = mech.sample(kp, pair[0], n), mech.sample(kq, pair[1], n)
    half = n // 2
    best = -math.inf
    for a, b in ((xp, xq), (xq, xp)):
        for fit in (hs.fit_halfspace, hs.fit_histogram):
            c = fit(a[:half], b[:half], gamma)
            best = max(best, hs._empirical(c.fn(a[half:]), c.fn(b[half:]), gamma))
    return best


def search_pair(
    key: jax.Array,
    mech: AuditMechanism,
    gamma: float,
    config: AuditConfig,
    *,
    space: DatasetSpace | None = None,
    candidates: Iterable | None = None,
) -> tuple[tuple[np.ndarray, np.ndarray], list[dict]]:
    """Screens candidate pairs (user candidates, random, then local search) on screening samples.

    Returns:
      The best pair and every screened pair with its score (in the order screened).

    """
    rng = host_rng(key)
    keys = iter(jax.random.split(jax.random.fold_in(key, 1), 10_000))
    pool = [tuple(np.asarray(x, np.float64) for x in c) for c in (candidates or [])]
    if space is not None:
        pool += [space.random_pair(rng) for _ in range(config.random_pairs)]
    if not pool:
        raise InvalidParameterError(
            "pair=None is invalid: give --d and --d-prime, a dataset space or candidate pairs"
        )
    screened = []

    def score(pair) -> float:
        s = screen_score(mech, next(keys), pair, gamma, config.screen_samples)
        screened.append({"d": pair[0].tolist(), "d_prime": pair[1].tolist(), "score": s})
        return s

    scores = [score(p) for p in pool]
    best_i = int(np.argmax(scores))
    best, best_s = pool[best_i], scores[best_i]
    for _ in range(config.local_steps if space is not None else 0):
        cand = space.mutate(rng, best)
        s = score(cand)
        if s > best_s:
            best, best_s = cand, s
    if config.gradient_steps > 0 and space is not None and mech.runs_in_jax(best[0]):
        cand = gradient_pair(next(keys), mech.fn, best, gamma, space, steps=config.gradient_steps)
        s = score(cand)
        if s > best_s:
            best, best_s = cand, s
    return best, screened


def _project(space: DatasetSpace, d: np.ndarray, d2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Back into the space and the relation: clip, then keep only the most-changed record different."""
    d, d2 = (np.clip(x, space.low, space.high) for x in (d, d2))
    if space.relation == "linf":
        d2 = np.clip(d + np.clip(d2 - d, -space.radius, space.radius), space.low, space.high)
    else:
        gap = np.abs(d2 - d).reshape(d.shape[0], -1).sum(axis=1)
        i = int(np.argmax(gap))
        keep = d2[i].copy() if space.relation == "replace-one" else np.zeros_like(d2[i])
        d2 = d.copy()
        d2[i] = keep
    if space.integer:
        d, d2 = np.round(d), np.round(d2)
    return d, d2


def gradient_pair(
    key: jax.Array, fn: Callable, pair, gamma: float, space: DatasetSpace, *, steps: int = 20,
    n: int = 4096, learning_rate: float = 0.05,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Gradient ascent on (D, D') of mean h(M(D)) - gamma mean h(M(D')) for a differentiable JAX M.

    h = sigmoid((w . x - t) / s) is the half-space critic of the current pair, refitted every step,
    smoothed by the projection's spread s; the noise is reparameterised (the same keys at each step),
    so the gradient flows through the mechanism into the dataset. After each step the pair is projected
    back into the space and the neighbour relation. Mechanisms with zero gradient (argmax, thresholds)
    do not move.
    """
    import jax.numpy as jnp

    d, d2 = (np.asarray(x, np.float64) for x in pair)
    width = (space.high - space.low) * learning_rate
    for k in jax.random.split(key, steps):
        kp, kq = jax.random.split(k)
        xp = np.asarray(fn(kp, jnp.asarray(d, jnp.float32), n), np.float64).reshape(n, -1)
        xq = np.asarray(fn(kq, jnp.asarray(d2, jnp.float32), n), np.float64).reshape(n, -1)
        w_t, t = _critic_plane(xp, xq, gamma)
        spread = float(np.std(xp @ w_t)) + 1e-6

        def objective(a, b, w_t=w_t, t=t, spread=spread, kp=kp, kq=kq):
            hp = jax.nn.sigmoid((fn(kp, a, n).reshape(n, -1) @ w_t - t) / spread)
            hq = jax.nn.sigmoid((fn(kq, b, n).reshape(n, -1) @ w_t - t) / spread)
            return jnp.mean(hp) - gamma * jnp.mean(hq)

        ga, gb = jax.grad(objective, argnums=(0, 1))(
            jnp.asarray(d, jnp.float32), jnp.asarray(d2, jnp.float32)
        )
        step = lambda g: width * np.sign(np.asarray(g, np.float64))
        d, d2 = _project(space, d + step(ga), d2 + step(gb))
    return d, d2


def _critic_plane(xp: np.ndarray, xq: np.ndarray, gamma: float) -> tuple[np.ndarray, float]:
    """The half-space critic's (w, t) for the current samples (mean-difference direction if none)."""
    best = (-math.inf, hs._directions(xp, xq)[0], 0.0)
    for w in hs._directions(xp, xq):
        t, val = hs._best_threshold(xp @ w, xq @ w, gamma)
        if val > best[0] and math.isfinite(t):
            best = (val, w, t)
    return best[1], best[2]
