"""The canaries of a one-run training audit: m gradient directions or m input examples.

A gradient canary is a fixed per-example gradient ``norm * u_i`` along its own unit direction u_i in
the flat parameter space. Two kinds of directions:

* ``'coordinate'``: u_i is a coordinate that no example's gradient moves (e.g. a first-layer weight
  of an always-blank pixel). The data then add nothing along u_i, and distinct canaries are exactly
  orthogonal: the score of an excluded canary is the step's noise alone.
* ``'dense'``: u_i is a Gaussian vector normalised to norm 1, regenerated from ``fold_in(key, i)``
  whenever it is needed, so no ``[m, P]`` matrix is ever held (memory ``chunk x P``). Distinct
  directions are nearly orthogonal (<u_i, u_j> about 1 / sqrt(P)), so canary i's score also holds
  the other canaries' and the data's moves along u_i: an interference of variance about
  (||data's move||^2 + sum_j hits_j^2 unit^2) / P, reported as the ratio of the excluded scores'
  spread to the noise's alone.

An input canary is an example (x_i, y_i): ``'ood'`` draws features uniform over the data's range
and a uniform label; ``'mislabel'`` copies a random data example and gives it another label.

References:
  Steinke, Nasr, Jagielski 2023, "Privacy auditing with one (1) training run" (Dirac gradient
  canaries, mislabelled input canaries). Nasr et al. 2023, "Tight auditing of differentially
  private machine learning" (gradient canaries).

"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cbdp_jax._src.infra.validation import InvalidParameterError, check_choice
from cbdp_jax._src.training_auditor.ops import per_example_grads

DIRECTIONS = ("auto", "coordinate", "dense")
INPUT_CANARIES = ("ood", "mislabel")


class CanarySet(NamedTuple):
    """The m canaries of one audit (fixed before the coins are drawn; independent of them).

    Attributes:
      kind: ``'gradient'`` or ``'input'``.
      m: The number of canaries.
      directions: ``'coordinate'`` or ``'dense'`` (gradient canaries; ``''`` for input canaries).
      norm: The gradient canaries' l2 norm.
      coords: ``[m]`` int32 flat coordinates (``'coordinate'``), else None.
      key: The typed key the dense directions are regenerated from, else None.
      x: ``[m, d]`` input canaries' features (else None).
      y: ``[m]`` their labels (else None).

    """

    kind: str
    m: int
    directions: str = ""
    norm: float = 0.0
    coords: Any = None
    key: Any = None
    x: Any = None
    y: Any = None


def moved_coordinates(loss, graphdef, params, x, y, *, chunk: int = 128) -> np.ndarray:
    """``[P]`` bool: the coordinates some example's gradient moves, at init or at a perturbed point.

    The points: the initial parameters and three perturbations of them (by 0.1, 1 and 3 times
    independent standard normals), so that a coordinate idle at init only by accident (e.g. the weights into a ReLU unit
    no example activates yet) is counted as moved; what stays is idle by the data's structure (the
    weights of an always-zero feature).
    """
    from jax.flatten_util import ravel_pytree

    flat, unravel = ravel_pytree(params)
    noises = [
        s * jax.random.normal(jax.random.key(i), flat.shape) for i, s in enumerate((0.1, 1, 3))
    ]
    n = x.shape[0]
    pad = -n % chunk
    xs = jnp.concatenate([x, jnp.repeat(x[:1], pad, axis=0)]).reshape(-1, chunk, *x.shape[1:])
    ys = jnp.concatenate([y, jnp.repeat(y[:1], pad, axis=0)]).reshape(-1, chunk, *y.shape[1:])

    @jax.jit
    def largest(p):
        def one(xy):
            g = per_example_grads(loss, graphdef, p, xy[0], xy[1])
            return jnp.max(jnp.abs(jax.vmap(lambda t: ravel_pytree(t)[0])(g)), axis=0)

        return jnp.max(jax.lax.map(one, (xs, ys)), axis=0)

    moved = largest(params) + sum(largest(unravel(flat + e)) for e in noises)
    return np.asarray(moved > 0.0)


def gradient_canaries(
    key, loss, graphdef, params, x, y, m: int, *, norm: float, directions: str = "auto"
) -> CanarySet:
    """Gradient canaries of ``norm``: m dead coordinates when the model has them, else dense.

    ``directions='auto'`` takes coordinates when at least m exist that no example moves, else dense
    random directions; ``'coordinate'`` refuses a model with fewer than m.
    """
    from jax.flatten_util import ravel_pytree

    check_choice("directions", directions, DIRECTIONS)
    if directions == "dense":
        return CanarySet("gradient", m, "dense", float(norm), key=key)
    dead = np.flatnonzero(~moved_coordinates(loss, graphdef, params, x, y))
    if dead.size >= m:
        coords = jnp.asarray(dead[:m], jnp.int32)
        return CanarySet("gradient", m, "coordinate", float(norm), coords=coords)
    if directions == "coordinate":
        size = ravel_pytree(params)[0].size
        raise InvalidParameterError(
            f"canaries={m} is invalid with directions='coordinate': the model has {dead.size} of "
            f"its {size} coordinates that no example moves; use directions='dense' or 'auto'"
        )
    return CanarySet("gradient", m, "dense", float(norm), key=key)


def input_canaries(key, x: np.ndarray, y: np.ndarray, m: int, classes: int, *,
                   kind: str = "ood") -> CanarySet:  # fmt: skip
    """Input canaries: ``'ood'`` or ``'mislabel'``.

    ``'ood'``: uniform features over the data's range and uniform labels; ``'mislabel'``: random
    data examples, each with a uniformly drawn other label.
    """
    check_choice("input canaries", kind, INPUT_CANARIES)
    if classes < 2:
        raise InvalidParameterError(f"classes={classes} is invalid: input canaries need >= 2")
    k_x, k_y = jax.random.split(key)
    x = np.asarray(x, np.float32)
    if kind == "ood":
        lo, hi = x.min(axis=0), x.max(axis=0)
        cx = lo + (hi - lo) * np.asarray(jax.random.uniform(k_x, (m, x.shape[1])))
        cy = np.asarray(jax.random.randint(k_y, (m,), 0, classes))
    else:
        rows = np.asarray(jax.random.randint(k_x, (m,), 0, x.shape[0]))
        shift = np.asarray(jax.random.randint(k_y, (m,), 1, classes))
        cx, cy = x[rows], (np.asarray(y)[rows] + shift) % classes
    return CanarySet("input", m, x=jnp.asarray(cx, jnp.float32), y=jnp.asarray(cy, jnp.int32))


def directions_of(cs: CanarySet, ids: jax.Array, size: int) -> jax.Array:
    """The unit directions ``[k, P]`` of canaries ``ids [k]`` (regenerated, never stored for all m)."""
    if cs.directions == "coordinate":
        return jax.nn.one_hot(cs.coords[ids], size, dtype=jnp.float32)

    def one(i):
        v = jax.random.normal(jax.random.fold_in(cs.key, i), (size,), jnp.float32)
        return v / jnp.linalg.norm(v)

    return jax.vmap(one)(ids)


def project(cs: CanarySet, flat: jax.Array, *, chunk: int = 256) -> jax.Array:
    """``[m]``: <flat, u_i> for every canary, ``chunk`` directions at a time (memory chunk x P)."""
    if cs.directions == "coordinate":
        return flat[cs.coords]
    m = cs.m
    per = min(chunk, m)
    pad = -m % per
    ids = jnp.arange(m + pad, dtype=jnp.int32).reshape(-1, per)
    out = jax.lax.map(lambda i: directions_of(cs, i, flat.size) @ flat, ids)
    return out.reshape(-1)[:m]
