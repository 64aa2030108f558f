"""Stage 3 of a training audit, the run engine: one pure ``run(key, present)`` per training, vmapped.

:func:`~cbdp_jax._src.training_auditor.prepare.prepare` (stages 1 and 2) fixes once what every run
shares: the split model, the data laid out in slots with the canary's slot last, what that slot
holds on D and on D' under the audited relation, the canary's direction and unit, and the probes'
findings (:mod:`~cbdp_jax._src.training_auditor.probes`).
:func:`make_run` returns the pure function of one training: ``present`` = 1 is D, 0 is D'. Under
add/remove D' is D with its last slot absent (the sampler draws from one example fewer and the step's
``batch_mask`` never holds it); under zero-out the slot is in the batches with a zero gradient;
under replace-one it holds the replaced record. So D and D' share one compiled program, except for
a step built per data set whose sizes differ (a factory under add/remove), which needs one program
per side. :func:`training_runs` keeps the compiled programs; nothing else is global, so the runs can
be split over devices and hosts by calling ``run`` (or :func:`many_runs`) on each shard of keys.

Scores (docs/theory/training_audit.md, section 3): the gradient threat's z_t = (update_t along the
canary's direction) / (the update a lone canary makes), scored by the exact log-likelihood ratio of
the Poisson-subsampled (or shuffled) Gaussian (``'llr'``) or by sum_t z_t; the white-box threat
projects the final parameters on the input canary's negative gradient at the initialisation; the
black-box threat is minus the canary's final loss.

References:
  Nasr, Hayes, Steinke, Balle, Tramer, Jagielski, Carlini, Terzis 2023, "Tight auditing of
  differentially private machine learning" (gradient canaries, all-updates threat model).

"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from cbdp_jax._src.infra.memo import remembered
from cbdp_jax._src.infra.sharded_runs import sharded_runs
from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    check_int_at_least,
    check_key,
)
from cbdp_jax._src.training_auditor import lean_batches
from cbdp_jax._src.training_auditor.batch_sampling import BatchSampler
from cbdp_jax._src.training_auditor.ghost_clipping import ghost_update
from cbdp_jax._src.training_auditor.ops import (
    Prepared,
    apply_step,
    example_loss,
    per_example_grads,
    rekey,
    slot_batch,
    tree_dot,
)
from cbdp_jax._src.training_auditor.prepare import prepare
from cbdp_jax._src.training_auditor.problem import TrainingProblem
from cbdp_jax._src.training_auditor.release import ReleaseLayout, recorder


def _override(g, where, value):
    """Rows of the per-example gradients ``g`` replaced by ``value`` where ``where`` [b] holds."""
    if value is None:
        return g
    return jax.tree.map(
        lambda gi, vi: jnp.where(where.reshape((-1,) + (1,) * vi.ndim), vi[None], gi), g, value
    )


def batch_grads(prep: Prepared, params, idx, valid, present):
    """Per-example gradients ``[capacity, ...]`` of a step's batch, the canary's slot per side."""
    x, y, is_slot, on_d = slot_batch(prep, idx, present)
    g = per_example_grads(prep.loss, prep.graphdef, params, x, y)
    g = _override(g, is_slot & on_d, prep.canary_grad)
    g = _override(g, is_slot & ~on_d, prep.neighbour_grad)
    w = valid.astype(jnp.float32)
    if prep.relation == "zero-out":  # D''s slot stays in the batch with a zero gradient
        w = w * jnp.where(is_slot & ~on_d, 0.0, 1.0)
    return jax.tree.map(lambda gi: gi * w.reshape((-1,) + (1,) * (gi.ndim - 1)).astype(gi.dtype), g)


class RunOutput(NamedTuple):
    """One training run's outputs.

    Attributes:
      score: The threat model's score ``[]`` (larger when the canary was in).
      z: The canary coordinate's updates in canary units ``[T]`` (gradient threat; else zeros).
      overflow: Poisson batch members dropped beyond the physical batch ``[]`` (0 in practice).
      finite: Whether the final parameters, the updates along the canary and the score are all
        finite ``[]`` bool (an audit refuses runs that are not).
      extra: What ``make_run``'s ``observe`` returned (empty without it).
      release: What the threat releases beyond the score, ``[rows, k]`` float32 (the layout's
        coordinates, :mod:`~cbdp_jax._src.training_auditor.release`; ``[0, 0]`` without a layout).

    """

    score: jax.Array
    z: jax.Array
    overflow: jax.Array
    finite: jax.Array
    extra: Any = ()
    release: Any = ()


def _sizes(problem: TrainingProblem) -> tuple[int, int]:
    return problem.examples, problem.neighbour_examples


def make_run(
    problem: TrainingProblem, prep: Prepared, *, side: float | None = None, observe=None,
    release: ReleaseLayout | None = None, batch_slots: int | None = None,
):  # fmt: skip
    """The pure function ``run(key, present) -> RunOutput`` of one training (jit / vmap ready).

    ``present`` is 1.0 on D (canary in) and 0.0 on D' (the relation's neighbour). The key is split
    into the batches' key and the step's noise key; the step's state is re-keyed with the latter.
    A step built per data set whose D and D' sizes differ needs the side fixed: ``side`` (1.0 or
    0.0), and ``present`` is then ignored. ``observe(final_params, z)`` (z: every step's update
    along the canary's direction over the unit, ``[T]``, whatever the threat) adds what it returns
    to the output's ``extra`` (e.g. what other adversaries of the same runs see). ``release`` (a
    :class:`~cbdp_jax._src.training_auditor.release.ReleaseLayout`) records its coordinates of every step's
    update (``'updates'``) or of the final move (``'final'``) in the output's ``release``.
    ``batch_slots`` (Poisson only; default the sampler's capacity) computes each batch with that
    many slots: a lean run, exact when its ``overflow`` is 0
    (:mod:`~cbdp_jax._src.training_auditor.lean_batches`).
    """
    sampler, slots, steps = problem.sampler, prep.x.shape[0], problem.steps
    threat, q = problem.threat, problem.sampling_rate
    kind = problem.score_kind() if threat == "gradient" else None
    s2 = (problem.noise_multiplier or 1.0) ** 2
    size_d, size_out = _sizes(problem)
    if problem.step_per_data_set and side is None:
        raise InvalidParameterError(
            "side=None is invalid: this step is built per data set (D and D' differ in size), "
            "so each side needs its own run: make_run(..., side=1.0 or 0.0)"
        )
    txs = {s: problem.step_for(size) for s, size in ((1.0, size_d), (0.0, size_out))}
    default_loss = problem.loss_fn is None
    ghost = {s: ghost_update(prep, tx, default_loss) for s, tx in txs.items()}
    layout = ReleaseLayout("none") if release is None else release
    take = recorder(layout, prep.params)

    def run(key: jax.Array, present: jax.Array) -> RunOutput:
        present = jnp.float32(side) if side is not None else jnp.asarray(present, jnp.float32)
        tx = txs[float(side)] if side is not None else txs[1.0]
        fast = ghost[float(side)] if side is not None else ghost[1.0]
        k_batch, k_noise = jax.random.split(key)
        state = rekey(tx.init(prep.params), k_noise, prep.raw_keys)
        if size_out == size_d or side is not None:  # a static size: the sampler's fast path
            size = size_d if side is None or side > 0 else size_out
        else:
            size = size_out + (present > 0).astype(jnp.int32)
        plan = sampler.plan(k_batch, slots, steps, min_size=min(size_d, size_out))

        def body(carry, t):
            params, state, over = carry
            idx, valid, overflow = sampler.batch(plan, t, slots, size, batch_slots)
            if fast is not None:  # ghost clipping: the same step, no per-example gradients
                updates, state = fast(params, state, idx, valid, present)
            else:
                grads = batch_grads(prep, params, idx, valid, present)
                updates, state = apply_step(tx, grads, state, params, valid)
            z = tree_dot(updates, prep.direction) / prep.unit
            seen = take(updates) if layout.kind == "updates" else jnp.zeros((0,), jnp.float32)
            return (optax.apply_updates(params, updates), state, over + overflow), (z, seen)

        carry0 = (prep.params, state, jnp.zeros((), jnp.int32))
        (final, _, over), (z, seen) = jax.lax.scan(body, carry0, jnp.arange(steps))
        if layout.kind == "final":
            seen = take(jax.tree.map(jnp.subtract, final, prep.params))[None]
        elif layout.kind == "none":
            seen = jnp.zeros((0, 0), jnp.float32)
        z_all = z
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(a)) for a in jax.tree.leaves(final)]))
        score, z = score_of(final, z)
        finite = (
            finite & jnp.all(jnp.isfinite(z)) & jnp.isfinite(score) & jnp.all(jnp.isfinite(seen))
        )
        extra = () if observe is None else observe(final, z_all)
        return RunOutput(score, z, over, finite, extra, seen)

    def score_of(final, z):
        if kind == "llr":
            return _llr(sampler, size_d, q, z, s2, prep.neighbour_mean), z
        if kind is not None:
            return (problem.score(z) if kind == "custom" else jnp.sum(z)), z
        if threat == "white-box":
            score = tree_dot(jax.tree.map(jnp.subtract, final, prep.params), prep.direction)
        else:
            x, y = prep.x[prep.slot], prep.y[prep.slot]
            score = -example_loss(prep.loss, prep.graphdef, final, x, y)
        return score, jnp.zeros_like(z)

    return run


def _llr(sampler: BatchSampler, n: int, q: float, z: jax.Array, s2: float, m: float) -> jax.Array:
    """The log-likelihood ratio of the canary coordinates z ``[T]`` (D''s slot at m in canary units).

    With a_t = log N(z_t; 1, S^2) / N(z_t; 0, S^2) = (2 z_t - 1) / (2 S^2) and b_t the same for mean
    m (0 when D''s slot contributes nothing): Poisson and fixed-size batches hold the slot at each
    step independently with probability q, sum_t log(1 - q + q e^{a_t}) - log(1 - q + q e^{b_t});
    shuffled batches hold it at exactly one step of each epoch, uniform, sum_epochs
    log(mean_{t in epoch} e^{a_t}) - log(mean e^{b_t}), the steps of an unfinished epoch counting
    e^0 = 1.
    """
    a = (2.0 * z - 1.0) / (2.0 * s2)
    b = None if m == 0.0 else (2.0 * m * z - m * m) / (2.0 * s2)
    if sampler.kind == "shuffle":
        per = sampler.steps_per_epoch(n)
        epochs = -(-z.shape[0] // per)

        def per_epoch(v):
            padded = jnp.concatenate([v, jnp.zeros(epochs * per - v.shape[0], v.dtype)])
            return jnp.sum(jax.nn.logsumexp(padded.reshape(epochs, per), axis=1) - math.log(per))

        return per_epoch(a) - (0.0 if b is None else per_epoch(b))
    log_out = math.log1p(-q) if q < 1 else -jnp.inf
    score = jnp.sum(jnp.logaddexp(log_out, math.log(q) + a))
    return score - (0.0 if b is None else jnp.sum(jnp.logaddexp(log_out, math.log(q) + b)))


def many_runs(problem: TrainingProblem, run, key: jax.Array, present, n: int) -> RunOutput:
    """N trainings (keys split from ``key``), vmapped in chunks of ``problem.chunk`` by ``lax.map``."""
    keys = jax.random.split(key, n)
    if n <= problem.chunk:
        return jax.vmap(run, in_axes=(0, None))(keys, present)
    return jax.lax.map(lambda k: run(k, present), keys, batch_size=problem.chunk)


def training_runs(
    key: jax.Array, problem: TrainingProblem, n: int, *, canary: bool | float = True,
    prep: Prepared | None = None, devices=None, progress=None, release: ReleaseLayout | None = None,
    blocks=None,
) -> RunOutput:  # fmt: skip
    """N independent trainings on D (``canary=True``) or D', over every device, in short calls.

    Run i has key i of ``jax.random.split(key, n)``, whatever the devices and processes
    (:func:`~cbdp_jax._src.infra.sharded_runs.sharded_runs`: blocks of about half a second each, sharded over
    ``devices``, default ``jax.devices()``; at most ``problem.chunk`` runs per device per call).
    D and D' share the compiled programs (the side is an argument), except for a step built per
    data set whose sizes differ, which compiles its own per side.

    Args:
      key: A typed PRNG key.
      problem: The :class:`TrainingProblem`.
      n: The number of runs.
      canary: True (or 1.0) for D, False (0.0) for D'.
      prep: :func:`prepare`'s result (computed if None).
      devices: The devices to shard the runs over (default every device of every process).
      progress: Called with a :class:`~cbdp_jax._src.infra.sharded_runs.Progress` after each block.
      release: The coordinates each run records beyond its score (:func:`make_run`); None: none.
      blocks: A checkpoint of these runs (:meth:`~cbdp_jax._src.infra.run_blocks.RunBlocks.part`), or
        None: the runs it holds are loaded, the others run and written into it.

    Returns:
      :class:`RunOutput` with a leading axis of n (numpy arrays), the same in every process.

    """
    check_key(key)
    n = check_int_at_least("runs", n, 1)
    prep = prepare(problem) if prep is None else prep
    side = float(canary) if problem.step_per_data_set else None

    lean = lean_batches.enabled()

    def build():
        return _engine(problem, prep, side, release, lean), {}

    # the last few run functions and their compiled programs kept: D and D' (and other keys) reuse them
    run, programs = remembered(_PROGRAMS, (problem, prep), (side, release, lean), build, keep=4)
    out = sharded_runs(
        run, key, n, np.float32(canary), devices=devices, max_chunk=problem.chunk,
        progress=progress, programs=programs, blocks=blocks,
    )  # fmt: skip
    return RunOutput(*out)


def _engine(problem: TrainingProblem, prep: Prepared, side, release, lean: bool):
    """The run function of :func:`training_runs`: lean Poisson batches where they apply."""
    run = make_run(problem, prep, side=side, release=release)
    steps = [problem.step_for(size) for size in _sizes(problem)]
    if not (lean and lean_batches.eligible(problem.sampler, steps)):
        return run
    n, sampler = prep.x.shape[0], problem.sampler
    full = sampler.capacity(n)

    def plan_for(block: int):
        return lean_batches.plan(n, float(sampler.rate), problem.steps, full, block)

    def lean_for(c: int):
        return make_run(problem, prep, side=side, release=release, batch_slots=c)

    return lean_batches.LeanRun(run, lean_for, plan_for)


_PROGRAMS: dict[tuple, tuple[tuple, Any]] = {}
