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
import time
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


def standardisation(x_reference, dtype) -> tuple[np.ndarray, np.ndarray]:
    """``(loc, scale)``: the mean and spread of a host sample (or of a sequence of them, pooled).

    What :meth:`~cbdp_jax._src.core.Trainer.init` computes from ``x_reference`` (a spread of 0
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


class TrainingProgress(NamedTuple):
    """What a progress callback is told after each compiled training segment (about 4 a second).

    Attributes:
      block: Evaluation blocks done.
      blocks: Blocks in the budget (training may stop earlier, with patience).
      step: Optimiser steps done.
      steps: Optimiser steps in the budget.

    """

    block: int
    blocks: int
    step: int
    steps: int


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


_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _threefry(k1, k2, x1, x2):
    """The Threefry-2x32 hash (20 rounds) as uint32 array arithmetic, unrolled (traceable).

    The words JAX's ``threefry2x32`` gives (``keys.threefry2x32`` is the same on the host). JAX lowers
    its primitive on CPU as a loop of five blocks, several compiled kernels per call; unrolled, XLA
    fuses a chain of calls into a few elementwise kernels, which halves the kernels of the training
    program (its compile time on a CPU).
    """
    u32 = jnp.uint32
    ks = (k1, k2, k1 ^ k2 ^ u32(0x1BD11BDA))
    a, b = x1 + ks[0], x2 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            a = a + b
            b = jax.lax.shift_left(b, u32(r)) | jax.lax.shift_right_logical(b, u32(32 - r))
            b = a ^ b
        a = a + ks[(i + 1) % 3]
        b = b + ks[(i + 2) % 3] + u32(i + 1)
    return a, b


def _unrolled_prng(key) -> bool:
    """Whether :func:`fold_in2` and :func:`minibatch_indices` may hash JAX's keys themselves.

    For threefry keys under partitionable threefry (JAX's default) and 32-bit integers: the layout
    their words follow here. Otherwise they call ``jax.random``.
    """
    return (
        str(jax.random.key_impl(key)) == "threefry2x32"
        and bool(jax.config.jax_threefry_partitionable)
        and not jax.config.jax_enable_x64
    )


def fold_in2(key, a, b):
    """``jax.random.fold_in(jax.random.fold_in(key, a), b)`` for ``a, b >= 0`` (traceable)."""
    if not _unrolled_prng(key):
        return jax.random.fold_in(jax.random.fold_in(key, a), b)
    words = jax.random.key_data(key)
    zero = jnp.zeros((), jnp.uint32)
    k1, k2 = _threefry(words[0], words[1], zero, jnp.asarray(a).astype(jnp.uint32))
    k1, k2 = _threefry(k1, k2, zero, jnp.asarray(b).astype(jnp.uint32))
    return jax.random.wrap_key_data(jnp.stack([k1, k2]), impl="threefry2x32")


def minibatch_indices(key, batch_size: int, n_p, n_q):
    """The minibatch rows of one step: ``randint(kp, (batch_size,), 0, n_p)``, the same of ``kq``.

    ``kp, kq = jax.random.split(key)``; int32 indices; traceable. The same bits as those calls (``tests/test_training.py`` compares them): ``randint`` draws two
    32-bit words per index, from the two halves of a split of its key, and reduces them modulo the
    span.
    """
    if not _unrolled_prng(key):
        kp, kq = jax.random.split(key)
        return (
            jax.random.randint(kp, (batch_size,), 0, n_p),
            jax.random.randint(kq, (batch_size,), 0, n_q),
        )
    u32 = jnp.uint32
    words = jax.random.key_data(key)
    pair = jnp.arange(2, dtype=u32)
    # split(key) -> (kp, kq); split(kp) and split(kq) -> the four keys of the four draws.
    a, b = _threefry(words[0], words[1], jnp.zeros(2, u32), pair)
    a, b = _threefry(a[:, None], b[:, None], jnp.zeros((2, 2), u32), pair[None, :])
    a, b = a.reshape(4, 1), b.reshape(4, 1)
    x, y = _threefry(a, b, jnp.zeros((4, batch_size), u32), jnp.arange(batch_size, dtype=u32)[None])
    bits = x ^ y  # rows: high and low words of P's draw, then of Q's

    def reduce(high, low, n):
        n = jnp.asarray(n, jnp.int32)
        span = jnp.where(n <= 0, u32(1), n.astype(u32))
        multiplier = jax.lax.rem(u32(1 << 16), span)
        multiplier = jax.lax.rem(multiplier * multiplier, span)
        offset = jax.lax.rem(high, span) * multiplier + jax.lax.rem(low, span)
        return jax.lax.rem(offset, span).astype(jnp.int32)

    return reduce(bits[0], bits[1], n_p), reduce(bits[2], bits[3], n_q)


class _Carry(NamedTuple):
    """The training loop's state between segments (on the device)."""

    state: TrainState
    last: jax.Array  # each member's last training value [M]
    best_params: Any
    best_value: jax.Array  # [M]
    finite: jax.Array  # [M] bool
    since: jax.Array  # validation checks since each member's last new best [M] int32


@persistent_jit(static_argnames=("trainer", "batch_size", "sampler"))
def _train_jit(key, carry, bounds, train_p, train_q, counts, val_p, val_q, **static):
    """The compiled training segment: :func:`_train_body`, looked up when traced.

    The lookup lets a test wrap the body with ``chex.assert_max_traces`` to assert that a second call
    (another size in the same bucket, another step count) compiles nothing.
    """
    return _train_body(key, carry, bounds, train_p, train_q, counts, val_p, val_q, **static)


def _train_body(
    key,
    carry: _Carry,
    bounds,
    train_p,
    train_q,
    counts,
    val_p,
    val_q,
    *,
    trainer: Trainer,
    batch_size: int | None,
    sampler: Callable | None,
):
    """Steps ``bounds[0] .. bounds[1]`` of a run, validating at every multiple of ``bounds[2]``.

    ``bounds = (start, end, eval_every, patience)`` are run-time values (int32), so one program serves
    every step count, every evaluation interval and every patience. Step ``s`` uses the key
    ``fold_in(fold_in(key, s // eval_every), s % eval_every)``, which is
    ``split(split(key, blocks)[s // eval_every], eval_every)[s % eval_every]`` (threefry's split is
    a fold-in of the index): the minibatches do not depend on how the run is cut into segments. The
    segment also ends early once every member is stale (``patience`` checks in a row without a new
    best, or no longer finite). Returns the carry, the curves of the blocks it finished (rows
    ``[SEGMENT_BLOCKS, M]``, NaN past them), the number of steps it ran and whether all are stale.

    Training and validation arrays hold padding rows: ``counts`` = (training P, training Q,
    validation P, validation Q) real row counts. Minibatch indices are drawn below the training
    counts (the same draws as over arrays of exactly that many rows); the validation objective
    masks the padding rows out. The loop runs steps up to the next block's end, then a validation
    check, one or the other per iteration (one copy of each in the program): the run's first
    segment starts with the check of the initial critics.
    """
    start, end, every, patience = bounds
    dtype = val_p.dtype

    def batch(k):
        if sampler is not None:
            xp, xq = sampler(k, batch_size)
            return xp.astype(dtype), xq.astype(dtype)
        if batch_size is None:
            return train_p, train_q
        ip, iq = minibatch_indices(k, batch_size, counts[0], counts[1])
        return train_p[ip], train_q[iq]

    state = carry.state
    if not trainer.line_search:
        state = state._replace(opt_state=shared_counts(state.opt_state))
    axes = state_axes(trainer, state)
    # The ensemble shares each step's minibatch (and key): vmap over the members' states only.
    vstep = jax.vmap(trainer.step, in_axes=(None, axes, None), out_axes=(axes, 0))
    vvalue = jax.vmap(trainer.value, in_axes=(axes, None, None, None))

    def validate(st):
        return vvalue(st, (val_p, val_q), None, (counts[2], counts[3]))

    carry = carry._replace(state=state)
    members = carry.best_value.shape[0]
    nan = jnp.full((SEGMENT_BLOCKS, members), jnp.nan, carry.best_value.dtype)

    def step(s, c):
        st, last = c
        k = fold_in2(key, s // every, s % every)
        st, info = vstep(k, st, batch(k))
        return st, info.value

    def stale(c):
        # Without patience (its sentinel) a run is never cut short, not even when every member diverged.
        return (patience < _NO_PATIENCE) & ~jnp.any(c.finite & (c.since < patience))

    def more(loop):
        s, c, _, _, _, pending = loop
        return ((s < end) | pending) & ~stale(c)

    def steps(loop):
        s, c, row, train_c, val_c, _ = loop
        stop = jnp.minimum((s // every + 1) * every, end)
        st, last = jax.lax.fori_loop(s, stop, step, (c.state, c.last))
        return stop, c._replace(state=st, last=last), row, train_c, val_c, stop % every == 0

    def check(loop):
        s, c, row, train_c, val_c, _ = loop
        v = validate(c.state)
        c, row, train_c, val_c = jax.lax.cond(s == 0, _fresh, _check, c, v, row, train_c, val_c)
        return s, c, row, train_c, val_c, jnp.zeros((), bool)

    def run(loop):
        return jax.lax.cond(loop[5], check, steps, loop)

    loop = (start, carry, jnp.zeros((), jnp.int32), nan, nan, start == 0)
    s, carry, rows_done, train_c, val_c, _ = jax.lax.while_loop(more, run, loop)
    if not trainer.line_search:  # back to one count per member, the form the carry came in
        opt = jax.tree.map(
            lambda x: jnp.broadcast_to(x, (members,) + x.shape)
            if jnp.issubdtype(x.dtype, jnp.integer) else x,
            carry.state.opt_state,
        )  # fmt: skip
        carry = carry._replace(state=carry.state._replace(opt_state=opt))
    return carry, train_c, val_c, s - start, rows_done, stale(carry)


def _fresh(c: _Carry, v, row, train_c, val_c):
    """The run's first check: the initial critics are the first candidates (as before training)."""
    v0 = jnp.where(jnp.isfinite(v), v, -jnp.inf)
    return c._replace(last=v0, best_params=c.state.params, best_value=v0), row, train_c, val_c


def _check(c: _Carry, v, row, train_c, val_c):
    """A validation check at a block's end: each member's best parameters, value and staleness."""
    finite = c.finite & jnp.isfinite(v) & finite_members(c.state.params)
    v = jnp.where(finite, v, -jnp.inf)
    better = v > c.best_value
    c = c._replace(
        best_params=where_members(better, c.state.params, c.best_params),
        best_value=jnp.where(better, v, c.best_value),
        finite=finite,
        since=jnp.where(better, 0, c.since + 1),
    )
    return c, row + 1, train_c.at[row].set(c.last), val_c.at[row].set(v)


def _segments(segment, carry, blocks: int, every: int, patience: int, *, progress,
              segment_seconds: float, cancelled):  # fmt: skip
    """The host loop of :func:`train_ensemble`: compiled segments until the budget or patience ends.

    Returns the last carry and the curves ``[blocks, M]`` (NaN rows for blocks not run).
    """
    total = blocks * every
    members, dtype = carry.best_value.shape[0], np.dtype(carry.best_value.dtype)
    train_c = np.full((blocks, members), np.nan, dtype)
    val_c = np.full((blocks, members), np.nan, dtype)
    # The first two segments are short (the first one compiles); then each aims at segment_seconds.
    done, block, seg = 0, 0, min(every, 8)
    while done < total:
        end = min(total, done + seg, (block + SEGMENT_BLOCKS) * every)
        t0 = time.perf_counter()
        carry, tc, vc, ran, finished, stale = segment(
            carry, np.array([done, end, every, patience], np.int32)
        )
        ran, finished, stale = int(ran), int(finished), bool(stale)
        seconds = time.perf_counter() - t0
        if finished:
            train_c[block : block + finished] = np.asarray(tc)[:finished]
            val_c[block : block + finished] = np.asarray(vc)[:finished]
        first = done == 0
        done += ran
        block += finished
        if progress is not None:
            progress(TrainingProgress(block, blocks, done, total))
        if stale or ran == 0:
            break
        if cancelled is not None and cancelled():
            raise KeyboardInterrupt("training cancelled")
        if not first:  # the first call's time is mostly its compile
            seg = max(1, int(segment_seconds / max(seconds / max(ran, 1), 1e-9)))
    return carry, train_c, val_c


def _training_arrays(trainer: Trainer, train_p, train_q, val_p, sampler, batch_size):
    """:func:`train_ensemble`'s training arrays (a one-row placeholder with a sampler), the mode checked."""
    if sampler is None:
        if train_p is None or train_q is None:
            raise ValueError("train_ensemble needs train_p and train_q, or a sampler")
    else:
        train_p = train_q = np.zeros((1,) + tuple(val_p.shape[1:]), np.dtype(val_p.dtype))
        if batch_size is None:
            raise ValueError("fresh-sample training needs a batch_size")
    if trainer.line_search and (sampler is not None or batch_size is not None):
        raise InvalidParameterError(
            "optimizer='lbfgs' is invalid with minibatches or fresh samples: its line search "
            "compares losses of one fixed batch; use batch_size=None with stored samples, or Adam"
        )
    return train_p, train_q


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
    progress: Callable[[TrainingProgress], None] | None = None,
    patience: int | None = None,
    segment_seconds: float = SEGMENT_SECONDS,
    cancelled: Callable[[], bool] | None = None,
    val_counts: tuple[int, int] | None = None,
) -> TrainOutput:
    """Trains a stacked ensemble of adversaries, in compiled segments driven from the host.

    The step count, the evaluation interval and the patience are run-time values of one compiled
    program (a new budget compiles nothing), and the training and validation arrays are padded to
    buckets of rows (:func:`bucket_rows`, :func:`validation_rows`; the validation objective masks
    the padding out), so a new sample size in the same buckets compiles nothing either. Each
    compiled call runs about ``segment_seconds`` of steps (the first two a few steps: the first one
    compiles), so an interrupt (Ctrl-C) or ``cancelled`` is seen between segments, and ``progress``
    is called after each segment.
    How the run is cut into segments does not change a number (:func:`_train_body`).

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
      progress: Optional host callback, called with a :class:`TrainingProgress` after each
        segment (steps done and the budget's, for a count and an ETA).
      patience: Stop when every member has gone this many validation checks without a new best
        (:func:`early_stopping_scan`); None trains all ``steps``. The trace's rows of blocks not run
        are NaN.
      segment_seconds: The wall time each compiled call aims at.
      cancelled: Optional host check between segments; when it returns True, training stops with
        ``KeyboardInterrupt``.
      val_counts: The validation samples per side when ``val_p`` and ``val_q`` are already padded
        (:func:`pad_validation`); None: every row is a sample (they are padded here).

    Returns:
      A :class:`TrainOutput` (its trace as host arrays).

    Raises:
      InvalidParameterError: A line-search optimiser (L-BFGS) with minibatches or fresh samples: its
        line search would compare losses of different batches.
      KeyboardInterrupt: ``cancelled`` returned True.

    """
    train_p, train_q = _training_arrays(trainer, train_p, train_q, val_p, sampler, batch_size)
    every = min(int(eval_every), int(steps))
    if val_counts is None:
        (val_p, val_q), val_counts = pad_validation(val_p, val_q)
    counts = np.array([train_p.shape[0], train_q.shape[0], *val_counts], np.int32)
    if sampler is None and batch_size is not None:
        # Minibatches index below the real counts: padding rows are never drawn.
        rows = bucket_rows(max(counts[:2]))
        train_p, train_q = _padded(train_p, rows), _padded(train_q, rows)
    members = jax.tree.leaves(state.params)[0].shape[0]
    zeros = np.zeros((members,), np.dtype(val_p.dtype))
    # On the device from the first call: the later segments pass the previous one's outputs, and a
    # program store keys host and device arguments apart.
    carry = jax.device_put(_Carry(
        state, zeros, state.params, zeros, np.ones((members,), bool),
        np.zeros((members,), np.int32),
    ))  # fmt: skip
    static = {"trainer": trainer, "batch_size": batch_size, "sampler": sampler}

    def segment(carry, bounds):
        return _train_jit(key, carry, bounds, train_p, train_q, counts, val_p, val_q, **static)

    pat = _NO_PATIENCE if patience is None else int(patience)
    carry, train_c, val_c = _segments(
        segment, carry, max(int(steps) // every, 1), every, pat, progress=progress,
        segment_seconds=segment_seconds, cancelled=cancelled,
    )  # fmt: skip
    return TrainOutput(
        carry.best_params, carry.best_value, TrainTrace(train_c, val_c), carry.finite
    )
