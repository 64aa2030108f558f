"""The training core: an ensemble of adversaries trained at once, functionally.

The model is split once into ``(graphdef, params, rest)`` with ``nnx.split``; parameters of the ensemble
are stacked along a leading axis, and one ``jax.jit`` runs ``lax.scan`` over blocks of ``lax.scan`` over
optimiser steps, with ``jax.vmap`` over the ensemble inside each step (the flax NNX performance guide's
recipe for tiny models). After every block the validation objective is computed and each member keeps
the parameters of its best validation value (early stopping without a host round trip).

Minibatches are drawn either from fixed training arrays or, for mechanisms that can be sampled, fresh
from the mechanism inside the step (no dataset materialised; memory independent of the step count).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from cbdp_jax._src.adversaries import AdversarySpec
from cbdp_jax._src.divergences import get_divergence
from cbdp_jax._src.objectives import choose_objective
from cbdp_jax._src.validation import check_choice

OPTIMIZERS = ("adam", "lbfgs")

# Incremented each time the training function is traced: tests use it to prove that a second call with
# the same shapes does not recompile.
TRACE_COUNT = {"train": 0, "evaluate": 0}


class ObjectiveKey(NamedTuple):
    """A hashable description of the objective (static under jit)."""

    divergence: str
    alpha: float | None
    convention: str
    tight: bool
    spec: AdversarySpec

    def build(self):
        div = get_divergence(self.divergence, alpha=self.alpha, convention=self.convention)
        return div, choose_objective(div, self.spec, tight=self.tight)


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


def make_optimizer(name: str, learning_rate: float) -> optax.GradientTransformation:
    """Adam with global-norm clipping (default), or L-BFGS with a zoom line search (full batch)."""
    check_choice("optimizer", name, OPTIMIZERS)
    if name == "adam":
        return optax.chain(optax.clip_by_global_norm(10.0), optax.adam(learning_rate))
    return optax.lbfgs()


def init_ensemble(keys: jax.Array, spec: AdversarySpec, dim: int, loc, scale, dtype):
    """Builds one module per key and stacks their parameters: returns ``(graphdef, params, rest)``."""

    def one(key):
        module = spec.build(key, dim, loc=loc, scale=scale, dtype=dtype)
        _, params, rest = nnx.split(module, nnx.Param, ...)
        return params, rest

    graphdef = nnx.split(
        spec.build(keys[0], dim, loc=loc, scale=scale, dtype=dtype), nnx.Param, ...
    )[0]
    params, rest = jax.vmap(one)(keys)
    return graphdef, params, rest


def apply_fn(graphdef, params, rest, x: jax.Array) -> jax.Array:
    """Evaluates one adversary given its split state on ``x`` ``[n, d]`` -> ``[n]``."""
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


def lockstep_state_axes(tx: optax.GradientTransformation, params) -> Any:
    """``jax.vmap`` axes of Adam's state for an ensemble whose members all take the same steps.

    Integer leaves (Adam's step count) are shared -- one count for the whole ensemble, so the bias
    corrections are computed once per step, not once per member -- and every other leaf (the moments)
    is per member (axis 0). Only for optimisers whose integer state is a step count: L-BFGS's line
    search keeps per-member integers, so it is vmapped whole.

    Args:
      tx: The optimiser.
      params: Stacked parameters, leading axis = members.

    Returns:
      A pytree of ``None`` / ``0`` matching ``tx.init(one member's params)``.

    """
    one = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), params)
    shapes = jax.eval_shape(tx.init, one)
    return jax.tree.map(lambda x: None if jnp.issubdtype(x.dtype, jnp.integer) else 0, shapes)


def early_stopping_scan(
    step: Callable[[Any, Any, Any], tuple[Any, Any, jax.Array]],
    validate: Callable[[Any], jax.Array],
    params,
    opt_state,
    block_inputs,
    *,
    progress: Callable[[Any], None] | None = None,
):
    """Runs blocks of optimiser steps, validating after each block and keeping each member's best.

    ``lax.scan`` over blocks of ``lax.scan`` over steps; everything stays on the device (early stopping
    without a host round trip). A member whose validation value or parameters stop being finite is
    frozen out: its best value and parameters no longer change.

    Args:
      step: ``(params, opt_state, x) -> (params, opt_state, train_value [M])`` for the whole ensemble.
      validate: ``params -> [M]`` validation objective.
      params: Stacked initial parameters, leading axis = members (M).
      opt_state: The optimiser state of the ensemble.
      block_inputs: A pytree of per-step inputs ``x``, leaves ``[blocks, steps_per_block, ...]``.
      progress: Optional host callback called with the block index after each block.

    Returns:
      ``(best_params, best_value [M], finite [M], train_curve [blocks, M], val_curve [blocks, M])``;
      the training curve holds each block's last training value.

    """
    v0 = validate(params)
    v0 = jnp.where(jnp.isfinite(v0), v0, -jnp.inf)

    def inner(carry, x):
        p_, s_, _ = carry
        return step(p_, s_, x), None

    def block(carry, xs):
        x, index = xs
        p_, s_, last, best_p, best_v, finite = carry
        (p_, s_, last), _ = jax.lax.scan(inner, (p_, s_, last), x)
        v = validate(p_)
        finite = finite & jnp.isfinite(v) & finite_members(p_)
        v = jnp.where(finite, v, -jnp.inf)
        better = v > best_v
        best_p = where_members(better, p_, best_p)
        best_v = jnp.where(better, v, best_v)
        if progress is not None:
            jax.debug.callback(progress, index)
        return (p_, s_, last, best_p, best_v, finite), (last, v)

    blocks = jax.tree.leaves(block_inputs)[0].shape[0]
    carry = (params, opt_state, v0, params, v0, jnp.ones(v0.shape, bool))
    (*_, best_p, best_v, finite), (train_c, val_c) = jax.lax.scan(
        block, carry, (block_inputs, jnp.arange(blocks))
    )
    return best_p, best_v, finite, train_c, val_c


@functools.partial(
    jax.jit,
    static_argnames=(
        "graphdef",
        "objective_key",
        "optimizer",
        "steps",
        "eval_every",
        "batch_size",
        "sampler",
        "progress",
    ),
)
def _train_jit(
    key,
    params,
    rest,
    train_p,
    train_q,
    val_p,
    val_q,
    *,
    graphdef,
    objective_key: ObjectiveKey,
    optimizer: str,
    learning_rate: jax.Array,
    steps: int,
    eval_every: int,
    batch_size: int | None,
    sampler: Callable | None,
    progress: Callable[[Any], None] | None,
):
    TRACE_COUNT["train"] += 1
    _, objective = objective_key.build()
    tx = make_optimizer(optimizer, learning_rate)
    dtype = val_p.dtype

    def member_value(p_, r_, xp, xq):
        return objective.value(apply_fn(graphdef, p_, r_, xp), apply_fn(graphdef, p_, r_, xq))

    def member_loss(p_, r_, xp, xq):
        # Minus the objective plus its penalty, and the objective itself (the training curve).
        h_p, h_q = apply_fn(graphdef, p_, r_, xp), apply_fn(graphdef, p_, r_, xq)
        value = objective.value(h_p, h_q)
        return -value + objective.penalty(h_p, h_q), value

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

    if optimizer == "lbfgs":

        def member_step(p_, r_, s_, xp, xq):
            fn = lambda pp: member_loss(pp, r_, xp, xq)[0]  # noqa: E731
            loss, grad = optax.value_and_grad_from_state(fn)(p_, state=s_)
            updates, s_ = tx.update(grad, s_, p_, value=loss, grad=grad, value_fn=fn)
            # The training curve shows -loss here (the objective less its penalty, if any): L-BFGS's
            # value_fn must return the scalar loss alone.
            return optax.apply_updates(p_, updates), s_, -loss

        state_axes = 0
    else:

        def member_step(p_, r_, s_, xp, xq):
            (_, value), grad = jax.value_and_grad(member_loss, has_aux=True)(p_, r_, xp, xq)
            updates, s_ = tx.update(grad, s_, p_)
            return optax.apply_updates(p_, updates), s_, value

        state_axes = lockstep_state_axes(tx, params)

    vstep = jax.vmap(
        member_step, in_axes=(0, 0, state_axes, None, None), out_axes=(0, state_axes, 0)
    )
    vval = jax.vmap(member_value, in_axes=(0, 0, None, None))

    def step(p_, s_, k):
        xp, xq = batch(k)
        return vstep(p_, rest, s_, xp, xq)

    n_blocks = max(steps // eval_every, 1)
    step_keys = jax.vmap(lambda k: jax.random.split(k, eval_every))(jax.random.split(key, n_blocks))
    best_p, best_v, finite, train_v, val_v = early_stopping_scan(
        step,
        lambda p_: vval(p_, rest, val_p, val_q),
        params,
        jax.vmap(tx.init, out_axes=state_axes)(params),
        step_keys,
        progress=progress,
    )
    return TrainOutput(best_p, best_v, TrainTrace(train_v, val_v), finite)


def train_ensemble(
    key: jax.Array,
    graphdef,
    params,
    rest,
    *,
    objective_key: ObjectiveKey,
    val_p: jax.Array,
    val_q: jax.Array,
    train_p: jax.Array | None = None,
    train_q: jax.Array | None = None,
    sampler: Callable[[jax.Array, int], tuple[jax.Array, jax.Array]] | Hashable | None = None,
    optimizer: str = "adam",
    learning_rate: float = 1e-2,
    steps: int = 2000,
    eval_every: int = 100,
    batch_size: int | None = 4096,
    progress: Callable[[Any], None] | None = None,
) -> TrainOutput:
    """Trains a stacked ensemble of adversaries in one compiled call.

    Args:
      key: A typed PRNG key (minibatch indices or fresh samples).
      graphdef: The shared module structure from :func:`init_ensemble`.
      params: Stacked trainable parameters, leading axis = members.
      rest: Stacked non-trainable state (standardisation, fixed random features).
      objective_key: What to maximise (see :class:`ObjectiveKey`).
      val_p: Validation samples of P, ``[n_val, d]``.
      val_q: Validation samples of Q, ``[m_val, d]``.
      train_p: Training samples of P, ``[n, d]`` (array mode).
      train_q: Training samples of Q, ``[m, d]`` (array mode).
      sampler: Fresh-sample mode: a hashable callable ``(key, n) -> (p [n, d], q [n, d])`` drawing a new
        minibatch from the mechanism at every step, inside the compiled loop.
      optimizer: ``'adam'`` (minibatches) or ``'lbfgs'`` (full batch; for concave problems).
      learning_rate: Adam's step size (a traced value: changing it does not recompile).
      steps: Optimiser steps (rounded down to a multiple of ``eval_every``).
      eval_every: Steps between validation evaluations (early stopping granularity); at most
        ``steps``.
      batch_size: Minibatch size per side; None for full batch.
      progress: Optional hashable host callback called with the block index after each evaluation
        block (progress bars); part of the compiled program's cache key.

    Returns:
      A :class:`TrainOutput`.

    """
    if sampler is None:
        if train_p is None or train_q is None:
            raise ValueError("train_ensemble needs train_p and train_q, or a sampler")
    else:
        train_p = train_q = val_p[:1]
        if batch_size is None:
            raise ValueError("fresh-sample training needs a batch_size")
    if optimizer == "lbfgs" and sampler is None:
        batch_size = None
    return _train_jit(
        key,
        params,
        rest,
        train_p,
        train_q,
        val_p,
        val_q,
        graphdef=graphdef,
        objective_key=objective_key,
        optimizer=optimizer,
        learning_rate=jnp.asarray(learning_rate, jnp.float32),
        steps=int(steps),
        eval_every=min(int(eval_every), int(steps)),
        batch_size=batch_size,
        sampler=sampler,
        progress=progress,
    )
