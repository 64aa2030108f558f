"""What a step does to one batch, and the record every run shares: the base of the run engine.

:class:`Prepared` is what :func:`~cbdp_jax._src.training_auditor.prepare.prepare` computes once. The functions
here apply a step to per-example gradients (:func:`apply_step`, with the batch's mask for a step that
takes one), re-seed its state per run (:func:`rekey`), and measure the step's move along the canary's
direction due to one gradient (:func:`lone_response`). Both the engine
(:mod:`~cbdp_jax._src.training_auditor.runs`) and the probes (:mod:`~cbdp_jax._src.training_auditor.probes`) use them.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from cbdp_jax._src.infra.programs import quick_options
from cbdp_jax._src.training_auditor.problem import cross_entropy


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
      raw_keys: Which leaves of the step's state are raw uint32 keys (:func:`raw_key_leaves`),
        re-seeded per run like typed keys.
      defects: What the step's noise does that the accountant does not assume (:class:`Defect`
        tuples, :mod:`~cbdp_jax._src.training_auditor.noise_probes`).

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
    raw_keys: tuple = ()
    defects: tuple = ()


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


def rekey(state, key: jax.Array, raw: tuple[bool, ...] = ()):
    """Every PRNG key in ``state`` replaced by one split from ``key``.

    Typed keys are always replaced; ``raw`` (one bool per leaf of ``state``, from
    :func:`raw_key_leaves`; empty: none) marks the raw uint32 keys, whose data is replaced by a key's
    data of the same shape.
    """
    count = max(len(jax.tree.leaves(state)), 1)
    return rekey_with(state, jax.random.split(key, count), raw)


def rekey_with(state, keys: jax.Array, raw: tuple[bool, ...] = ()):
    """:func:`rekey` with the leaves' keys given (``keys [leaves]``: leaf i's key is ``keys[i]``)."""
    leaves, treedef = jax.tree.flatten(state)
    raw = tuple(raw) + (False,) * (len(leaves) - len(raw))
    out = [_fresh(a, keys[i], r) for i, (a, r) in enumerate(zip(leaves, raw, strict=False))]
    return jax.tree.unflatten(treedef, out)


def _fresh(leaf, key, raw: bool):
    if jnp.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key):
        return key if jnp.shape(leaf) == () else jax.random.split(key, jnp.shape(leaf))
    if raw:
        shape = jnp.shape(leaf)[:-1]
        return jax.random.key_data(key if shape == () else jax.random.split(key, shape))
    return leaf


def _key_size() -> int:
    """The trailing size of the default PRNG implementation's raw key data (2 for threefry)."""
    return int(jax.random.key_data(jax.random.key(0)).shape[-1])


def raw_key_leaves(tx, params, capacity: int) -> tuple[bool, ...]:
    """Which leaves of ``tx.init(params)`` are raw keys (``jax.random.PRNGKey``), by the rule below.

    A leaf is a raw key when (1) it is uint32 with a trailing dimension of the default PRNG's key
    data (2 for threefry), (2) the step's update of zero gradients changes when that data is
    replaced by another key's, and (3) one step does not advance it like a counter: its new value is
    either the old one (a reused key, which the noise probes then name) or differs from it by more
    than 2^16 in some entry (a split key is pseudo-random; a counter moves by a few). A uint32
    scalar, a [2] counter the update does not read, and a [2] counter it reads and increments are
    not keys, and are left as they are: re-seeding them would change what the step computes.
    """
    state = tx.init(params)
    leaves = jax.tree.leaves(state)
    size = _key_size()
    out = []
    for i, leaf in enumerate(leaves):
        shape = jnp.shape(leaf)
        if getattr(leaf, "dtype", None) != jnp.uint32 or not shape or shape[-1] != size:
            out.append(False)
            continue
        out.append(_acts_as_key(tx, params, state, i, capacity))
    return tuple(out)


def _acts_as_key(tx, params, state, i: int, capacity: int) -> bool:
    """Rules (2) and (3) of :func:`raw_key_leaves` for leaf ``i`` of ``state``."""
    leaves, treedef = jax.tree.flatten(state)
    zeros = jax.tree.map(lambda p: jnp.zeros((capacity, *p.shape), p.dtype), params)
    mask = jnp.ones(capacity, bool)
    shape = jnp.shape(leaves[i])[:-1]

    def with_data(seed):
        data = jax.random.key_data(jax.random.split(jax.random.key(seed), shape))
        return jax.tree.unflatten(treedef, [*leaves[:i], data, *leaves[i + 1 :]])

    (u1, s1), (u2, _) = (apply_step(tx, zeros, with_data(s), params, mask) for s in (11, 12))
    flat = lambda t: jnp.concatenate([jnp.ravel(a) for a in jax.tree.leaves(t)] or [jnp.zeros(0)])
    if bool(jnp.all(flat(u1) == flat(u2))):
        return False
    old = np.asarray(jax.tree.leaves(with_data(11))[i], np.int64)
    step = np.asarray(jax.tree.leaves(s1)[i], np.int64) - old
    counter = bool(np.all((step >= 0) & (step <= 2**16))) and bool(np.any(step > 0))
    return not counter


def apply_step(tx, grads, state, params, mask):
    """``tx.update`` on per-example gradients; an extra-args step also gets ``batch_mask=mask``."""
    if isinstance(tx, optax.GradientTransformationExtraArgs):
        return tx.update(grads, state, params, batch_mask=mask)
    return tx.update(grads, state, params)


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
    return float(_response_program(tx)(base, grad, state, params, direction, mask))


@functools.lru_cache(maxsize=16)
def _response_program(tx):
    """:func:`lone_response`'s arithmetic as one program per step, compiled once (not op by op)."""

    def response(base, grad, state, params, direction, mask):
        with_grad = jax.tree.map(lambda z, g: z.at[0].set(g), base, grad)
        u1, _ = apply_step(tx, with_grad, state, params, mask)
        u0, _ = apply_step(tx, base, state, params, mask)
        return tree_dot(jax.tree.map(jnp.subtract, u1, u0), direction)

    return jax.jit(response, compiler_options=quick_options())  # run once, for milliseconds


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
