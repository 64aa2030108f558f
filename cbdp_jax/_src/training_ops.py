"""What a step does to one batch, and the record every run shares: the base of the run engine.

:class:`Prepared` is what :func:`~cbdp_jax._src.training_runs.prepare` computes once. The functions
here apply a step to per-example gradients (:func:`apply_step`, with the batch's mask for a step that
takes one), re-seed its state per run (:func:`rekey`), and measure the step's move along the canary's
direction due to one gradient (:func:`lone_response`). Both the engine
(:mod:`~cbdp_jax._src.training_runs`) and the probes (:mod:`~cbdp_jax._src.training_probes`) use them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from cbdp_jax._src.training_problem import cross_entropy
from cbdp_jax._src.validation import InvalidParameterError


class Prepared(NamedTuple):
    """What :func:`prepare` computes once.

    Attributes:
      graphdef: The model's graph.
      params: The shared initial parameters.
      x: The slots' features ``[slots, d]``; the canary's slot is the last.
      y: The slots' labels.
      slot: The canary's slot (``slots - 1``).
      canary_grad: D's slot gradient for a gradient canary, else None (computed from x, y).
      neighbour_grad: D''s slot gradient under replace-one when it is the opposite gradient canary,
        else None (zero-out weighs the slot by 0 on D'; add-remove leaves it out of every batch;
        replace-one with an example computes it from ``x_out``, ``y_out``).
      x_out: D''s slot features under replace-one with a data example, else None.
      y_out: Its label.
      direction: The canary's unit direction in parameter space.
      unit: The update a lone canary makes along it (gradient threat; else 1).
      coordinate: The gradient canary's flat index (-1 for an input canary).
      law_exact: Whether no example's gradient moves that coordinate.
      relation: The neighbouring relation of the runs.
      neighbour_mean: D''s slot along the direction in canary units (0, or -1 for the opposite).
      blind_spots: What this audit cannot see by construction (:class:`BlindSpot` tuples).
      loss: The per-batch loss ``loss(model, x, y)``.

    """

    graphdef: Any
    params: Any
    x: jax.Array
    y: jax.Array
    slot: int
    canary_grad: Any
    direction: Any
    unit: float
    coordinate: int
    law_exact: bool
    neighbour_grad: Any = None
    x_out: Any = None
    y_out: Any = None
    relation: str = "add-remove"
    neighbour_mean: float = 0.0
    blind_spots: tuple = ()
    loss: Any = cross_entropy


def example_loss(loss, graphdef, params, x, y):
    """The loss of one example (x ``[d]``, y ``[...]``), as a batch of one."""
    return jnp.sum(loss(nnx.merge(graphdef, params), x[None], y[None]))


def per_example_grads(loss, graphdef, params, x, y):
    """Per-example gradients ``[b, ...]`` of the loss at ``params``."""
    grad = jax.grad(example_loss, argnums=2)
    return jax.vmap(grad, in_axes=(None, None, None, 0, 0))(loss, graphdef, params, x, y)


def tree_dot(a, b) -> jax.Array:
    """The inner product of two pytrees of the same structure."""
    return sum(jnp.vdot(u, v) for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def rekey(state, key: jax.Array):
    """Every typed PRNG key in ``state`` replaced by one split from ``key``."""
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(key, max(len(leaves), 1))
    is_key = lambda a: jnp.issubdtype(getattr(a, "dtype", None), jax.dtypes.prng_key)
    out = [k if is_key(a) else a for a, k in zip(leaves, keys, strict=False)]
    return jax.tree.unflatten(treedef, out)


def apply_step(tx, grads, state, params, mask):
    """``tx.update`` on per-example gradients; an extra-args step also gets ``batch_mask=mask``."""
    if isinstance(tx, optax.GradientTransformationExtraArgs):
        return tx.update(grads, state, params, batch_mask=mask)
    return tx.update(grads, state, params)


def _check_keys(state) -> None:
    raw = [a for a in jax.tree.leaves(state) if getattr(a, "dtype", None) == jnp.uint32]
    if raw:
        raise InvalidParameterError(
            "step is invalid: its state holds raw uint32 keys, which a training audit cannot "
            "re-seed per run (every run would draw the same noise); use jax.random.key"
        )


def lone_response(tx, params, direction, grad, capacity: int, others=None) -> float:
    """The step's move along ``direction`` due to ``grad`` in slot 0 (same state and noise twice).

    ``others`` (a gradient pytree) fills slots 1 .. k of the batch on both applications; the
    batch's mask holds slot 0 and those.
    """
    state = rekey(tx.init(params), jax.random.key(0))
    zeros = jax.tree.map(lambda p: jnp.zeros((capacity, *p.shape), p.dtype), params)
    k = 0 if others is None else others[0]
    base = zeros if others is None else jax.tree.map(
        lambda z, g: z.at[1 : k + 1].set(g), zeros, others[1]
    )  # fmt: skip
    mask = jnp.arange(capacity) <= k
    with_grad = jax.tree.map(lambda z, g: z.at[0].set(g), base, grad)
    u1, _ = apply_step(tx, with_grad, state, params, mask)
    u0, _ = apply_step(tx, base, state, params, mask)
    return float(tree_dot(jax.tree.map(jnp.subtract, u1, u0), direction))


def slot_batch(prep: Prepared, idx: jax.Array, present):
    """A batch's inputs, with the canary's slot as each side holds it: ``(x, y, is_slot, on_d)``.

    ``present`` > 0 is D. Under replace-one with a data example, D''s slot holds ``x_out, y_out``;
    otherwise the slot's row is the data's (a fixed gradient, if any, replaces its loss's later).
    """
    on_d = present > 0
    is_slot = idx == prep.slot
    x, y = prep.x[idx], prep.y[idx]
    if prep.x_out is not None:  # replace-one: D''s slot holds the replaced example
        out = is_slot & ~on_d
        x = jnp.where(out.reshape((-1,) + (1,) * prep.x_out.ndim), prep.x_out[None], x)
        y = jnp.where(out.reshape((-1,) + (1,) * prep.y_out.ndim), prep.y_out[None], y)
    return x, y, is_slot, on_d
