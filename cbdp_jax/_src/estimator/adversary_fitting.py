"""Fitting adversaries: an ensemble trained at once around the pure core, the estimator's and sweep's.

(Not DP training: the ``training_*`` and ``dp_*`` modules run DP-SGD; this module fits the critics.)
:func:`train_ensemble` runs one compiled program: ``lax.scan`` over blocks of ``lax.scan`` over
optimiser steps, in segments of about :data:`SEGMENT_SECONDS` between host checks (progress, Ctrl-C,
patience); after every block the validation objective is computed and each member keeps the
parameters of its best validation value (:mod:`adversary_fitting_ensemble`'s masks: early stopping
without a host round trip).

Minibatches are drawn either from fixed training arrays (indices from
:mod:`adversary_fitting_batches`) or, for mechanisms that can be sampled, fresh from the mechanism
inside the step (no dataset materialised; memory independent of the step count).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cbdp_jax._src.estimator.adversary_fitting_batches import fold_in2, minibatch_indices
from cbdp_jax._src.estimator.adversary_fitting_ensemble import (
    _NO_PATIENCE,
    SEGMENT_BLOCKS,
    SEGMENT_SECONDS,
    TrainTrace,
    _padded,
    bucket_rows,
    finite_members,
    pad_validation,
    shared_counts,
    state_axes,
    where_members,
)
from cbdp_jax._src.estimator.core import Trainer, TrainState
from cbdp_jax._src.infra.programs import persistent_jit
from cbdp_jax._src.infra.validation import InvalidParameterError


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
      trainer: The class's pure functions (:func:`cbdp_jax._src.estimator.core.trainer`).
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
