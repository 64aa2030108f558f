"""Sweeps: many adversaries trained and evaluated in one compiled program.

A sweep is the grid ``mechanisms x adversary classes x alphas x learning rates x seeds``; every point of
the grid is one *member*: one adversary trained on fresh samples of its own mechanism and evaluated on
its own independent held-out samples. Members whose adversaries have the same shape (the same class
with the same sizes: different seeds, or hyperparameters such as the random-feature bandwidth that only
change the initialisation) and whose mechanisms share a dimension form a *group*; a group runs as ONE
jitted program with ``jax.vmap`` over its members, in which the noise family (Laplace or Gaussian, both
transforms of one uniform draw), the noise scale (1/epsilon or sigma), the sensitivity vector, the order
alpha and the learning rate are traced arrays. Changing their values therefore never recompiles;
neither does a second call with the same shapes.

Per member (docs/theory/bounds.md), exactly as :func:`cbdp_jax.estimator.estimate` with fresh samples:

- P = M(0) and Q = M(v) (the canonical pair), sampled inside the compiled step with the member's scale:
  every optimiser step draws a new minibatch, so training memory does not grow with the step count.
- The training objective is the tight form where the class allows it (Donsker-Varadhan for KL; the
  scale-free Renyi form for cones) written with alpha as an array; early stopping keeps the parameters of
  the best value on a fixed validation sample, on which the constant (KL) or the sign and scale (alpha
  family) of the plain f-form are then fitted in closed form and moved, as in the estimator, to the point
  of the best validation lower confidence bound (:func:`~cbdp_jax._src.estimator.objectives.conservative_fit`).
- That fixed function is evaluated on independent fresh test samples streamed in chunks of
  ``eval_chunk`` rows per member; the chunk moments are merged on the host in float64
  (:class:`~cbdp_jax._src.estimator.evaluation.Moments`), giving the held-out estimate, its standard error and a
  one-sided CLT lower confidence bound, with the estimator's diagnostics.

Keys: :func:`train_sweep` splits its key into ``k_members, k_noise``; a member's initialisation and
validation keys derive from ``fold_in(k_members, seed)`` and the training noise of step i from
``fold_in(k_noise, i)`` (shared by all members; from the member key with ``shared_noise=False``).
:func:`evaluate_sweep` draws a member's test samples from ``fold_in(key, seed)``, and
:func:`estimate_sweep` is the two with ``k_train, k_test = split(key)``. Members that differ only in
mechanism, class, alpha or learning rate thus share their initial key and their standardised noise
draws -- common random numbers, which make differences along the grid less noisy -- and a member's
result does not depend on which other members are in the sweep or on how it is cut into batches.

Scale: a group larger than ``max_batch`` members is cut into batches of ``max_batch`` (the last one
padded by repeating a member), all of one shape, so one compilation serves them all.

Multiple devices: the member axis of every batch is sharded over ``jax.devices()`` with a
``NamedSharding`` of a one-dimensional ``Mesh`` (axis ``'members'``); ``max_batch`` is rounded up to a
multiple of the device count. Members never communicate, so the program runs without collectives and
the results equal a one-device run (up to floating-point reassociation).

Multiple hosts: call ``jax.distributed.initialize()`` in every process before any other JAX call (on
Cloud TPU and SLURM / Open MPI clusters it needs no arguments; elsewhere pass ``coordinator_address``,
``num_processes`` and ``process_id``), then run the same script with the same key and grid in every
process. ``jax.devices()`` then lists the devices of all hosts, the mesh spans them all, every process
builds the same (deterministic) inputs and contributes its own shards
(``jax.make_array_from_callback``), and results are gathered to every process with
``multihost_utils.process_allgather``; write files from ``jax.process_index() == 0`` only.
:mod:`cbdp_jax._src.infra.launch` starts such a job on one machine (N local processes, gloo CPU collectives)
and :mod:`cbdp_jax._src.estimator.sweep_job` runs a sweep in it as resumable units (``cbdp sweep --processes N``).

Layout: this module holds the entry points; :mod:`sweep_types` the configuration and result types,
:mod:`sweep_plan` the grid cut into groups and batches, :mod:`sweep_programs` the compiled training
and evaluation programs, :mod:`sweep_certify` the host-side bounds and result rows.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from cbdp_jax._src.estimator.adversaries import AdversarySpec
from cbdp_jax._src.estimator.sweep_certify import _batch_rows, _evaluate_batch
from cbdp_jax._src.estimator.sweep_plan import (
    _batches,
    _check_max_batch,
    _member_arrays,
    _mesh,
    _model_static,
    _Plan,
    _plan,
    _put,
    _spec_trainer,
)
from cbdp_jax._src.estimator.sweep_programs import _init_program, _select_members, _train_program
from cbdp_jax._src.estimator.sweep_types import SweepConfig, SweepTraining, TrainedBatch
from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    check_int_at_least,
    check_key,
)
from cbdp_jax._src.statistics.bounds import z_quantile


def _train_batches(
    plan: _Plan, key: jax.Array, *, max_batch: int, devices
) -> Iterator[TrainedBatch]:
    devices, sharding = _mesh(devices)
    k_members, k_noise = jax.random.split(key)
    replicated = NamedSharding(sharding.mesh, PartitionSpec())
    noise_key_data = _put(np.asarray(jax.random.key_data(k_noise)), replicated)
    z = _put(np.asarray(z_quantile(plan.config.confidence), plan.config.dtype), replicated)
    for group in plan.groups:
        static = group.static
        for idx in _batches(group.members, max_batch, len(devices)):
            inputs = _put(_member_arrays(plan, idx, k_members), sharding)
            model = _model_static(static)
            inits = [
                _init_program(inputs, trainer=_spec_trainer(s, static), static=model)
                for s in group.specs
            ]
            if len(inits) == 1:
                state = inits[0]
            else:
                which = [group.specs.index(plan.members[i].adversary) for i in idx]
                state = _select_members(_put(np.asarray(which), sharding), inits)
            output = _train_program(inputs, state, noise_key_data, z, static=static)
            n_real = len(dict.fromkeys(idx))
            yield TrainedBatch(static, idx, n_real, inputs, output)


# --------------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------------


def train_sweep(
    key: jax.Array,
    mechanisms: Any,
    *,
    adversaries: AdversarySpec | str | Sequence[AdversarySpec | str] = "linear",
    divergence: str = "kl",
    alphas: float | Sequence[float] | None = None,
    seeds: int | Sequence[int] = 1,
    learning_rates: Sequence[float] | None = None,
    convention: str = "abs",
    config: SweepConfig = SweepConfig(),  # noqa: B008 (frozen, immutable)
    max_batch: int = 256,
    devices: Sequence[Any] | None = None,
    **adversary_options: Any,
) -> SweepTraining:
    """Trains every member of the grid, a batch of same-shape adversaries per compiled call.

    Args:
      key: A typed PRNG key (see the module docstring for how member keys derive from it).
      mechanisms: A :class:`~cbdp_jax.mechanisms.LaplaceMechanism` or
        :class:`~cbdp_jax.mechanisms.GaussianMechanism` (no query), or a sequence of them (e.g. a grid of
        epsilons or sigmas). Both families share one program; different dimensions form separate
        groups.
      adversaries: Classes: ``AdversarySpec`` objects or names (completed by ``adversary_options``).
        Classes of one shape share a compiled program; others form separate groups.
      divergence: ``'kl'``, ``'renyi'`` or ``'alpha'``.
      alphas: The orders for ``'renyi'`` / ``'alpha'`` (None for KL).
      seeds: A number of seeds (``range(seeds)``) or the seeds themselves.
      learning_rates: A grid of Adam step sizes (default ``(config.learning_rate,)``).
      convention: The alpha family's conjugate convention (``'abs'`` or ``'nonneg'``).
      config: Training and evaluation settings.
      max_batch: Most members per compiled call (rounded up to a multiple of the device count).
      devices: Devices of the member mesh (default: ``jax.devices()``, all processes' devices).
      **adversary_options: Fields of :class:`AdversarySpec` for classes given by name.

    Returns:
      A :class:`SweepTraining` (parameters stay on the devices, sharded along the member axis).

    Raises:
      InvalidParameterError: For an unsupported mechanism or divergence, bad grids or sizes.

    """
    t0 = time.perf_counter()
    _check_max_batch(max_batch)
    plan = _plan(
        key,
        mechanisms,
        adversaries=adversaries,
        divergence=divergence,
        alphas=alphas,
        seeds=seeds,
        learning_rates=learning_rates,
        convention=convention,
        config=config,
        adversary_options=adversary_options,
    )
    devs, _ = _mesh(devices)
    batches = tuple(_train_batches(plan, key, max_batch=max_batch, devices=devs))
    jax.block_until_ready([b.output for b in batches])
    return SweepTraining(
        plan.members,
        batches,
        divergence,
        convention,
        config,
        devs,
        time.perf_counter() - t0,
    )


def evaluate_sweep(
    key: jax.Array, training: SweepTraining, *, test_samples: int | None = None
) -> list[dict[str, Any]]:
    """Held-out estimates of every trained member on fresh test samples (key ``fold_in(key, seed)``).

    Args:
      key: A typed PRNG key, independent of the training key.
      training: The output of :func:`train_sweep`.
      test_samples: Held-out samples per side per member (default ``training.config.test_samples``).

    Returns:
      The result table: one dict per member, in sweep order (see :func:`estimate_sweep`).

    """
    check_key(key)
    impl = str(jax.random.key_impl(key))
    trained_impl = training.batches[0].static.key_impl if training.batches else impl
    if impl != trained_impl:
        raise InvalidParameterError(
            f"key is invalid: its PRNG implementation is {impl!r} but the sweep was trained with "
            f"{trained_impl!r}; evaluate with a key of the same implementation, e.g. "
            f"jax.random.key(seed, impl={trained_impl!r})"
        )
    config = training.config
    n = check_int_at_least(
        "test_samples", config.test_samples if test_samples is None else test_samples, 2
    )
    plan = _Plan(
        training.members,
        (),
        training.divergence,
        training.convention,
        config,
        impl,
    )
    _, sharding = _mesh(training.devices)
    rows: list[dict[str, Any]] = []
    for batch in training.batches:
        held = _evaluate_batch(batch, plan, key, n, config.eval_chunk, sharding)
        rows.extend(_batch_rows(batch, plan, held))
    return sorted(rows, key=lambda r: r["member"])


def estimate_sweep(
    key: jax.Array,
    mechanisms: Any,
    *,
    adversaries: AdversarySpec | str | Sequence[AdversarySpec | str] = "linear",
    divergence: str = "kl",
    alphas: float | Sequence[float] | None = None,
    seeds: int | Sequence[int] = 1,
    learning_rates: Sequence[float] | None = None,
    convention: str = "abs",
    config: SweepConfig = SweepConfig(),  # noqa: B008 (frozen, immutable)
    max_batch: int = 256,
    devices: Sequence[Any] | None = None,
    **adversary_options: Any,
) -> list[dict[str, Any]]:
    """Trains and evaluates every member of the grid; memory is bounded by one batch.

    Equal to ``evaluate_sweep(k_test, train_sweep(k_train, ...))`` with ``k_train, k_test =
    jax.random.split(key)``, but each batch is evaluated and dropped before the next is trained.

    Args:
      key: A typed PRNG key (``jax.random.key(seed)``).
      mechanisms: See :func:`train_sweep`.
      adversaries: See :func:`train_sweep`.
      divergence: ``'kl'``, ``'renyi'`` or ``'alpha'``.
      alphas: The orders (None for KL).
      seeds: A number of seeds or the seeds themselves.
      learning_rates: A grid of Adam step sizes.
      convention: The alpha family's conjugate convention.
      config: Training and evaluation settings.
      max_batch: Most members per compiled call (rounded up to a multiple of the device count).
      devices: Devices of the member mesh (default ``jax.devices()``).
      **adversary_options: Fields of :class:`AdversarySpec` for classes given by name.

    Returns:
      One dict per member, in sweep order, with the member's parameters (``mechanism``, ``family``,
      ``param_name`` / ``param`` (epsilon or sigma), ``noise_scale``, ``adversary``, ``divergence``,
      ``alpha``, ``learning_rate``, ``seed``), the held-out ``estimate``, one-sided ``lower_bound`` and
      ``std_error`` on the reported scale (``f_*`` on the f-divergence scale), ``val_objective`` (the
      best validation value of the training objective, for choosing among seeds with
      :func:`select_best`), ``finite``, ``heavy_tail_share`` and ``warnings``.

    Raises:
      InvalidParameterError: For an unsupported mechanism or divergence, bad grids or sizes.

    Examples:
      >>> import jax
      >>> from cbdp_jax.mechanisms import LaplaceMechanism
      >>> cfg = SweepConfig(steps=300, batch_size=1024, test_samples=20_000)
      >>> rows = estimate_sweep(jax.random.key(0), [LaplaceMechanism(epsilon=e) for e in (0.5, 1.0)],
      ...                       adversaries="linear", divergence="renyi", alphas=(2.0, 4.0), config=cfg)
      >>> len(rows), rows[0]["param"], rows[0]["alpha"]
      (4, 0.5, 2.0)

    """
    _check_max_batch(max_batch)
    k_train, k_test = jax.random.split(check_key(key))
    plan = _plan(
        k_train,
        mechanisms,
        adversaries=adversaries,
        divergence=divergence,
        alphas=alphas,
        seeds=seeds,
        learning_rates=learning_rates,
        convention=convention,
        config=config,
        adversary_options=adversary_options,
    )
    devs, sharding = _mesh(devices)
    rows: list[dict[str, Any]] = []
    for batch in _train_batches(plan, k_train, max_batch=max_batch, devices=devs):
        n = config.test_samples
        held = _evaluate_batch(batch, plan, k_test, n, config.eval_chunk, sharding)
        rows.extend(_batch_rows(batch, plan, held))
    return sorted(rows, key=lambda r: r["member"])


_IDENTITY = ("mechanism", "adversary_index", "divergence", "alpha", "learning_rate")


def select_best(
    rows: Sequence[dict[str, Any]], by: Sequence[str] = _IDENTITY
) -> list[dict[str, Any]]:
    """For each grid point, the row with the best validation objective.

    Grid points are told apart by the fields ``by`` (all but the seed by default). The choice uses
    validation samples only, which are independent of each member's test samples, so the selected
    row's held-out estimate and bound stay honest (docs/theory/bounds.md).
    """
    best: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        k = tuple(row[f] for f in by)
        if k not in best or row["val_objective"] > best[k]["val_objective"]:
            best[k] = row
    return list(best.values())
