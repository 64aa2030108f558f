"""The one-run training engine: one pure ``run(key, active)``, one training with m canaries.

The run trains the problem's model ONCE with m canaries inserted, each by its own coin, and scores
every canary.

The key is split into three independent keys: the coins (each canary in with probability 1/2), the
batches and the step's noise, so the coins are independent of everything else the run draws. The
data set is the problem's n examples plus one slot per canary, slots ``n .. n + m - 1``; the
included canaries take the first of them (in canary order) and the excluded ones are absent, so
the problem's sampler draws its batches from the n + k present examples exactly as from any data
set of that size (Poisson: each present example independently; shuffle and fixed: over the present
slots; a user's sampler: its batch less the absent slots).

What the step receives: the batch's per-example gradients ``[capacity, ...]`` (a data row's own
gradient, a gradient canary's fixed ``norm * u_i``, an input canary's loss gradient; empty slots
zero) and, for an extra-args step, ``batch_mask``. A step factory is built once for n + m // 2
examples, a size that does not depend on the coins; a correct step divides by a constant (e.g. the
expected batch q (n + m/2)), and a step that divides by the realised batch size leaks the count.

Scores (higher: more likely in): a gradient canary's is its sum of the updates along u_i in units
of the step's response to a lone canary (``'sum'``, which for additive updates is the final
parameters' move along u_i), or for coordinate canaries the per-step log-likelihood ratio of the
Poisson-subsampled Gaussian (``'llr'``); an input canary's is the drop of its loss from the initial
to the final model (black-box: the final model's losses only).

References:
  Steinke, Nasr, Jagielski 2023, "Privacy auditing with one (1) training run", NeurIPS 2023.

"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.flatten_util import ravel_pytree

from cbdp_jax._src.infra.validation import InvalidParameterError
from cbdp_jax._src.training_auditor.one_run.canaries import CanarySet, directions_of, project
from cbdp_jax._src.training_auditor.ops import (
    apply_step,
    example_loss,
    lone_response,
    per_example_grads,
    rekey,
)
from cbdp_jax._src.training_auditor.problem import TrainingProblem


class Layout(NamedTuple):
    """What every run of one audit shares (fixed before any coin is drawn).

    Attributes:
      graphdef: The model's graph.
      params: The initial parameters.
      x: The data's features ``[n, d]``.
      y: The data's labels ``[n]``.
      canaries: The :class:`CanarySet`.
      tx: The step (a factory's, built for ``step_size`` examples).
      step_size: The data set size the step factory was given (n + m // 2), or None for a step.
      unit: The step's move along a canary's direction due to that lone canary (gradient canaries).
      loss: The loss ``loss(model, x, y)``.
      classify: Whether the loss is the default classification loss (accuracy is then reported).
      eval_x: The evaluation features.
      eval_y: The evaluation labels.
      init_canary_loss: ``[m]`` input canaries' losses at the initial parameters (else None).

    """

    graphdef: Any
    params: Any
    x: jax.Array
    y: jax.Array
    canaries: CanarySet
    tx: Any
    step_size: int | None
    unit: float
    loss: Any
    classify: bool
    eval_x: jax.Array
    eval_y: jax.Array
    init_canary_loss: Any = None


class RunOut(NamedTuple):
    """One run's outputs (leading axis R under vmap).

    Attributes:
      scores: ``[m]`` the sum score (gradient) or the loss drop (input).
      llr: ``[m]`` the log-likelihood ratio score (coordinate canaries with ``llr``; else zeros).
      step_max: ``[m]`` max_t |z_t - z_{t-1}| of each canary's per-step updates z_t (coordinate
        canaries with ``steps``; else zeros).
      step_sq: ``[m]`` sum_t (z_t - z_{t-1})^2 (the same).
      included: ``[m]`` bool, the coins (all False when ``active`` is 0).
      hits: ``[m]`` int32, the steps whose batch held each canary.
      overflow: Batches truncated at the physical batch ``[]``.
      finite: Whether the final parameters and the scores are finite ``[]``.
      loss: The final model's mean loss on the evaluation data ``[]``.
      accuracy: Its accuracy there (nan without the default loss) ``[]``.

    """

    scores: jax.Array
    llr: jax.Array
    step_max: jax.Array
    step_sq: jax.Array
    included: jax.Array
    hits: jax.Array
    overflow: jax.Array
    finite: jax.Array
    loss: jax.Array
    accuracy: jax.Array


def step_for_run(problem: TrainingProblem, n: int, m: int) -> tuple[Any, int | None]:
    """The step and the size a factory is given: n + m // 2, independent of the coins."""
    if isinstance(problem.step, optax.GradientTransformation):
        return problem.step, None
    return problem.step_for(n + m // 2), n + m // 2


def canary_unit(tx, params, cs: CanarySet, capacity: int) -> float:
    """The step's response along canary 0's direction to canary 0 alone (the score's unit)."""
    flat, unravel = ravel_pytree(params)
    u = directions_of(cs, jnp.zeros(1, jnp.int32), flat.size)[0]
    unit = lone_response(tx, params, unravel(u), unravel(cs.norm * u), capacity)
    if not (math.isfinite(unit) and abs(unit) > 0):
        raise InvalidParameterError(
            "step is invalid: a lone gradient canary does not move the parameters along its "
            f"direction (response {unit:g}; is the step applied to per-example gradients?)"
        )
    return unit


def _evaluate(layout: Layout, params) -> tuple[jax.Array, jax.Array]:
    """The model's mean loss and accuracy (nan unless classifying) on the evaluation data."""
    model = nnx.merge(layout.graphdef, params)
    loss = jnp.mean(layout.loss(model, layout.eval_x, layout.eval_y))
    if not layout.classify:
        return loss, jnp.float32(jnp.nan)
    acc = jnp.mean(jnp.argmax(model(layout.eval_x), -1) == layout.eval_y)
    return loss, acc.astype(jnp.float32)


def _canary_losses(layout: Layout, params) -> jax.Array:
    cs = layout.canaries
    one = lambda x, y: example_loss(layout.loss, layout.graphdef, params, x, y)
    return jax.vmap(one)(cs.x, cs.y)


def _batch_grads(layout: Layout, params, idx, valid, order, unravel):
    """Per-example gradients of a batch ``[cap, ...]``: data rows, canary rows, empty rows zero."""
    cs, n = layout.canaries, layout.x.shape[0]
    is_c = valid & (idx >= n)
    cid = order[jnp.clip(idx - n, 0, cs.m - 1)]
    row = jnp.minimum(idx, n - 1)
    x, y = layout.x[row], layout.y[row]
    if cs.kind == "input":
        x = jnp.where(is_c[:, None], cs.x[cid], x)
        y = jnp.where(is_c, cs.y[cid], y)
    g = per_example_grads(layout.loss, layout.graphdef, params, x, y)
    if cs.kind == "gradient":
        size = ravel_pytree(params)[0].size
        rows = jax.vmap(unravel)(cs.norm * directions_of(cs, cid, size))
        g = jax.tree.map(lambda a, b: jnp.where(_bcast(is_c, a), b, a), g, rows)
    w = valid.astype(jnp.float32)
    g = jax.tree.map(lambda a: a * _bcast(w, a).astype(a.dtype), g)
    return g, is_c, cid


def _bcast(v, a):
    return v.reshape((-1,) + (1,) * (a.ndim - 1))


def _sharded(mesh, *arrays):
    """The batch's arrays padded to a multiple of the devices and split over them (data parallel)."""
    from jax.sharding import NamedSharding, PartitionSpec

    if mesh is None:
        return arrays
    pad = -arrays[0].shape[0] % mesh.size
    spec = NamedSharding(mesh, PartitionSpec("batch"))
    return tuple(
        jax.lax.with_sharding_constraint(jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1)), spec)
        for a in arrays
    )


def make_one_run(problem: TrainingProblem, layout: Layout, *, llr: bool = False,
                 steps: bool = False, noise_multiplier: float | None = None, rate: float = 1.0,
                 mesh=None):  # fmt: skip
    """The pure function ``run(key, active) -> RunOut`` of one training with the canaries.

    ``active`` = 1 draws the coins; 0 trains without any canary (the same batches' key and noise),
    the comparison run for the price of the audit. With coordinate canaries the scan reads each
    step's canary coordinates z_t ``[m]`` (a gather) and keeps running statistics of them, never
    the ``[T, m]`` series: ``llr`` scores them by the Poisson-subsampled Gaussian's likelihood
    ratio at ``noise_multiplier`` and ``rate``; ``steps`` keeps max_t |dz_t| and sum_t dz_t^2 of
    the step-to-step differences (the step critics of :mod:`.critics`). ``mesh`` (a 1-D
    ``jax.sharding.Mesh`` with axis ``'batch'``) splits each step's batch over its devices: data
    parallel, the padded slots empty.
    """
    cs, n = layout.canaries, layout.x.shape[0]
    slots, sampler, n_steps = n + cs.m, problem.sampler, problem.steps
    flat0, unravel = ravel_pytree(layout.params)
    record = (llr or steps) and cs.kind == "gradient" and cs.directions == "coordinate"
    width = cs.m if record else 0
    s2 = (noise_multiplier or 1.0) ** 2

    def run(key: jax.Array, active) -> RunOut:
        k_coin, k_batch, k_noise = jax.random.split(key, 3)
        included = jax.random.bernoulli(k_coin, 0.5, (cs.m,)) & (jnp.asarray(active) > 0)
        order = jnp.argsort(~included, stable=True).astype(jnp.int32)  # included first
        size = n + jnp.sum(included.astype(jnp.int32))
        plan = sampler.plan(k_batch, slots, n_steps, min_size=n)
        state = rekey(layout.tx.init(layout.params), k_noise)

        def body(carry, t):
            params, state, over, hits, series = carry
            idx, valid, overflow = sampler.batch(plan, t, slots, size)
            idx, valid = _sharded(mesh, idx, valid)
            g, is_c, cid = _batch_grads(layout, params, idx, valid, order, unravel)
            updates, state = apply_step(layout.tx, g, state, params, valid)
            hits = hits.at[cid].add(is_c.astype(jnp.int32))
            if record:
                z = ravel_pytree(updates)[0][cs.coords] / layout.unit
                series = _accumulate(series, z, t, s2, rate)
            return (
                optax.apply_updates(params, updates),
                state,
                over + overflow,
                hits,
                series,
            ), None

        series0 = tuple(jnp.zeros(width, jnp.float32) for _ in range(4))
        carry0 = (layout.params, state, jnp.zeros((), jnp.int32), jnp.zeros(cs.m, jnp.int32),
                  series0)  # fmt: skip
        (final, _, over, hits, series), _ = jax.lax.scan(body, carry0, jnp.arange(n_steps))
        if cs.kind == "gradient":
            scores = project(cs, ravel_pytree(final)[0] - flat0) / layout.unit
        else:
            scores = layout.init_canary_loss - _canary_losses(layout, final)
        zero = jnp.zeros(cs.m)
        ratio = series[1] if record and llr else zero
        step_max, step_sq = (series[2], series[3]) if record and steps else (zero, zero)
        loss, acc = _evaluate(layout, final)
        leaves = [jnp.all(jnp.isfinite(a)) for a in jax.tree.leaves(final)]
        finite = jnp.all(jnp.stack(leaves)) & jnp.all(jnp.isfinite(scores))
        return RunOut(scores, ratio, step_max, step_sq, included, hits, over, finite, loss, acc)

    return run


def _accumulate(series, z: jax.Array, t, s2: float, q: float):
    """The running statistics ``(z_{t-1}, llr, max |dz|, sum dz^2)`` ``[m]`` each, after step t.

    The llr adds log(1 - q + q exp((2 z_t - 1) / (2 S^2))), the Poisson-subsampled Gaussian's
    per-step likelihood ratio; dz_t = z_t - z_{t-1} for t >= 1 (no difference at step 0).
    """
    prev, llr, dmax, dsq = series
    a = (2.0 * z - 1.0) / (2.0 * s2)
    log_out = math.log1p(-q) if q < 1 else -jnp.inf
    llr = llr + jnp.logaddexp(log_out, math.log(q) + a)
    dz = jnp.where(t > 0, z - prev, 0.0)
    return z, llr, jnp.maximum(dmax, jnp.abs(dz)), dsq + dz * dz
