"""An ensemble of adversaries around the pure core: its state, initialisation and early stopping.

:mod:`cbdp_jax._src.estimator.core` gives the per-adversary functions (``init``, ``step``, ``value``). Here they
are vmapped over an ensemble (parameters stacked along a leading axis): the members' initial states
(with the input standardisation), the masks that keep a member's best parameters, the vmap axes of a
state, :func:`early_stopping_scan` (``lax.scan`` over blocks of optimiser steps, each member keeping
its best validation value without a host round trip), and the padding of training and validation
arrays to buckets of rows, so that one compiled program serves every sample size in a bucket.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cbdp_jax._src.estimator.core import Trainer, TrainState, set_learning_rate
from cbdp_jax._src.infra.programs import persistent_jit


class TrainTrace(NamedTuple):
    """Training curves, one entry per evaluation block.

    Attributes:
      train_value: Training objective of each member at the end of each block, ``[blocks, members]``.
      val_value: Validation objective of each member after each block, ``[blocks, members]``.

    """

    train_value: jax.Array
    val_value: jax.Array


def init_ensemble(keys: jax.Array, trainer: Trainer, x_reference, learning_rate=None) -> TrainState:
    """One :class:`~cbdp_jax._src.estimator.core.TrainState` per key, stacked along a leading axis.

    ``x_reference`` (the sample that fixes the input standardisation) may be an array or a sequence
    of arrays to pool. ``learning_rate`` (the default optimiser's step size) may be set for every
    member at once.
    """
    if learning_rate is not None and trainer.default_optimizer:
        learning_rate = np.float32(learning_rate)
    else:
        learning_rate = None
    return _init_program(keys, x_reference, learning_rate, trainer=trainer)


def standardisation(x_reference, dtype) -> tuple[np.ndarray, np.ndarray]:
    """``(loc, scale)``: the mean and spread of a host sample (or of a sequence of them, pooled).

    What :meth:`~cbdp_jax._src.estimator.core.Trainer.init` computes from ``x_reference`` (a spread of 0
    becomes 1), on the host in float64 from the values in ``dtype``: no program depends on the
    sample's size.
    """
    parts = x_reference if isinstance(x_reference, (tuple, list)) else (x_reference,)
    x = np.concatenate([np.asarray(np.asarray(a), dtype) for a in parts], axis=0)
    loc = np.mean(x, axis=0, dtype=np.float64)
    spread = np.std(x, axis=0, dtype=np.float64)
    return loc.astype(dtype), np.where(spread > 0, spread, 1.0).astype(dtype)


def init_standardised_ensemble(
    keys, trainer: Trainer, loc, scale, learning_rate=None
) -> TrainState:
    """:func:`init_ensemble` with the input standardisation given (:func:`standardisation`)."""
    if learning_rate is not None and trainer.default_optimizer:
        learning_rate = np.float32(learning_rate)
    else:
        learning_rate = None
    return _init_standardised_program(keys, loc, scale, learning_rate, trainer=trainer)


@persistent_jit(static_argnames=("trainer",), quick=True)
def _init_standardised_program(keys, loc, scale, learning_rate, *, trainer: Trainer) -> TrainState:
    """The compiled initialisation from a known standardisation (one program for every sample size)."""
    states = jax.vmap(trainer.init_standardised, in_axes=(0, None, None))(keys, loc, scale)
    if learning_rate is None:
        return states
    lr = jnp.full((keys.shape[0],), learning_rate, jnp.float32)
    return states._replace(opt_state=set_learning_rate(states.opt_state, lr))


@persistent_jit(static_argnames=("trainer",), quick=True)
def _init_program(keys, x_reference, learning_rate, *, trainer: Trainer) -> TrainState:
    """The compiled initialisation (one program, not one per operation of the module's constructor).

    ``x_reference`` may be a sequence of arrays, concatenated along rows inside the program.
    """
    if isinstance(x_reference, (tuple, list)):
        x_reference = jnp.concatenate(x_reference, axis=0)
    states = jax.vmap(trainer.init, in_axes=(0, None))(keys, x_reference)
    if learning_rate is None:
        return states
    lr = jnp.full((keys.shape[0],), learning_rate, jnp.float32)
    return states._replace(opt_state=set_learning_rate(states.opt_state, lr))


@persistent_jit(static_argnames=("graphdef",))
def apply_fn(graphdef, params, rest, x: jax.Array) -> jax.Array:
    """Evaluates one adversary given its split state on ``x`` ``[n, d]`` -> ``[n]``.

    One compiled program per class and shape (called eagerly it would compile every operation of the
    network separately); inside a caller's trace it is inlined.
    """
    return nnx.merge(graphdef, params, rest)(x)


def where_members(mask: jax.Array, new, old):
    """Per member (leading axis), the leaves of ``new`` where ``mask [M]`` holds, else of ``old``."""

    def pick(a, b):
        m = mask.reshape(mask.shape + (1,) * (a.ndim - 1))
        return jnp.where(m, a, b)

    return jax.tree.map(pick, new, old)


def finite_members(tree) -> jax.Array:
    """Whether every entry of every leaf is finite, per member (leading axis): ``[M]`` bool."""
    leaves = [jnp.all(jnp.isfinite(x), axis=tuple(range(1, x.ndim))) for x in jax.tree.leaves(tree)]
    return functools.reduce(jnp.logical_and, leaves)


def early_stopping_scan(
    step: Callable[[Any, Any], tuple[Any, jax.Array]],
    validate: Callable[[Any], jax.Array],
    state: TrainState,
    block_inputs,
    *,
    progress: Callable[[Any], None] | None = None,
    patience: int | None = None,
):
    """Runs blocks of optimiser steps, validating after each block and keeping each member's best.

    ``lax.scan`` over blocks of ``lax.scan`` over steps; everything stays on the device (early stopping
    without a host round trip). A member whose validation value or parameters stop being finite is
    frozen out: its best value and parameters no longer change.

    Args:
      step: ``(state, x) -> (state, train_value [M])`` for the whole ensemble.
      validate: ``state -> [M]`` validation objective.
      state: The ensemble's :class:`~cbdp_jax._src.estimator.core.TrainState` (leading axis = members, M).
      block_inputs: A pytree of per-step inputs ``x``, leaves ``[blocks, steps_per_block, ...]``.
      progress: Optional host callback called with the block index after each block.
      patience: Stop once every member has gone this many validation checks without a new best (or
        stopped being finite); None runs every block. The blocks are then a ``lax.while_loop`` and
        the curves' rows of blocks not run are NaN.

    Returns:
      ``(best_params, best_value [M], finite [M], train_curve [blocks, M], val_curve [blocks, M])``;
      the training curve holds each block's last training value.

    """
    v0 = validate(state)
    v0 = jnp.where(jnp.isfinite(v0), v0, -jnp.inf)

    def inner(carry, x):
        st, _ = carry
        return step(st, x), None

    def block(carry, xs):
        x, index = xs
        st, last, best_p, best_v, finite = carry
        (st, last), _ = jax.lax.scan(inner, (st, last), x)
        v = validate(st)
        finite = finite & jnp.isfinite(v) & finite_members(st.params)
        v = jnp.where(finite, v, -jnp.inf)
        better = v > best_v
        best_p = where_members(better, st.params, best_p)
        best_v = jnp.where(better, v, best_v)
        if progress is not None:
            jax.debug.callback(progress, index)
        return (st, last, best_p, best_v, finite), (last, v)

    blocks = jax.tree.leaves(block_inputs)[0].shape[0]
    carry = (state, v0, state.params, v0, jnp.ones(v0.shape, bool))
    if patience is not None:
        return _patient_blocks(block, carry, block_inputs, blocks, int(patience))
    (*_, best_p, best_v, finite), (train_c, val_c) = jax.lax.scan(
        block, carry, (block_inputs, jnp.arange(blocks))
    )
    return best_p, best_v, finite, train_c, val_c


def _patient_blocks(block, carry, block_inputs, blocks: int, patience: int):
    """:func:`early_stopping_scan`'s blocks in a ``while_loop`` that ends when every member is stale.

    A member is stale after ``patience`` blocks in a row without a new best validation value, or once
    it stopped being finite. Each block runs exactly as in the scan, so the blocks that do run give the
    same states and curves; the best is the best over them.
    """
    _, v0, _, _, _ = carry
    nan = jnp.full((blocks,) + v0.shape, jnp.nan, v0.dtype)

    def more(loop):
        b, inner, since, _, _ = loop
        finite = inner[4]
        return (b < blocks) & jnp.any(finite & (since < patience))

    def run(loop):
        b, inner, since, train_c, val_c = loop
        xs = jax.tree.map(
            lambda a: jax.lax.dynamic_index_in_dim(a, b, keepdims=False), block_inputs
        )
        best_before = inner[3]
        inner, (last, v) = block(inner, (xs, b))
        since = jnp.where(inner[3] > best_before, 0, since + 1)
        return b + 1, inner, since, train_c.at[b].set(last), val_c.at[b].set(v)

    since0 = jnp.zeros(v0.shape, jnp.int32)
    _, (*_, best_p, best_v, finite), _, train_c, val_c = jax.lax.while_loop(
        more, run, (jnp.zeros((), jnp.int32), carry, since0, nan, nan)
    )
    return best_p, best_v, finite, train_c, val_c


def state_axes(trainer: Trainer, state: TrainState) -> TrainState:
    """The ``jax.vmap`` axes of an ensemble's state.

    Per member, except a lockstep optimiser's step count, which is shared (:func:`lockstep_opt_axes`);
    L-BFGS's per-member line-search state is vmapped whole.
    """
    if trainer.line_search:
        return TrainState(0, 0, 0)
    return TrainState(0, 0, lockstep_opt_axes(state.opt_state))


def lockstep_opt_axes(opt_state) -> Any:
    """Axes of a stacked optimiser state with its integer (step count) leaves unbatched."""
    return jax.tree.map(lambda x: None if jnp.issubdtype(x.dtype, jnp.integer) else 0, opt_state)


def shared_counts(opt_state) -> Any:
    """A stacked optimiser state with each integer leaf reduced to one shared entry.

    The members step in lockstep, so their counts are equal; this is the form
    :func:`lockstep_opt_axes` expects.
    """
    return jax.tree.map(lambda x: x[0] if jnp.issubdtype(x.dtype, jnp.integer) else x, opt_state)


# Blocks one training segment can hold (its curves' rows); the host loop never asks for more.
SEGMENT_BLOCKS = 64


# The wall time one compiled training segment aims at: short enough that Ctrl-C lands within about a
# second and a progress display moves, long enough that the host round trip between segments
# (a few hundred microseconds) is noise.
SEGMENT_SECONDS = 0.25


# Row counts of training arrays are rounded up to a bucket (masked rows past the samples) so that one
# compiled training segment serves every sample size in it: powers of two from this many rows.
MIN_BUCKET = 1 << 16


# Validation arrays: powers of two from this many rows (10^4 and 2 x 10^4 samples per side, whose
# validation samples are 2,500 and 5,000, share one training program).
MIN_VAL_BUCKET = 1 << 13


# No patience: a count no run reaches.
_NO_PATIENCE = 1 << 30


def bucket_rows(n: int, minimum: int = MIN_BUCKET) -> int:
    """The row count a training array of ``n`` rows is padded to: a power of two, at least ``minimum``."""
    return max(int(minimum), 1 << max(int(n) - 1, 0).bit_length())


def validation_rows(n: int) -> int:
    """The rows a validation sample of ``n`` rows is padded to: a power of two above ``n``.

    At least one padding row (the scale-free Renyi score's phantom sample takes the first), and at
    least ``MIN_VAL_BUCKET`` rows, so that sizes up to it share one compiled training program.
    """
    return bucket_rows(int(n) + 1, MIN_VAL_BUCKET)


def pad_validation(val_p, val_q) -> tuple[tuple[jax.Array, jax.Array], tuple[int, int]]:
    """Validation samples padded to :func:`validation_rows` of the larger side, and their counts."""
    n_p, n_q = int(val_p.shape[0]), int(val_q.shape[0])
    rows = validation_rows(max(n_p, n_q))
    return (_padded(val_p, rows, always=True), _padded(val_q, rows, always=True)), (n_p, n_q)


def _padded(x, rows: int, always: bool = False) -> jax.Array:
    """``x`` with zero rows appended up to ``rows``, put on the device once.

    Padded on the host: no program of its own to compile for each shape. ``always``: a device array
    even where no row is added.
    """
    n = int(x.shape[0])
    if n == rows and not always:
        return x
    host = np.asarray(x)
    out = np.zeros((rows,) + host.shape[1:], host.dtype)
    out[:n] = host
    return jax.device_put(out)
