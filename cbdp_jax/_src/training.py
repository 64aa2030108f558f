"""Training drivers: an ensemble of adversaries trained at once around the pure core.

:mod:`cbdp_jax._src.core` gives the per-adversary functions (``init``, ``step``, ``value``). Here they
are vmapped over an ensemble (parameters stacked along a leading axis) and run by one ``jax.jit``:
``lax.scan`` over blocks of ``lax.scan`` over optimiser steps; after every block the validation
objective is computed and each member keeps the parameters of its best validation value (early
stopping without a host round trip). The estimator and the sweep both train through
:func:`early_stopping_scan`.

Minibatches are drawn either from fixed training arrays or, for mechanisms that can be sampled, fresh
from the mechanism inside the step (no dataset materialised; memory independent of the step count).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cbdp_jax._src.core import Trainer, TrainState, set_learning_rate
from cbdp_jax._src.programs import persistent_jit
from cbdp_jax._src.validation import InvalidParameterError

# Incremented each time the training function is traced: tests use it to prove that a second call with
# the same shapes does not recompile.


class TrainTrace(NamedTuple):
    """Training curves, one entry per evaluation block.

    Attributes:
      train_value: Training objective of each member at the end of each block, ``[blocks, members]``.
      val_value: Validation objective of each member after each block, ``[blocks, members]``.

    """

    train_value: jax.Array
    val_value: jax.Array


class TrainOutput(NamedTuple):
    """Result of :func:`train_ensemble`.

    Attributes:
      best_params: Parameters of each member at its best validation value (stacked).
      best_value: The best validation objective of each member, ``[members]``.
      trace: The training curves.
      finite: Whether each member's training stayed finite (no NaN loss or parameters), ``[members]``.

    """

    best_params: Any
    best_value: jax.Array
    trace: TrainTrace
    finite: jax.Array


def init_ensemble(keys: jax.Array, trainer: Trainer, x_reference, learning_rate=None) -> TrainState:
    """One :class:`~cbdp_jax._src.core.TrainState` per key, stacked along a leading axis.

    ``x_reference`` (the sample that fixes the input standardisation) may be an array or a sequence
    of arrays to pool. ``learning_rate`` (the default optimiser's step size) may be set for every
    member at once.
    """
    if learning_rate is not None and trainer.default_optimizer:
        learning_rate = np.float32(learning_rate)
    else:
        learning_rate = None
    return _init_program(keys, x_reference, learning_rate, trainer=trainer)


@persistent_jit(static_argnames=("trainer",))
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
      state: The ensemble's :class:`~cbdp_jax._src.core.TrainState` (leading axis = members, M).
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


@persistent_jit(
    static_argnames=(
        "trainer",
        "steps",
        "eval_every",
        "batch_size",
        "sampler",
        "progress",
        "patience",
    )
)
def _train_jit(key, state, train_p, train_q, val_p, val_q, **static):
    """The compiled training program: :func:`_train_body`, looked up when traced.

    The lookup lets a test wrap the body with ``chex.assert_max_traces`` to assert that a second call
    with the same shapes compiles nothing.
    """
    return _train_body(key, state, train_p, train_q, val_p, val_q, **static)


def _train_body(
    key,
    state: TrainState,
    train_p,
    train_q,
    val_p,
    val_q,
    *,
    trainer: Trainer,
    steps: int,
    eval_every: int,
    batch_size: int | None,
    sampler: Callable | None,
    progress: Callable[[Any], None] | None,
    patience: int | None = None,
):
    dtype = val_p.dtype

    def batch(k):
        if sampler is not None:
            xp, xq = sampler(k, batch_size)
            return xp.astype(dtype), xq.astype(dtype)
        if batch_size is None:
            return train_p, train_q
        kp, kq = jax.random.split(k)
        ip = jax.random.randint(kp, (batch_size,), 0, train_p.shape[0])
        iq = jax.random.randint(kq, (batch_size,), 0, train_q.shape[0])
        return train_p[ip], train_q[iq]

    if not trainer.line_search:
        state = state._replace(opt_state=shared_counts(state.opt_state))
    axes = state_axes(trainer, state)
    # The ensemble shares each step's minibatch (and key): vmap over the members' states only.
    vstep = jax.vmap(trainer.step, in_axes=(None, axes, None), out_axes=(axes, 0))
    vvalue = jax.vmap(trainer.value, in_axes=(axes, None))

    def step(st, k):
        st, info = vstep(k, st, batch(k))
        return st, info.value

    n_blocks = max(steps // eval_every, 1)
    step_keys = jax.vmap(lambda k: jax.random.split(k, eval_every))(jax.random.split(key, n_blocks))
    best_p, best_v, finite, train_v, val_v = early_stopping_scan(
        step,
        lambda st: vvalue(st, (val_p, val_q)),
        state,
        step_keys,
        progress=progress,
        patience=patience,
    )
    return TrainOutput(best_p, best_v, TrainTrace(train_v, val_v), finite)


def train_ensemble(
    key: jax.Array,
    trainer: Trainer,
    state: TrainState,
    *,
    val_p: jax.Array,
    val_q: jax.Array,
    train_p: jax.Array | None = None,
    train_q: jax.Array | None = None,
    sampler: Callable[[jax.Array, int], tuple[jax.Array, jax.Array]] | Hashable | None = None,
    steps: int = 2000,
    eval_every: int = 100,
    batch_size: int | None = 4096,
    progress: Callable[[Any], None] | None = None,
    patience: int | None = None,
) -> TrainOutput:
    """Trains a stacked ensemble of adversaries in one compiled call.

    Args:
      key: A typed PRNG key (minibatch indices or fresh samples).
      trainer: The class's pure functions (:func:`cbdp_jax._src.core.trainer`).
      state: The ensemble's stacked state (:func:`init_ensemble`).
      val_p: Validation samples of P, ``[n_val, d]``.
      val_q: Validation samples of Q, ``[m_val, d]``.
      train_p: Training samples of P, ``[n, d]`` (array mode).
      train_q: Training samples of Q, ``[m, d]`` (array mode).
      sampler: Fresh-sample mode: a hashable callable ``(key, n) -> (p [n, d], q [n, d])`` drawing a new
        minibatch from the mechanism at every step, inside the compiled loop.
      steps: Optimiser steps (rounded down to a multiple of ``eval_every``).
      eval_every: Steps between validation evaluations (early stopping granularity); at most
        ``steps``.
      batch_size: Minibatch size per side; None for full batch.
      progress: Optional hashable host callback called with the block index after each evaluation
        block (progress bars); part of the compiled program's cache key.
      patience: Stop when every member has gone this many validation checks without a new best
        (:func:`early_stopping_scan`); None trains all ``steps``. The trace's rows of blocks not run
        are NaN.

    Returns:
      A :class:`TrainOutput`.

    Raises:
      InvalidParameterError: A line-search optimiser (L-BFGS) with minibatches or fresh samples: its
        line search would compare losses of different batches.

    """
    if sampler is None:
        if train_p is None or train_q is None:
            raise ValueError("train_ensemble needs train_p and train_q, or a sampler")
    else:
        train_p = train_q = val_p[:1]
        if batch_size is None:
            raise ValueError("fresh-sample training needs a batch_size")
    if trainer.line_search and (sampler is not None or batch_size is not None):
        raise InvalidParameterError(
            "optimizer='lbfgs' is invalid with minibatches or fresh samples: its line search "
            "compares losses of one fixed batch; use batch_size=None with stored samples, or Adam"
        )
    return _train_jit(
        key,
        state,
        train_p,
        train_q,
        val_p,
        val_q,
        trainer=trainer,
        steps=int(steps),
        eval_every=min(int(eval_every), int(steps)),
        batch_size=batch_size,
        sampler=sampler,
        progress=progress,
        patience=None if patience is None else int(patience),
    )
