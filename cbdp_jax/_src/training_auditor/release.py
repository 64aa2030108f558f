"""What a threat releases beyond its score: a few parameter coordinates, at every step or at the end.

The accountant of DP-SGD assumes fresh Gaussian noise at every step, independent across steps and
coordinates, on every coordinate. One coordinate's score cannot see a step that breaks this (a step
that draws the same noise at every step looks *more* private by its likelihood ratio). So a run
records more of what its threat releases (docs/theory/training_audit.md, section 10):

* gradient threat (every update released): the update at each of the T steps along k coordinates,
  ``[T, k]`` in units of the lone canary's update: the canary's coordinate first, then up to two
  *dead twins* (coordinates no example's gradient moves, so that under D' they have the canary
  coordinate's law: one in the canary's parameter leaf and one in another leaf where there are),
  then up to three coordinates examples move most;
* white-box threat (final parameters released): the final parameters' move from the initialisation
  along up to four coordinates the input canary's gradient moves most, up to two dead twins and up
  to two coordinates examples move most, ``[1, k]``;
* black-box threat (the canary's loss only): nothing more.

A model with one parameter (``--data worst-case``'s :class:`SingleWeight`) has no twin and nothing
else to record: its release is the canary coordinate alone, ``[T, 1]``.

:func:`release_layout` fixes the coordinates once per problem; :func:`recorder` is the traceable
gather :func:`~cbdp_jax._src.training_auditor.runs.make_run` applies to each step's updates (or to the final
move).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from cbdp_jax._src.training_auditor.ops import Prepared, per_example_grads

ROLES = ("canary", "twin", "moved")
MAX_TWINS, MAX_MOVED, MAX_CANARY = 2, 3, 4


class ReleaseLayout(NamedTuple):
    """The coordinates a run records and what each is (hashable: part of a compiled program's key).

    Attributes:
      kind: ``'updates'`` (every step's update, ``[T, k]``), ``'final'`` (the final move, ``[1, k]``)
        or ``'none'`` (black-box: nothing beyond the score).
      coordinates: The flat parameter indices (``ravel_pytree`` order), canary coordinates first.
      roles: Each coordinate's role: ``'canary'``, ``'twin'`` (no example moves it) or ``'moved'``.
      steps: The rows of one run's release (T for ``'updates'``, 1 for ``'final'``, 0 for none).
      scale: What the updates are divided by (the lone canary's update under the gradient threat).

    """

    kind: str
    coordinates: tuple[int, ...] = ()
    roles: tuple[str, ...] = ()
    steps: int = 0
    scale: float = 1.0

    @property
    def width(self) -> int:
        """k, the coordinates recorded."""
        return len(self.coordinates)

    def columns(self, role: str) -> tuple[int, ...]:
        """The release's columns of one role."""
        return tuple(i for i, r in enumerate(self.roles) if r == role)

    def describe(self) -> str:
        """One line: what a run records."""
        if self.kind == "none":
            return "the score alone (black-box threat)"
        count = {r: len(self.columns(r)) for r in ROLES}
        what = "each step's update" if self.kind == "updates" else "the final parameters' move"
        return (
            f"{what} along {self.width} coordinates: {count['canary']} of the canary, "
            f"{count['twin']} dead twin(s), {count['moved']} moved by examples"
        )


def moved_magnitudes(prep: Prepared) -> np.ndarray:
    """Per flat coordinate, the largest |per-example gradient| of the data (at init and shaken).

    A coordinate at exactly 0 is moved by no example (as ``training_runs._dead_coordinate`` finds
    the canary's); the canary's slot is left out.
    """
    flat, unravel = ravel_pytree(prep.params)
    shaken = unravel(flat + 0.1 * jax.random.normal(jax.random.key(1), flat.shape))
    x, y = prep.x[: prep.slot], prep.y[: prep.slot]

    @jax.jit
    def largest(p):
        g = per_example_grads(prep.loss, prep.graphdef, p, x, y)
        return jnp.max(jnp.abs(jax.vmap(lambda t: ravel_pytree(t)[0])(g)), axis=0)

    return np.asarray(largest(prep.params) + largest(shaken), np.float64)


def _leaf_of(params) -> np.ndarray:
    """Each flat coordinate's leaf index (``ravel_pytree`` order)."""
    sizes = [int(np.size(a)) for a in jax.tree.leaves(params)]
    return np.repeat(np.arange(len(sizes)), sizes)


def _twins(moved: np.ndarray, leaf: np.ndarray, canary: list[int]) -> list[int]:
    """Up to two dead coordinates: the first in the canary's leaf, the first in another leaf."""
    dead = [int(i) for i in np.flatnonzero(moved == 0.0) if int(i) not in canary]
    home = leaf[canary[0]]
    same = [i for i in dead if leaf[i] == home]
    other = [i for i in dead if leaf[i] != home]
    picks = same[:1] + other[:1]
    rest = [i for i in same[1:] if i not in picks]
    return (picks + rest)[:MAX_TWINS]


def release_layout(problem, prep: Prepared) -> ReleaseLayout:
    """The coordinates each run of ``problem`` records (see the module's docstring)."""
    if problem.threat == "black-box":
        return ReleaseLayout("none")
    flat = np.asarray(ravel_pytree(prep.params)[0])
    moved = moved_magnitudes(prep) if flat.size > 1 else np.zeros(1)
    leaf = _leaf_of(prep.params)
    if problem.threat == "gradient":
        canary = [int(prep.coordinate)]
    else:  # the coordinates the input canary's direction weighs most
        weight = np.abs(np.asarray(ravel_pytree(prep.direction)[0]))
        canary = [int(i) for i in np.argsort(-weight, kind="stable")[:MAX_CANARY] if weight[i] > 0]
    weight_all = np.abs(np.asarray(ravel_pytree(prep.direction)[0]))
    twins = _twins(moved + weight_all, leaf, canary) if flat.size > 1 else []
    order = [int(i) for i in np.argsort(-moved, kind="stable") if moved[i] > 0]
    busy = [i for i in order if i not in canary and i not in twins][:MAX_MOVED]
    coords = tuple(canary + twins + busy)
    roles = ("canary",) * len(canary) + ("twin",) * len(twins) + ("moved",) * len(busy)
    if problem.threat == "gradient":
        return ReleaseLayout("updates", coords, roles, problem.steps, float(prep.unit))
    return ReleaseLayout("final", coords, roles, 1, 1.0)


def recorder(layout: ReleaseLayout, params):
    """``take(tree) -> [k]``: the layout's coordinates of a pytree shaped like ``params``, over scale.

    A gather from each coordinate's leaf (no ravel of the whole model per step).
    """
    sizes = [int(np.size(a)) for a in jax.tree.leaves(params)]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    where = [(int(np.searchsorted(starts, c, side="right") - 1), c) for c in layout.coordinates]
    where = [(li, c - int(starts[li])) for li, c in where]
    scale = layout.scale

    def take(tree) -> jax.Array:
        leaves = jax.tree.leaves(tree)
        if not where:
            return jnp.zeros((0,), jnp.float32)
        vals = [jnp.reshape(leaves[li], (-1,))[off] for li, off in where]
        return jnp.stack(vals).astype(jnp.float32) / jnp.float32(scale)

    return take
