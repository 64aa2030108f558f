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
  of the best validation lower confidence bound (:func:`~cbdp_jax._src.objectives.conservative_fit`).
- That fixed function is evaluated on independent fresh test samples streamed in chunks of
  ``eval_chunk`` rows per member; the chunk moments are merged on the host in float64
  (:class:`~cbdp_jax._src.evaluation.Moments`), giving the held-out estimate, its standard error and a
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
:mod:`cbdp_jax._src.launch` starts such a job on one machine (N local processes, gloo CPU collectives)
and :mod:`cbdp_jax._src.sweep_job` runs a sweep in it as resumable units (``cbdp sweep --processes N``).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from cbdp_jax._src.adversaries import (
    ADVERSARY_NAMES,
    AdversarySpec,
    CustomAdversary,
    check_option_applies,
    make_adversary,
    options_for,
)
from cbdp_jax._src.adversary_fitting_ensemble import (
    apply_fn,
    early_stopping_scan,
    shared_counts,
    state_axes,
)
from cbdp_jax._src.certification import (
    GUARANTEE_CHOICES,
    bound_fields,
    cap_for,
    describe,
    diagnostics,
    interval_support,
    predicted_bound_from_moments,
    resolve_guarantee,
    shrink_for_tails_traced,
    tail_target,
)
from cbdp_jax._src.core import (
    Trainer,
    TrainState,
    cached_trainer,
    closed_form_fit,
    objective_kind,
    set_learning_rate,
    spec_properties,
)
from cbdp_jax._src.core import fit as core_fit
from cbdp_jax._src.divergences import Divergence, get_divergence
from cbdp_jax._src.mechanisms import (
    GaussianMechanism,
    LaplaceMechanism,
    Mechanism,
    canonical_pair_from_uniforms,
    pair_uniforms,
)
from cbdp_jax._src.objectives import kl_domain_reduction
from cbdp_jax._src.statistics import berry_esseen, held_out, selection, tails
from cbdp_jax._src.statistics import moments as mom
from cbdp_jax._src.statistics.bounds import Bound, family_confidence, z_quantile
from cbdp_jax._src.statistics.held_out import TAIL_MARGIN
from cbdp_jax._src.validation import (
    InvalidParameterError,
    check_alpha,
    check_choice,
    check_in_range,
    check_int_at_least,
    check_key,
    check_positive,
)

SWEEP_DIVERGENCES = ("kl", "renyi", "alpha")
MEMBER_AXIS = "members"
# The training-stream index of the draw the closed-form fit uses: no optimiser step reaches it.
FIT_INDEX = 2**32 - 1

# Incremented each time a sweep program is traced: tests use it to prove that a second call with the
# same shapes does not recompile. ``init`` counts the (tiny) initialisation program, compiled once per
# adversary class.


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepConfig:
    """How every member of a sweep is trained and evaluated. Frozen and hashable.

    Attributes:
      steps: Optimiser steps per member (rounded down to a multiple of ``eval_every``).
      eval_every: Steps between validation checks (early stopping granularity).
      batch_size: Fresh minibatch size per side per step.
      learning_rate: Adam's step size when the sweep gives no ``learning_rates`` grid.
      val_samples: Validation samples per side per member (early stopping and the closed-form fit).
      test_samples: Held-out samples per side per member.
      eval_chunk: Held-out rows per side per member in one compiled evaluation call (the last chunk
        is masked, so every sample size shares one compilation). Memory of a call grows like
        ``max_batch * eval_chunk * (d + hidden width)``; it also fixes which samples chunk i draws,
        so results depend on it (not on ``max_batch``).
      confidence: Level 1 - delta of the one-sided lower confidence bound.
      family_size: Each member's bound is one of ``family_size`` simultaneous bounds, taken at level
        1 - delta / family_size (Bonferroni).
      tight: Train with the tight forms of docs/theory/objectives.md where the class allows it.
      dtype: ``'float32'`` or ``'float64'`` (needs ``jax_enable_x64``).
      guarantee: ``'asymptotic'`` (the CLT bound, refused when the held-out tails look infinite),
        ``'finite-sample'`` (bounded classes only: ``bound=B``; no assumption), or ``'auto'`` /
        ``'class'`` (finite-sample for bounded classes, asymptotic otherwise: every member's bound
        is on its own class; unlike the estimator's ``'auto'``, the sweep never falls back to the
        bounded version of an unbounded class). See docs/theory/bounds.md.
      finite_sample_method: ``'berry-esseen'`` (streams: moments only), ``'betting'`` (keeps a
        batch's paired differences on the host: ``max_batch x test_samples`` floats), or ``'auto'``
        (per member, the one predicted tighter from its validation differences).
      tail_margin: The asymptotic bound's tail check needs index >= 2 + tail_margin. For a cone, each
        member's critic is first shrunk on validation data (t * h, as in the estimator) until it
        clears the check; rows report ``tail_shrink``.
      shared_noise: All members draw the same standard noise at a given training step, each scaling
        it by its own noise scale and shifting it to its own centre -- as the estimator's ensemble
        shares its minibatches. vmap then computes the draw once per step for the whole batch (the
        random numbers dominate the cost of small adversaries). False: every member draws its own
        (seeds are then independent replicates of the training data too, at one draw per member).
        Validation and test samples are always the member's own.

    """

    steps: int = 2000
    eval_every: int = 100
    batch_size: int = 4096
    learning_rate: float = 1e-2
    val_samples: int = 8192
    test_samples: int = 100_000
    eval_chunk: int = 16384
    confidence: float = 0.95
    family_size: int = 1
    tight: bool = True
    dtype: str = "float32"
    shared_noise: bool = True
    guarantee: str = "auto"
    finite_sample_method: str = "auto"
    tail_margin: float = TAIL_MARGIN

    def __post_init__(self):
        check_int_at_least("steps", self.steps, 1)
        check_int_at_least("eval_every", self.eval_every, 1)
        check_int_at_least("batch_size", self.batch_size, 2)
        check_positive("learning_rate", self.learning_rate)
        check_int_at_least("val_samples", self.val_samples, 2)
        check_int_at_least("test_samples", self.test_samples, 2)
        check_int_at_least("eval_chunk", self.eval_chunk, 1)
        check_in_range("confidence", self.confidence, 0.5, 1.0, high_open=True)
        check_int_at_least("family_size", self.family_size, 1)
        check_choice("dtype", self.dtype, ("float32", "float64"))
        check_choice("guarantee", self.guarantee, GUARANTEE_CHOICES)
        check_choice(
            "finite_sample_method", self.finite_sample_method, ("auto", "berry-esseen", "betting")
        )
        check_in_range("tail_margin", self.tail_margin, 0.0, 10.0)
        if self.dtype == "float64" and not jax.config.jax_enable_x64:
            raise InvalidParameterError(
                "dtype='float64' needs 64-bit JAX: call jax.config.update('jax_enable_x64', True) first"
            )

    @property
    def blocks(self) -> int:
        """The number of evaluation blocks."""
        return max(self.steps // self.eval_every, 1)

    @property
    def block_steps(self) -> int:
        """Optimiser steps per block."""
        return min(self.eval_every, self.steps)


class Member(NamedTuple):
    """One point of the sweep grid.

    Attributes:
      index: Position in the sweep (the row order of the result table).
      mechanism: A Laplace or Gaussian mechanism; P = M(0), Q = M(v) with v its sensitivity.
      adversary: The adversary class.
      adversary_index: Its position in the sweep's ``adversaries`` (labels need not be unique, e.g.
        random features of two bandwidths).
      alpha: The order (None for KL).
      learning_rate: Adam's step size.
      seed: The seed; the member's keys derive from ``fold_in(k_members, seed)`` (module docstring).
      note: Why the class is trained reduced (``objectives.kl_domain_reduction``), else None; the
        member's row starts its warnings with it.

    """

    index: int
    mechanism: LaplaceMechanism | GaussianMechanism
    adversary: AdversarySpec
    adversary_index: int
    alpha: float | None
    learning_rate: float
    seed: int
    note: str | None = None


class _Static(NamedTuple):
    """Everything static about a group's compiled programs (hashable; no values that vary per member)."""

    trainer: Trainer
    graphdef: Any
    family: str
    divergence: str
    convention: str
    objective: str
    dim: int
    dtype: str
    key_impl: str
    blocks: int
    block_steps: int
    batch_size: int
    val_samples: int
    shared_noise: bool
    tail_need: float = 0.0


class MemberInputs(NamedTuple):
    """Per-member arrays of a batch (leading axis = members).

    Attributes:
      key_data: Raw key data of ``fold_in(key, seed)``, ``[M, k]`` uint32.
      alpha: The order, ``[M]`` (NaN for KL, unused).
      noise_scale: Laplace scale 1/epsilon or Gaussian sigma, ``[M]``.
      sensitivity: The centre v of Q, ``[M, d]``.
      learning_rate: Adam's step size, ``[M]``.
      gaussian: Whether the member's noise is Gaussian (else Laplace), ``[M]`` bool.

    """

    key_data: Any
    alpha: Any
    noise_scale: Any
    sensitivity: Any
    learning_rate: Any
    gaussian: Any


class MemberTraining(NamedTuple):
    """Output of the training program (leading axis = members).

    Attributes:
      params: Trainable parameters at the best validation value.
      rest: Non-trainable state (input standardisation, fixed random features).
      scale: Fitted scale of the evaluated function ``scale * h + shift``, ``[M]``.
      shift: Fitted shift, ``[M]``.
      best_value: Best validation value of the training objective, ``[M]``.
      finite: Whether training stayed finite, ``[M]``.
      train_curve: Training objective at the end of each block, ``[M, blocks]``.
      val_curve: Validation objective after each block, ``[M, blocks]``.
      centres: Validation medians of the two f-form terms of the fitted function (the centres of the
        held-out tail sketches), ``[M, 2]``.
      val_z: Moments and pair moments of the fitted function's paired validation differences (to
        choose each member's finite-sample method before the test samples are drawn).
      tail_shrink: The factor t applied to the fitted critic on validation data so that its tails
        clear the asymptotic bound's check (``scale`` and ``shift`` are after it), ``[M]``; 1: none.
      plain: The closed-form ``(scale, shift)`` of each member, ``([M], [M])``: the critic the
        row's estimate is reported for (``scale`` / ``shift`` are the certified critic's).

    """

    params: Any
    rest: Any
    scale: Any
    shift: Any
    best_value: Any
    finite: Any
    train_curve: Any
    val_curve: Any
    centres: Any
    val_z: Any
    tail_shrink: Any
    plain: Any


class TrainedBatch(NamedTuple):
    """One trained batch: its members (padding included) and device-resident, sharded results."""

    static: _Static
    members: tuple[int, ...]
    n_real: int
    inputs: MemberInputs
    output: MemberTraining


@dataclasses.dataclass(frozen=True)
class SweepTraining:
    """Result of :func:`train_sweep`: trained members, still on their devices.

    Attributes:
      members: The grid points, in sweep order.
      batches: The trained batches (each sharded over ``devices`` along the member axis).
      divergence: The divergence name.
      convention: The alpha family's conjugate convention.
      config: The configuration used.
      devices: The devices of the mesh.
      seconds: Wall time of the training, compilation included.

    """

    members: tuple[Member, ...]
    batches: tuple[TrainedBatch, ...]
    divergence: str
    convention: str
    config: SweepConfig
    devices: tuple[Any, ...]
    seconds: float

    def _locate(self, index: int) -> tuple[TrainedBatch, int]:
        for batch in self.batches:
            if index in batch.members[: batch.n_real]:
                return batch, batch.members.index(index)
        raise IndexError(f"member {index} is not in this sweep")

    def function(self, index: int) -> Callable[[jax.Array], jax.Array]:
        """The fixed evaluated function ``x [n, d] -> scale * h(x) + shift [n]`` of member ``index``."""
        batch, pos = self._locate(index)
        take = lambda tree: jax.tree.map(lambda x: jnp.asarray(_to_host(x)[pos]), tree)  # noqa: E731
        out = batch.output
        params, rest = take(out.params), take(out.rest)
        scale, shift = take(out.scale), take(out.shift)
        graphdef = batch.static.graphdef
        return lambda x: scale * apply_fn(graphdef, params, rest, jnp.asarray(x)) + shift

    def best_values(self) -> np.ndarray:
        """The best validation objective of every member, ``[members]`` (host array)."""
        out = np.empty(len(self.members))
        for batch in self.batches:
            vals = _to_host(batch.output.best_value)
            out[list(batch.members[: batch.n_real])] = vals[: batch.n_real]
        return out


# --------------------------------------------------------------------------------------------------
# The divergence (each member's order is traced)
# --------------------------------------------------------------------------------------------------


def _divergence(static: _Static) -> Divergence:
    """The group's divergence; its order is a placeholder (each member passes its own, traced)."""
    return Divergence(
        static.divergence, 2.0 if static.divergence != "kl" else None, static.convention
    )


# --------------------------------------------------------------------------------------------------
# Per-member programs
# --------------------------------------------------------------------------------------------------


def _standardisation(static: _Static, inp: MemberInputs):
    """Population mean and standard deviation of the pooled sample (P and Q in equal parts)."""
    dt = jnp.dtype(static.dtype)
    scale, v = inp.noise_scale.astype(dt), inp.sensitivity.astype(dt)
    laplace_var, gauss_var = 2.0 * scale**2, scale**2
    if static.family == "laplace":
        var = laplace_var
    elif static.family == "gaussian":
        var = gauss_var
    else:
        var = jnp.where(inp.gaussian, gauss_var, laplace_var)
    return v / 2.0, jnp.sqrt(var + v**2 / 4.0)


def _uniform(static: _Static, key, n: int) -> jax.Array:
    """Uniforms for ``n`` samples of each side (:func:`~cbdp_jax._src.mechanisms.pair_uniforms`)."""
    return pair_uniforms(key, n, static.dim, static.dtype)


def _place(static: _Static, u: jax.Array, inp: MemberInputs) -> jax.Array:
    """Samples of P = M(0) and Q = M(v), ``[2, n, d]``, with the member's noise from uniforms ``u``."""
    return canonical_pair_from_uniforms(
        u,
        family=static.family,
        gaussian=inp.gaussian,
        noise_scale=inp.noise_scale,
        sensitivity=inp.sensitivity,
    )


def _draw_pair(static: _Static, key, n: int, inp: MemberInputs) -> jax.Array:
    """``n`` fresh samples of P and of Q, ``[2, n, d]``, with the member's noise scale."""
    return _place(static, _uniform(static, key, n), inp)


def _outputs(static: _Static, params, rest, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The adversary on both sides ``x [2, n, d]`` in one pass (fewer, larger matrix products)."""
    n = x.shape[1]
    h = apply_fn(static.graphdef, params, rest, x.reshape(2 * n, x.shape[2]))
    return h[:n], h[n:]


def _member_keys(static: _Static, key_data) -> tuple[jax.Array, jax.Array, jax.Array]:
    key = jax.random.wrap_key_data(key_data, impl=static.key_impl)
    k_init, k_val, k_train = jax.random.split(key, 3)
    return k_init, k_val, k_train


def _train_batch(
    static: _Static, inputs: MemberInputs, state: TrainState, noise_key_data, z
) -> MemberTraining:
    """Trains a batch of members on fresh minibatches with early stopping; see the module docstring.

    The core's ``step`` and ``value`` (:mod:`cbdp_jax._src.core`, the estimator's too), vmapped over the
    members with each member's order alpha and step size traced, inside
    :func:`~cbdp_jax._src.adversary_fitting_ensemble.early_stopping_scan`. With ``static.shared_noise`` the step's
    standard noise is drawn once, outside the vmap, and every member scales it by its own noise scale.
    """
    trainer, div = static.trainer, _divergence(static)
    dt = jnp.dtype(static.dtype)
    _, k_val, k_train = jax.vmap(functools.partial(_member_keys, static))(inputs.key_data)
    val_x = jax.vmap(lambda k, inp: _draw_pair(static, k, static.val_samples, inp))(k_val, inputs)
    # The closed-form fit uses its own draw from the training stream (an index no step reaches).
    fit_x = jax.vmap(
        lambda k, inp: _draw_pair(static, jax.random.fold_in(k, FIT_INDEX), static.val_samples, inp)
    )(k_train, inputs)
    noise_key = jax.random.wrap_key_data(noise_key_data, impl=static.key_impl)
    state = state._replace(
        opt_state=shared_counts(set_learning_rate(state.opt_state, inputs.learning_rate))
    )
    axes = state_axes(trainer, state)

    def member_step(st, inp, k, noise, i):
        if noise is None:
            x = _draw_pair(static, jax.random.fold_in(k, i), static.batch_size, inp)
        else:
            x = _place(static, noise, inp)
        st, info = trainer.step(k, st, (x[0], x[1]), inp.alpha.astype(dt))
        return st, info.value

    vstep = jax.vmap(member_step, in_axes=(axes, 0, 0, None, None), out_axes=(axes, 0))
    vvalue = jax.vmap(
        lambda st, inp, x: trainer.value(st, (x[0], x[1]), inp.alpha.astype(dt)),
        in_axes=(axes, 0, 0),
    )

    def step(st, i):
        noise = None
        if static.shared_noise:
            noise = _uniform(static, jax.random.fold_in(noise_key, i), static.batch_size)
        return vstep(st, inputs, k_train, noise, i)

    best_p, best_v, finite, train_c, val_c = early_stopping_scan(
        step,
        lambda st: vvalue(st, inputs, val_x),
        state,
        jnp.arange(static.blocks * static.block_steps).reshape(static.blocks, static.block_steps),
    )

    def member_fit(p_, r_, inp, xf, xv):
        return core_fit(
            trainer, div, p_, r_, (xf[0], xf[1]), (xv[0], xv[1]), z, inp.alpha.astype(dt)
        )

    def member_plain(p_, r_, inp, xf):
        return closed_form_fit(trainer, div, p_, r_, (xf[0], xf[1]), inp.alpha.astype(dt))

    rest = state.rest
    scale, shift = jax.vmap(member_fit)(best_p, rest, inputs, fit_x, val_x)
    plain = jax.vmap(member_plain)(best_p, rest, inputs, fit_x)

    # The class's raw outputs on the validation samples, once: the shrink and the statistics use them.
    hv_p, hv_q = jax.vmap(functools.partial(_outputs, static))(best_p, rest, val_x)
    shrink = jnp.ones_like(scale)
    if static.tail_need > 0:

        def member_shrink(inp, hp, hq, hf_q, sc, sh):
            return shrink_for_tails_traced(
                div,
                inp.alpha.astype(dt),
                static.objective,
                h_val_p=hp,
                h_val_q=hq,
                h_fit_q=hf_q,
                scale=sc,
                shift=sh,
                need=static.tail_need,
            )

        hf_q = jax.vmap(trainer.apply)(best_p, rest, fit_x[:, 1])
        scale, shift, shrink = jax.vmap(member_shrink)(inputs, hv_p, hv_q, hf_q, scale, shift)

    def validation_stats(inp, hp, hq, sc, sh):
        t_p = sc * hp + sh
        t_q = div.conjugate(sc * hq + sh, inp.alpha.astype(dt))
        z_val = t_p - t_q
        # Tail-sketch centres as certification.centres_of: the median of h(X), inf f* for f*(h(Y)).
        inf_q = jnp.asarray(div.conjugate_inf(inp.alpha.astype(dt)), t_p.dtype)
        centre = jnp.stack([selection.median(t_p), inf_q])
        return centre, (mom.of(z_val), berry_esseen.pair_moments(z_val))

    cent, val_z = jax.vmap(validation_stats)(inputs, hv_p, hv_q, scale, shift)
    return MemberTraining(
        best_p, rest, scale, shift, best_v, finite, train_c.T, val_c.T, cent, val_z, shrink, plain
    )


def _member_evaluate(
    static: _Static,
    chunk: int,
    keep: bool,
    inp,
    test_key_data,
    params,
    rest,
    scale,
    shift,
    centres,
    plain,
    index,
    n_valid,
):
    """Held-out statistics of the two f-form terms on one chunk of fresh samples (one member).

    The certified critic ``scale * h + shift`` gives every statistic of the bound; the closed-form
    critic ``plain`` only the moments of its terms (the row's estimate).
    """
    key = jax.random.wrap_key_data(test_key_data, impl=static.key_impl)
    h_p, h_q = _outputs(
        static, params, rest, _draw_pair(static, jax.random.fold_in(key, index), chunk, inp)
    )
    conjugate = _divergence(static).conjugate
    alpha = inp.alpha.astype(h_q.dtype)
    t_p = scale * h_p + shift
    t_q = conjugate(scale * h_q + shift, alpha)
    mask = jnp.arange(chunk) < n_valid
    z = jnp.where(mask, t_p - t_q, 0.0)
    named_p = plain[0] * h_p + plain[1]
    named_q = conjugate(plain[0] * h_q + plain[1], alpha)
    out = (
        mom.of(t_p, mask),
        mom.of(t_q, mask),
        mom.of(z, mask),
        berry_esseen.pair_moments(z, mask),
        tails.sketch(t_p, centres[0], tails.DEFAULT_CAPACITY, mask),
        tails.sketch(t_q, centres[1], tails.DEFAULT_CAPACITY, mask),
        mom.of(named_p, mask),
        mom.of(named_q, mask),
    )
    return out + ((z,) if keep else ())


# --------------------------------------------------------------------------------------------------
# Compiled programs (vmapped over members)
# --------------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("trainer", "static"))
def _init_program(inputs: MemberInputs, **statics) -> TrainState:
    """The compiled initialisation program: :func:`_init_body`, looked up when traced.

    Every compiled program here calls its body through a module global, so a test can wrap the body
    with ``chex.assert_max_traces`` (a body runs only when its program is traced).
    """
    return _init_body(inputs, **statics)


def _init_body(inputs: MemberInputs, *, trainer: Trainer, static: _Static) -> TrainState:

    def one(inp):
        k_init, _, _ = _member_keys(static, inp.key_data)
        loc, std = _standardisation(static, inp)
        return trainer.init_standardised(k_init, loc, std)

    return jax.vmap(one)(inputs)


@jax.jit
def _select_members(index, trees):
    """Per member, the tree ``trees[index[m]]`` (classes of one shape initialised separately)."""

    def pick(*leaves):
        out = leaves[0]
        for j, leaf in enumerate(leaves[1:], start=1):
            m = (index == j).reshape(index.shape + (1,) * (leaf.ndim - 1))
            out = jnp.where(m, leaf, out)
        return out

    return jax.tree.map(pick, *trees)


@functools.partial(jax.jit, static_argnames=("static",))
def _train_program(
    inputs: MemberInputs, state: TrainState, noise_key_data, z, *, static: _Static
) -> MemberTraining:
    return _train_batch(static, inputs, state, noise_key_data, z)


@functools.partial(jax.jit, static_argnames=("static", "chunk", "keep"))
def _evaluate_program(
    inputs: MemberInputs,
    test_key_data,
    output: MemberTraining,
    index,
    n_valid,
    *,
    static,
    chunk,
    keep=False,
):
    fn = functools.partial(_member_evaluate, static, chunk, keep)
    return jax.vmap(fn, in_axes=(0, 0, 0, 0, 0, 0, 0, 0, None, None))(
        inputs,
        test_key_data,
        output.params,
        output.rest,
        output.scale,
        output.shift,
        output.centres,
        output.plain,
        index,
        n_valid,
    )


# --------------------------------------------------------------------------------------------------
# Host side: the grid, groups, batches, sharding
# --------------------------------------------------------------------------------------------------


def _to_host(x: jax.Array) -> np.ndarray:
    """A global array on this host (gathered across processes when it spans several hosts)."""
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _put(tree, sharding: NamedSharding):
    """Places host arrays (identical in every process) on the mesh, sharded along their first axis."""

    def one(x):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

    return jax.tree.map(one, tree)


def _as_mechanisms(mechanisms) -> tuple[LaplaceMechanism | GaussianMechanism, ...]:
    if isinstance(mechanisms, Mechanism):
        mechanisms = (mechanisms,)
    mechs = tuple(mechanisms)
    if not mechs:
        raise InvalidParameterError("mechanisms=() is invalid: give at least one mechanism")
    for m in mechs:
        if not isinstance(m, (LaplaceMechanism, GaussianMechanism)) or m.query is not None:
            raise InvalidParameterError(
                f"mechanisms entry {m!r} is invalid: a sweep samples the canonical pair of a "
                "LaplaceMechanism or GaussianMechanism without a query (P = M(0), Q = M(v))"
            )
    return mechs


def _as_specs(adversaries, options: dict[str, Any]) -> tuple[AdversarySpec, ...]:
    if isinstance(adversaries, (str, AdversarySpec, CustomAdversary)):
        adversaries = (adversaries,)
    names = [a for a in adversaries if not isinstance(a, (AdversarySpec, CustomAdversary))]
    for name in names:
        check_choice("adversary", name, ADVERSARY_NAMES)
    # Options are shared by the classes given by name: each takes those that apply to it, and an
    # option that applies to none of them is an error naming the option and the classes.
    for option, value in options.items():
        if value is not None and not any(option in options_for(n, options) for n in names):
            if not names:
                raise InvalidParameterError(
                    f"{option}={value!r} is invalid: adversary options complete classes given by "
                    "name, and every class here is an AdversarySpec"
                )
            check_option_applies(names[0], option, value)
    specs = tuple(
        a
        if isinstance(a, (AdversarySpec, CustomAdversary))
        else make_adversary(a, **options_for(a, options))
        for a in adversaries
    )
    if not specs:
        raise InvalidParameterError("adversaries=() is invalid: give at least one class")
    return specs


def _as_alphas(divergence: str, alphas) -> tuple[float | None, ...]:
    if divergence == "kl":
        if alphas is not None:
            raise InvalidParameterError(
                f"alphas={alphas!r} is invalid: KL has no order (leave alphas=None)"
            )
        return (None,)
    if alphas is None:
        raise InvalidParameterError(
            f"alphas=None is invalid: divergence={divergence!r} needs orders"
        )
    if isinstance(alphas, (int, float)):
        alphas = (alphas,)
    return tuple(check_alpha(a) for a in alphas)


def _as_seeds(seeds) -> tuple[int, ...]:
    if isinstance(seeds, int):
        return tuple(range(check_int_at_least("seeds", seeds, 1)))
    out = tuple(int(s) for s in seeds)
    if not out or len(set(out)) != len(out):
        raise InvalidParameterError(f"seeds={seeds!r} is invalid: must be distinct integers")
    return out


def _shape_signature(spec: AdversarySpec, dim: int, dtype) -> tuple[Any, Any]:
    abstract = nnx.eval_shape(lambda: spec.build(jax.random.key(0), dim, dtype=dtype))
    graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
    leaves, treedef = jax.tree.flatten((params, rest))
    return graphdef, (treedef, tuple((x.shape, str(x.dtype)) for x in leaves))


class _Group(NamedTuple):
    static: _Static
    specs: tuple[AdversarySpec, ...]
    members: tuple[int, ...]


class _Plan(NamedTuple):
    members: tuple[Member, ...]
    groups: tuple[_Group, ...]
    divergence: str
    convention: str
    config: SweepConfig
    key_impl: str


def _plan(
    key: jax.Array,
    mechanisms,
    *,
    adversaries,
    divergence: str,
    alphas,
    seeds,
    learning_rates,
    convention: str,
    config: SweepConfig,
    adversary_options: dict[str, Any],
) -> _Plan:
    check_key(key)
    check_choice("divergence", divergence, SWEEP_DIVERGENCES)
    check_choice("convention", convention, ("abs", "nonneg"))
    mechs = _as_mechanisms(mechanisms)
    # Every sweep mechanism has Laplace or Gaussian noise, so the KL rule depends on the class only.
    reduced = [
        kl_domain_reduction(mechs[0], s, divergence)
        for s in _as_specs(adversaries, adversary_options)
    ]
    specs = tuple(s for s, _ in reduced)
    notes = tuple(note for _, note in reduced)
    if config.guarantee == "finite-sample":
        for spec in specs:
            if spec.bound is None:
                raise InvalidParameterError(
                    f"guarantee='finite-sample' is invalid for the unbounded class {spec.label!r} in "
                    "a sweep: use a bounded class (bound=B), or the estimator, which chooses B on "
                    "validation data"
                )
    alpha_grid = _as_alphas(divergence, alphas)
    lrs = (config.learning_rate,) if learning_rates is None else tuple(learning_rates)
    lrs = tuple(check_positive("learning_rates", lr) for lr in lrs)
    seed_grid = _as_seeds(seeds)
    members = tuple(
        Member(i, m, s, j, a, lr, seed, notes[j])
        for i, (m, (j, s), a, lr, seed) in enumerate(
            itertools.product(mechs, enumerate(specs), alpha_grid, lrs, seed_grid)
        )
    )
    dtype = jnp.dtype(config.dtype)
    div_probe = get_divergence(
        divergence, alpha=2.0 if divergence != "kl" else None, convention=convention
    )
    groups: dict[Any, list[int]] = {}
    families: dict[Any, set[str]] = {}
    key_impl = str(jax.random.key_impl(key))
    signatures = {}
    for member in members:
        dim = member.mechanism.dim
        if (member.adversary, dim) not in signatures:
            signatures[member.adversary, dim] = _shape_signature(member.adversary, dim, dtype)
        graphdef, shapes = signatures[member.adversary, dim]
        kind = objective_kind(div_probe, spec_properties(member.adversary), config.tight)
        gkey = (dim, graphdef, shapes, kind)
        groups.setdefault(gkey, []).append(member.index)
        families.setdefault(gkey, set()).add(member.mechanism.family)
    out = []
    for gkey, idx in groups.items():
        dim, graphdef, _, kind = gkey
        fams = families[gkey]
        trainer = cached_trainer(
            members[idx[0]].adversary, div_probe, dim=dim, tight=config.tight, dtype=dtype
        )
        static = _Static(
            trainer=trainer,
            graphdef=graphdef,
            family=fams.pop() if len(fams) == 1 else "mixed",
            divergence=divergence,
            convention=convention,
            objective=kind,
            dim=dim,
            dtype=config.dtype,
            key_impl=key_impl,
            blocks=config.blocks,
            block_steps=config.block_steps,
            batch_size=config.batch_size,
            val_samples=config.val_samples,
            shared_noise=config.shared_noise,
            tail_need=_tail_need(tuple(members[i].adversary for i in idx), config),
        )
        group_specs = tuple(dict.fromkeys(members[i].adversary for i in idx))
        out.append(_Group(static, group_specs, tuple(idx)))
    return _Plan(members, tuple(out), divergence, convention, config, key_impl)


def _tail_need(specs: Sequence[AdversarySpec], config: SweepConfig) -> float:
    """The tail index a group's critics are shrunk to clear on validation data (0: no shrink).

    As in the estimator: only for cones (t h stays in the class) under the asymptotic guarantee.
    """
    asymptotic = all(resolve_guarantee(config.guarantee, s) == "asymptotic" for s in specs)
    if not (asymptotic and all(s.is_cone for s in specs)):
        return 0.0
    return tail_target(config.test_samples, config.tail_margin)


def _batches(members: Sequence[int], max_batch: int, n_devices: int) -> Iterator[tuple[int, ...]]:
    """Cuts a group into batches of one size (a multiple of the device count), padding the last."""
    size = min(max_batch, len(members))
    size = -(-size // n_devices) * n_devices
    for start in range(0, len(members), size):
        part = tuple(members[start : start + size])
        yield part + (part[-1],) * (size - len(part))


def _key_data(key: jax.Array, seeds: Sequence[int]) -> np.ndarray:
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.asarray(seeds, jnp.uint32))
    return np.asarray(jax.random.key_data(keys))


def _member_arrays(plan: _Plan, idx: Sequence[int], key: jax.Array) -> MemberInputs:
    members = [plan.members[i] for i in idx]
    return MemberInputs(
        key_data=_key_data(key, [m.seed for m in members]),
        alpha=np.array([np.nan if m.alpha is None else m.alpha for m in members]),
        noise_scale=np.array([m.mechanism.noise_scale for m in members]),
        sensitivity=np.array([m.mechanism.sensitivity for m in members]),
        learning_rate=np.array([m.learning_rate for m in members]),
        gaussian=np.array([m.mechanism.family == "gaussian" for m in members]),
    )


def _mesh(devices) -> tuple[tuple[Any, ...], NamedSharding]:
    devices = tuple(jax.devices() if devices is None else devices)
    if not devices:
        raise InvalidParameterError("devices=() is invalid: give at least one device")
    mesh = Mesh(np.asarray(devices, dtype=object), (MEMBER_AXIS,))
    return devices, NamedSharding(mesh, PartitionSpec(MEMBER_AXIS))


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
# Held-out evaluation and the result table
# --------------------------------------------------------------------------------------------------


def _spec_trainer(spec: AdversarySpec, static: _Static) -> Trainer:
    """The trainer that initialises members of ``spec`` (same shapes and step as the group's)."""
    # Initialisation does not depend on the training form, so tight is irrelevant here.
    return cached_trainer(spec, _divergence(static), dim=static.dim, dtype=jnp.dtype(static.dtype))


def _model_static(static: _Static) -> _Static:
    """The static fields that initialisation and evaluation depend on.

    The model and the noise, not the training budget: a new budget must not recompile them.
    """
    return static._replace(blocks=0, block_steps=0, batch_size=0, val_samples=0, shared_noise=False)


def _host_held_out(stats, n_valid: int) -> held_out.HeldOut:
    """Device chunk statistics of a batch ``[M, ...]`` as float64 host held-out statistics."""
    stats = jax.tree.map(_to_host, stats)
    p, q, z, pairs, tail_p, tail_q, named_p, named_q = stats[:8]
    z_samples = np.asarray(stats[8][:, :n_valid], np.float64) if len(stats) > 8 else None
    f64 = lambda m: mom.Moments(*(np.asarray(f, np.float64) for f in m))  # noqa: E731
    return held_out.HeldOut(
        f64(p),
        f64(q),
        f64(z),
        berry_esseen.PairMoments(f64(pairs.w), f64(pairs.v)),
        tails.TailSketch(np.asarray(tail_p.top, np.float64), np.asarray(tail_p.count)),
        tails.TailSketch(np.asarray(tail_q.top, np.float64), np.asarray(tail_q.count)),
        z_samples,
        held_out.Terms(f64(named_p), f64(named_q)),
    )


def _evaluate_batch(
    batch: TrainedBatch,
    plan: _Plan,
    test_key: jax.Array,
    n: int,
    chunk: int,
    sharding: NamedSharding,
) -> held_out.HeldOut:
    """Streams ``n`` held-out samples per side per member; returns the merged statistics ``[M, ...]``."""
    seeds = [plan.members[i].seed for i in batch.members]
    test_kd = _put(_key_data(test_key, seeds), sharding)
    keep = "betting" in _member_methods(batch, plan)
    # Always the full chunk shape (the last chunk masked), so every sample size shares one compilation.
    acc = None
    for index, start in enumerate(range(0, n, chunk)):
        valid = min(chunk, n - start)
        stats = _evaluate_program(
            batch.inputs,
            test_kd,
            batch.output,
            np.int32(index),
            np.int32(valid),
            static=_model_static(batch.static),
            chunk=chunk,
            keep=keep,
        )
        part = _host_held_out(stats, valid)
        acc = part if acc is None else held_out.merge(acc, part)
    return acc


def _member_methods(batch: TrainedBatch, plan: _Plan) -> list[str]:
    """Each real member's bound method, decided from its validation statistics (never the test data)."""
    config = plan.config
    out = batch.output
    scale, shift = _to_host(out.scale), _to_host(out.shift)
    zm, zp = jax.tree.map(_to_host, out.val_z)
    methods = []
    for j, i in enumerate(batch.members[: batch.n_real]):
        member = plan.members[i]
        if resolve_guarantee(config.guarantee, member.adversary) != "finite-sample":
            methods.append("clt")
            continue
        if config.finite_sample_method != "auto":
            methods.append(config.finite_sample_method)
            continue
        div = get_divergence(plan.divergence, alpha=member.alpha, convention=plan.convention)
        lo, hi = _member_support(div, member.adversary, float(scale[j]), float(shift[j]))
        pairs = berry_esseen.PairMoments(mom.take(zp.w, j), mom.take(zp.v, j))
        level = family_confidence(config.confidence, config.family_size)
        _, method = predicted_bound_from_moments(
            mom.take(zm, j), pairs, lo, hi, config.test_samples, level
        )
        methods.append(method)
    return methods


def _member_support(div, spec: AdversarySpec, scale: float, shift: float) -> tuple[float, float]:
    """The range of the paired differences of a bounded member's fitted critic scale * h + shift."""
    lo_h, hi_h = shift - abs(scale) * spec.bound, shift + abs(scale) * spec.bound
    return interval_support(div, lo_h, hi_h)


def _certify_member(
    member: Member,
    held: held_out.HeldOut,
    scale: float,
    shift: float,
    config: SweepConfig,
    div,
    method: str,
) -> tuple[Bound, held_out.TailCheck, float]:
    """A member's bound under the sweep's guarantee; returns it, the tail check and the cap."""
    guarantee = resolve_guarantee(config.guarantee, member.adversary)
    n = int(min(float(held.p.count), float(held.q.count)))
    cap = cap_for(div, n, config.confidence)
    support = None
    if guarantee == "finite-sample":
        support = _member_support(div, member.adversary, scale, shift)
    bound, check = held_out.certify(
        held,
        guarantee=guarantee,
        confidence=config.confidence,
        family_size=config.family_size,
        method=method,
        support=support,
        cap=cap,
        tail_margin=config.tail_margin,
    )
    return bound, check, cap


def _row(
    member: Member,
    held: held_out.HeldOut,
    *,
    scale: float,
    shift: float,
    best_value: float,
    finite: bool,
    val_curve: np.ndarray,
    plan: _Plan,
    objective: str,
    method: str,
    tail_shrink: float,
) -> dict[str, Any]:
    config = plan.config
    div = get_divergence(plan.divergence, alpha=member.alpha, convention=plan.convention)
    bound, check, cap = _certify_member(member, held, scale, shift, config, div, method)
    warnings: list[str] = [member.note] if member.note else []
    if not finite:
        warnings.append("training diverged (NaN or inf); lower the learning rate")
    fields = bound_fields(div, held, bound, member.adversary, cap, warnings)
    warnings.extend(diagnostics(div, held, fields, val_curve))
    mech = member.mechanism
    param_name = "epsilon" if mech.family == "laplace" else "sigma"
    return {
        "member": member.index,
        "mechanism": mech.label,
        "family": mech.family,
        "param_name": param_name,
        "param": float(getattr(mech, param_name)),
        "noise_scale": float(mech.noise_scale),
        "adversary": member.adversary.label,
        "adversary_index": member.adversary_index,
        "adversary_spec": member.adversary.to_dict(),
        "divergence": div.label,
        "alpha": member.alpha,
        "learning_rate": member.learning_rate,
        "seed": member.seed,
        **fields,
        "guarantee": bound.kind,
        "bound_method": bound.method,
        "bounds": describe(div, member.adversary.label),
        "tail_index_p": check.index_p,
        "tail_index_q": check.index_q,
        "tail_shrink": tail_shrink,
        "confidence": config.confidence,
        "test_samples": int(min(float(held.p.count), float(held.q.count))),
        "val_objective": best_value,
        "objective": objective,
        "finite": finite,
        "warnings": warnings,
    }


def _batch_rows(batch: TrainedBatch, plan: _Plan, held: held_out.HeldOut) -> list[dict[str, Any]]:
    out = batch.output
    best, finite, curves = _to_host(out.best_value), _to_host(out.finite), _to_host(out.val_curve)
    scale, shift = _to_host(out.scale), _to_host(out.shift)
    shrink = _to_host(out.tail_shrink)
    methods = _member_methods(batch, plan)
    return [
        _row(
            plan.members[i],
            held_out.take(held, j),
            scale=float(scale[j]),
            shift=float(shift[j]),
            best_value=float(best[j]),
            finite=bool(finite[j]),
            val_curve=curves[j],
            plan=plan,
            objective=batch.static.objective,
            method=methods[j],
            tail_shrink=float(shrink[j]),
        )
        for j, i in enumerate(batch.members[: batch.n_real])
    ]


def _check_max_batch(max_batch: int) -> int:
    return check_int_at_least("max_batch", max_batch, 1)


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
    config: SweepConfig = SweepConfig(),
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
    config: SweepConfig = SweepConfig(),
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
