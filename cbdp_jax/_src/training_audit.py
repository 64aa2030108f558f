"""DP training runs as a mechanism: many trainings in one compiled program, scored and audited.

A training run is the mechanism. The user gives a DP step (any optax ``GradientTransformation`` that
takes per-example gradients with a leading batch axis, e.g. ``optax.contrib.dpsgd`` or :func:`dp_sgd`),
a Flax NNX model, a dataset, a canary, a batch sampler and the number of steps T. The dataset D has the
canary as one more example; its neighbour D' is the same dataset with the canary's gradient zeroed
(the zero-out relation: same batch sizes, and under Poisson sampling the same law as removing it). Runs
on D and on D' are vmapped over run keys, each a ``lax.scan`` over the T steps, chunked over runs
(``lax.map``) to bound memory, in ONE jit-compiled program per run count; each run returns a score,
and the scores are audited by :func:`cbdp_jax.audit.audit` with the pair D = [1], D' = [0] (the
canary in or out), so the hockey-stick rows, the empirical epsilon and the verdict are the audit's own.

Threat models and scores (docs/theory/training_audit.md):

* ``'gradient'`` (white-box, gradient canary; Nasr et al. 2023): the canary's gradient is a fixed
  vector of norm ``canary.norm`` along one parameter coordinate (by default one that no example of
  the data moves, e.g. the weight of an always-blank pixel), and the adversary sees every update.
  z_t = (update_t along the coordinate) / (the update a lone clipped canary would make) is, under
  Poisson sampling, Bernoulli(q) + N(0, S^2) at every step, independently: the T-fold Poisson-
  subsampled Gaussian the accountant composes. The score is the Neyman-Pearson statistic
  sum_t log(1 - q + q exp((2 z_t - 1) / (2 S^2))) (``'llr'``) or sum_t z_t (``'sum'``).
* ``'white-box'``: the final parameters projected on the canary's (input example's) negative
  gradient at the shared initialisation, <theta_T - theta_0, -g_c> / ||g_c||.
* ``'black-box'``: minus the canary's loss under the final model.

The noise convention is the step's own: :func:`dp_sgd` adds N(0, (S C)^2) to the sum of clipped
gradients and divides by the EXPECTED batch size qn (or b); ``optax.contrib.dpsgd`` divides by the
leading axis of what it is given, here the sampler's fixed physical batch (``BatchSampler.capacity``).
Either division is post-processing of the noisy sum, so the privacy is the same; only the effective
learning rate differs. Any PRNG key in the step's state (optax's ``DifferentiallyPrivateAggregateState``
holds one) is replaced by one split from the run's key: otherwise every vmapped run would draw the
same noise.

References:
  Nasr, Hayes, Steinke, Balle, Tramer, Jagielski, Carlini, Terzis 2023, "Tight auditing of
  differentially private machine learning" (gradient canaries, all-updates threat model); Jagielski,
  Ullman, Oprea 2020, "Auditing differentially private machine learning"; Abadi et al. 2016.

"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.flatten_util import ravel_pytree

from cbdp_jax._src.audit_io import AuditMechanism
from cbdp_jax._src.batch_sampling import BatchSampler
from cbdp_jax._src.validation import (
    InvalidParameterError,
    check_choice,
    check_in_range,
    check_int_at_least,
    check_key,
    check_positive,
)

THREATS = ("gradient", "white-box", "black-box")
SCORES = ("auto", "llr", "sum")
BUGS = ("none", "noise-after-averaging", "no-clip", "noise-on-subset")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Canary:
    """The example whose membership is audited.

    Attributes:
      kind: ``'gradient'`` (a gradient canary: a fixed per-example gradient) or ``'input'`` (an extra
        example (x, y) whose gradient the model computes).
      norm: The gradient canary's l2 norm (the clipping norm makes it a worst case of DP-SGD).
      coordinate: The flat parameter index the gradient canary points along; None picks the first
        coordinate that no example's gradient moves (exact law), else the least-moved one.
      x: The input canary's features ``[d]``.
      y: The input canary's label.

    """

    kind: str = "gradient"
    norm: float = 1.0
    coordinate: int | None = None
    x: Any = None
    y: int | None = None

    def __post_init__(self):
        check_choice("canary kind", self.kind, ("gradient", "input"))
        check_positive("canary norm", self.norm)
        if self.kind == "input" and (self.x is None or self.y is None):
            raise InvalidParameterError("canary=None is invalid: an input canary needs x and y")


class DpSgdState(NamedTuple):
    """State of :func:`dp_sgd`: the key of the next step's noise."""

    rng_key: jax.Array


def dp_sgd(
    *, learning_rate: float, l2_norm_clip: float, noise_multiplier: float,
    expected_batch_size: float, key: jax.Array | None = None, bug: str = "none",
) -> optax.GradientTransformation:  # fmt: skip
    """A hand-written DP-SGD step on per-example gradients ``[b, ...]`` (leading batch axis).

    update = -lr (sum_i clip_C(g_i) + N(0, (S C)^2 I)) / B with B the expected batch size (qn for
    Poisson sampling, so a variable batch is divided by a constant, as the accountant assumes).
    ``bug`` plants a known flaw: ``'noise-after-averaging'`` (the noise std is S C / B, as if for the
    mean, and is then divided by B again: the effective noise multiplier is S / B), ``'no-clip'``
    (gradients summed unclipped), ``'noise-on-subset'`` (no noise on parameters named ``bias``).

    Args:
      learning_rate: The SGD step size, > 0.
      l2_norm_clip: C, > 0.
      noise_multiplier: S, >= 0.
      expected_batch_size: B, > 0.
      key: The noise key (a training audit replaces it per run); default ``jax.random.key(0)``.
      bug: One of ``BUGS``.

    Returns:
      An ``optax.GradientTransformation`` whose state is :class:`DpSgdState`.

    References:
      Abadi et al. 2016, Algorithm 1.

    """
    lr, clip = check_positive("learning_rate", learning_rate), check_positive("clip", l2_norm_clip)
    sigma = check_in_range("noise_multiplier", noise_multiplier, 0.0, math.inf)
    batch = check_positive("expected_batch_size", expected_batch_size)
    check_choice("bug", bug, BUGS)
    key = jax.random.key(0) if key is None else check_key(key)

    def init(params):
        del params
        return DpSgdState(key)

    def update(grads, state, params=None):
        del params
        norms = jax.vmap(optax.tree.norm)(grads)
        factor = jnp.ones_like(norms) if bug == "no-clip" else jnp.minimum(1.0, clip / norms)
        factor = jnp.nan_to_num(factor, nan=1.0)
        summed = jax.tree.map(lambda g: jnp.tensordot(factor, g, 1), grads)
        paths, treedef = jax.tree_util.tree_flatten_with_path(summed)
        next_key, *keys = jax.random.split(state.rng_key, len(paths) + 1)
        out = []
        for (path, s), k in zip(paths, keys, strict=True):
            noise = sigma * clip * jax.random.normal(k, s.shape, s.dtype)
            if bug == "noise-on-subset" and "bias" in jax.tree_util.keystr(path):
                noise = jnp.zeros_like(noise)
            if bug == "noise-after-averaging":
                out.append(-lr * (s / batch + (noise / batch) / batch))
            else:
                out.append(-lr * (s + noise) / batch)
        return jax.tree.unflatten(treedef, out), DpSgdState(next_key)

    return optax.GradientTransformation(init, update)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainingProblem:
    """Everything one audited training run needs (the runs differ only by their keys).

    Attributes:
      model: A Flax NNX module mapping ``[b, d]`` to logits ``[b, classes]``; split once.
      data: ``(X [n, d], y [n])`` integer labels.
      step: The DP step: an ``optax.GradientTransformation`` on per-example gradients.
      sampler: The :class:`BatchSampler`, over the n + 1 examples (canary included).
      steps: T, the number of training steps.
      canary: The :class:`Canary`.
      threat: ``'gradient'``, ``'white-box'`` or ``'black-box'``.
      noise_multiplier: The run's claimed S (the ``'llr'`` score and the default claim use it).
      score: ``'llr'`` or ``'sum'`` for the gradient threat (``'auto'``: llr when S is known).
      chunk: Runs vmapped at once inside the program (memory bound).
      name: The mechanism's name in the audit's messages.

    """

    model: nnx.Module
    data: tuple[Any, Any]
    step: Any
    sampler: BatchSampler
    steps: int
    canary: Canary = Canary()
    threat: str = "gradient"
    noise_multiplier: float | None = None
    score: str = "auto"
    chunk: int = 2048
    name: str = "training"

    def __post_init__(self):
        if not isinstance(self.step, optax.GradientTransformation):
            raise InvalidParameterError(
                f"step={type(self.step).__name__} is invalid: must be an "
                "optax.GradientTransformation (init, update) applied to per-example gradients"
            )
        if not isinstance(self.sampler, BatchSampler):
            raise InvalidParameterError("sampler is invalid: must be a BatchSampler")
        check_int_at_least("steps", self.steps, 1)
        check_int_at_least("chunk", self.chunk, 1)
        check_choice("threat", self.threat, THREATS)
        check_choice("score", self.score, SCORES)
        if self.noise_multiplier is not None:
            check_positive("noise_multiplier", self.noise_multiplier)
        want = "gradient" if self.threat == "gradient" else "input"
        if self.canary.kind != want:
            raise InvalidParameterError(
                f"canary={self.canary.kind!r} is invalid: threat {self.threat!r} needs a {want} canary"
            )
        x, y = (np.asarray(a) for a in self.data)
        if x.ndim != 2 or y.shape != (x.shape[0],) or x.shape[0] < 1:
            raise InvalidParameterError(
                f"data=<X {x.shape}, y {y.shape}> is invalid: must be X [n, d] and y [n], n >= 1"
            )
        if self.canary.kind == "input" and np.shape(self.canary.x) != x.shape[1:]:
            raise InvalidParameterError(
                f"canary x of shape {np.shape(self.canary.x)} is invalid: must be [{x.shape[1]}], "
                "the shape of one example"
            )
        self.sampler.check_size(x.shape[0] + 1)

    @property
    def examples(self) -> int:
        """The number of examples of D: the n data and the canary."""
        return int(np.shape(self.data[0])[0]) + 1

    @property
    def sampling_rate(self) -> float:
        """The sampler's rate q over the n + 1 examples."""
        return self.sampler.sampling_rate(self.examples)

    def score_kind(self) -> str:
        """The gradient threat's score: ``'llr'`` or ``'sum'``."""
        if self.score == "auto":
            return "llr" if self.noise_multiplier is not None else "sum"
        if self.score == "llr" and self.noise_multiplier is None:
            raise InvalidParameterError(
                "score='llr' is invalid without noise_multiplier: give the run's S, or score='sum'"
            )
        return self.score


class Prepared(NamedTuple):
    """What :func:`prepare` computes once: the split model, the data with the canary, the probes."""

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


def _loss(graphdef, params, x, y):
    logits = nnx.merge(graphdef, params)(x[None])[0]
    return optax.losses.softmax_cross_entropy_with_integer_labels(logits, y)


def _per_example_grads(graphdef, params, x, y):
    return jax.vmap(jax.grad(_loss, argnums=1), in_axes=(None, None, 0, 0))(graphdef, params, x, y)


def _tree_dot(a, b) -> jax.Array:
    return sum(jnp.vdot(u, v) for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def _rekey(state, key: jax.Array):
    """Every typed PRNG key in ``state`` replaced by one split from ``key``."""
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(key, max(len(leaves), 1))
    is_key = lambda a: jnp.issubdtype(getattr(a, "dtype", None), jax.dtypes.prng_key)
    out = [k if is_key(a) else a for a, k in zip(leaves, keys, strict=False)]
    return jax.tree.unflatten(treedef, out)


def _check_keys(state) -> None:
    raw = [a for a in jax.tree.leaves(state) if getattr(a, "dtype", None) == jnp.uint32]
    if raw:
        raise InvalidParameterError(
            "step is invalid: its state holds raw uint32 keys, which a training audit cannot "
            "re-seed per run (every run would draw the same noise); use jax.random.key"
        )


def _dead_coordinate(graphdef, params, x, y) -> tuple[int, bool]:
    """The first flat coordinate no example's gradient moves (at init and at a perturbed point)."""
    flat, unravel = ravel_pytree(params)
    shaken = unravel(flat + 0.1 * jax.random.normal(jax.random.key(1), flat.shape))

    @jax.jit
    def largest(p):
        g = _per_example_grads(graphdef, p, x, y)
        return jnp.max(jnp.abs(jax.vmap(lambda t: ravel_pytree(t)[0])(g)), axis=0)

    moved = largest(params) + largest(shaken)
    i = int(jnp.argmin(moved))
    return i, bool(moved[i] == 0.0)


def prepare(problem: TrainingProblem) -> Prepared:
    """Splits the model, appends the canary to the data, and fixes the canary's direction and unit."""
    graphdef, params = nnx.split(problem.model, nnx.Param)
    x = jnp.asarray(problem.data[0], jnp.float32)
    y = jnp.asarray(problem.data[1], jnp.int32)
    c = problem.canary
    cx = jnp.zeros((1, x.shape[1])) if c.kind == "gradient" else jnp.asarray(c.x, jnp.float32)[None]
    cy = jnp.zeros((1,), jnp.int32) if c.kind == "gradient" else jnp.full((1,), int(c.y), jnp.int32)
    slot = x.shape[0]
    flat, unravel = ravel_pytree(params)
    if c.kind == "gradient":
        if c.coordinate is None:
            coord, exact = _dead_coordinate(graphdef, params, x, y)
        else:
            coord, exact = (
                check_in_range("canary coordinate", c.coordinate, 0, flat.size - 1),
                False,
            )
            coord = int(coord)
        direction = unravel(jnp.zeros_like(flat).at[coord].set(1.0))
        canary_grad = jax.tree.map(lambda d: c.norm * d, direction)
    else:
        g0 = jax.grad(_loss, argnums=1)(graphdef, params, cx[0], cy[0])
        gflat = ravel_pytree(g0)[0]
        norm = float(jnp.linalg.norm(gflat))
        if not norm > 0:
            raise InvalidParameterError("canary is invalid: its gradient at initialisation is zero")
        direction, canary_grad, coord, exact = unravel(-gflat / norm), None, -1, False
    unit = _unit(problem, params, canary_grad, direction) if c.kind == "gradient" else 1.0
    xs, ys = jnp.concatenate([x, cx]), jnp.concatenate([y, cy])
    return Prepared(graphdef, params, xs, ys, slot, canary_grad, direction, unit, coord, exact)


def _unit(problem: TrainingProblem, params, canary_grad, direction) -> float:
    """The step's response along the canary's direction to the lone canary (same noise twice)."""
    state = problem.step.init(params)
    _check_keys(state)
    state = _rekey(state, jax.random.key(0))
    cap = problem.sampler.capacity(problem.examples)
    zeros = jax.tree.map(lambda p: jnp.zeros((cap, *p.shape), p.dtype), params)
    lone = jax.tree.map(lambda z, g: z.at[0].set(g), zeros, canary_grad)
    u1, _ = problem.step.update(lone, state, params)
    u0, _ = problem.step.update(zeros, state, params)
    unit = float(_tree_dot(jax.tree.map(jnp.subtract, u1, u0), direction))
    if not (math.isfinite(unit) and abs(unit) > 0):
        raise InvalidParameterError(
            "step is invalid: a lone canary gradient does not move the parameters along its "
            "direction (is the step applied to per-example gradients?)"
        )
    return unit


def _batch_grads(problem: TrainingProblem, prep: Prepared, params, idx, valid, present):
    """Per-example gradients ``[capacity, ...]`` of a step's batch, the canary's weighted by present."""
    g = _per_example_grads(prep.graphdef, params, prep.x[idx], prep.y[idx])
    is_canary = idx == prep.slot
    if prep.canary_grad is not None:
        g = jax.tree.map(
            lambda gi, ci: jnp.where(is_canary.reshape((-1,) + (1,) * ci.ndim), ci[None], gi),
            g, prep.canary_grad,
        )  # fmt: skip
    w = valid * jnp.where(is_canary, present, 1.0)
    return jax.tree.map(lambda gi: gi * w.reshape((-1,) + (1,) * (gi.ndim - 1)).astype(gi.dtype), g)


class RunOutput(NamedTuple):
    """One training run's outputs.

    Attributes:
      score: The threat model's score ``[]`` (larger when the canary was in).
      z: The canary coordinate's updates in canary units ``[T]`` (gradient threat; else zeros).
      overflow: Poisson batch members dropped beyond the physical batch ``[]`` (0 in practice).

    """

    score: jax.Array
    z: jax.Array
    overflow: jax.Array


def make_run(problem: TrainingProblem, prep: Prepared):
    """The pure function ``run(key, present) -> RunOutput`` of one training (jit / vmap ready).

    ``present`` is 1.0 on D (canary in) and 0.0 on D' (its gradient zeroed). The key is split into the
    batches' key and the step's noise key; the step's state is re-keyed with the latter.
    """
    tx, sampler, n = problem.step, problem.sampler, problem.examples
    threat, q = problem.threat, problem.sampling_rate
    llr = problem.threat == "gradient" and problem.score_kind() == "llr"
    s2 = (problem.noise_multiplier or 1.0) ** 2

    def run(key: jax.Array, present: jax.Array) -> RunOutput:
        k_batch, k_noise = jax.random.split(key)
        state = _rekey(tx.init(prep.params), k_noise)
        plan = sampler.plan(k_batch, n, problem.steps)

        def body(carry, t):
            params, state, over = carry
            idx, valid, overflow = sampler.batch(plan, t, n)
            grads = _batch_grads(problem, prep, params, idx, valid, present)
            updates, state = tx.update(grads, state, params)
            z = _tree_dot(updates, prep.direction) / prep.unit
            return (optax.apply_updates(params, updates), state, over + overflow), z

        carry0 = (prep.params, state, jnp.zeros((), jnp.int32))
        (final, _, over), z = jax.lax.scan(body, carry0, jnp.arange(problem.steps))
        if threat == "gradient":
            if llr:
                score = _llr(sampler, n, q, (2.0 * z - 1.0) / (2.0 * s2))
            else:
                score = jnp.sum(z)
        elif threat == "white-box":
            score = _tree_dot(jax.tree.map(jnp.subtract, final, prep.params), prep.direction)
            z = jnp.zeros_like(z)
        else:
            score = -_loss(prep.graphdef, final, prep.x[prep.slot], prep.y[prep.slot])
            z = jnp.zeros_like(z)
        return RunOutput(score, z, over)

    return run


def _llr(sampler: BatchSampler, n: int, q: float, a: jax.Array) -> jax.Array:
    """The log-likelihood ratio of the canary coordinates, a_t = (2 z_t - 1) / (2 S^2) ``[T]``.

    Poisson and fixed-size batches hold the canary at each step independently with probability q:
    sum_t log(1 - q + q e^{a_t}). Shuffled batches hold it at exactly one step of each epoch, uniform:
    sum_epochs log(mean_{t in epoch} e^{a_t}), the steps of an unfinished epoch counting e^0 = 1.
    """
    if sampler.kind == "shuffle":
        per = sampler.steps_per_epoch(n)
        epochs = -(-a.shape[0] // per)
        padded = jnp.concatenate([a, jnp.zeros(epochs * per - a.shape[0], a.dtype)])
        return jnp.sum(jax.nn.logsumexp(padded.reshape(epochs, per), axis=1) - math.log(per))
    return jnp.sum(jnp.logaddexp(math.log1p(-q) if q < 1 else -jnp.inf, math.log(q) + a))


def _many(problem: TrainingProblem, run, key: jax.Array, present, n: int) -> RunOutput:
    """Runs n trainings (keys split from ``key``), vmapped in chunks of ``problem.chunk`` by ``lax.map``."""
    keys = jax.random.split(key, n)
    if n <= problem.chunk:
        return jax.vmap(run, in_axes=(0, None))(keys, present)
    return jax.lax.map(lambda k: run(k, present), keys, batch_size=problem.chunk)


def training_mechanism(problem: TrainingProblem, prep: Prepared | None = None) -> AuditMechanism:
    """The training as an :class:`~cbdp_jax.audit.AuditMechanism`: ``fn(key, dataset, n)`` runs n trainings.

    ``dataset`` is ``[1.0]`` (D: canary in) or ``[0.0]`` (D': canary zeroed); the function traces under
    ``jax.jit`` with n static, so D and D' share one compiled program and the audit draws its samples
    with it. Its outputs are the n scores ``[n]``.
    """
    prep = prepare(problem) if prep is None else prep
    run = make_run(problem, prep)

    def fn(key, dataset, n):
        present = jnp.asarray(dataset, jnp.float32).reshape(-1)[0]
        return _many(problem, run, key, present, n).score

    return TrainingMechanism(fn, problem.name, problem=problem, prep=prep)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainingMechanism(AuditMechanism):
    """An :class:`~cbdp_jax.audit.AuditMechanism` whose samples come from :func:`training_runs`.

    ``sample`` runs the trainings in the compiled program :func:`training_runs` keeps per run count,
    so an audit's D and D' samples, and any other call with the same count, share one compilation.
    """

    problem: TrainingProblem
    prep: Prepared

    def sample(self, key: jax.Array, dataset: Any, n: int) -> np.ndarray:
        """The scores of n runs on D (``dataset = [1]``) or D' (``[0]``), float64 ``[n, 1]``."""
        present = float(np.asarray(dataset, np.float64).reshape(-1)[0])
        out = training_runs(key, self.problem, n, canary=present, prep=self.prep)
        return np.asarray(out.score, np.float64)[:, None]


def training_runs(
    key: jax.Array, problem: TrainingProblem, n: int, *, canary: bool | float = True,
    prep: Prepared | None = None,
) -> RunOutput:  # fmt: skip
    """N independent trainings on D (``canary=True``) or D', in one jit-compiled program.

    Returns:
      :class:`RunOutput` with a leading axis of n (numpy arrays).

    """
    check_key(key)
    n = check_int_at_least("runs", n, 1)
    prep = prepare(problem) if prep is None else prep

    def compile_program():
        run = make_run(problem, prep)
        return jax.jit(lambda k, present: _many(problem, run, k, present, n))

    # the last few programs kept: D and D' (and other keys) reuse them
    program = _remembered(_PROGRAMS, (problem, prep), n, compile_program, keep=4)
    out = program(key, jnp.float32(canary))
    return RunOutput(*(np.asarray(a) for a in out))


def _remembered(store: dict, owners: tuple, extra: Any, build, *, keep: int) -> Any:
    """``build()``, kept in ``store`` under the identity of ``owners`` and ``extra``.

    Identity, not equality: a problem holds a module, so it is not hashable. A hit must hold the very
    same objects; the ``keep`` newest entries stay.
    """
    key = (*map(id, owners), extra)
    hit = store.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], owners, strict=True)):
        return hit[1]
    value = build()
    while len(store) >= keep:
        store.pop(next(iter(store)))
    store[key] = (owners, value)
    return value


_PROGRAMS: dict[tuple, tuple[tuple, Any]] = {}


def default_claim(problem: TrainingProblem, delta: float = 1e-5) -> str:
    """The run's own statement: ``dpsgd:noise=S,rate=q,steps=T,delta=D,sampling=KIND``."""
    if problem.noise_multiplier is None:
        raise InvalidParameterError(
            "claim=None is invalid: give a claim, or the run's noise_multiplier to build its dpsgd claim"
        )
    return (
        f"dpsgd:noise={problem.noise_multiplier:g},rate={problem.sampling_rate:.10g},"
        f"steps={problem.steps},delta={delta:g},sampling={problem.sampler.kind}"
    )


def eps_grid_for(epsilon: float) -> tuple[float, ...]:
    """Grid multiples of the claimed eps: eps' in {0.25, 0.5, 1, 2, 4, 8} below it, and eps itself.

    A ``dpsgd:`` claim is the accountant's whole curve, so points well below the claimed eps are
    claims in their own right (where a shuffled run's excess shows, docs/theory/training_audit.md).
    """
    if not epsilon > 0:
        return (1.0,)
    points = [e for e in (0.25, 0.5, 1.0, 2.0, 4.0, 8.0) if e < 0.95 * epsilon]
    return tuple(e / epsilon for e in points) + (1.0,)


def training_audit_config(epsilon: float = 1.0, **overrides) -> Any:
    """The audit's budgets for 1-D scores: threshold and histogram critics, 10^4 runs per side.

    The grid is :func:`eps_grid_for` the claimed ``epsilon``; the critics are indicators, certified
    with exact binomial bounds as well, plus one tail set per direction for eps at the claim's delta
    (``tail_bounds``, docs/theory/training_audit.md section 8); ``overrides`` replace any field.
    """
    from cbdp_jax._src.audit import AuditConfig

    base = dict(
        samples=10_000, classes=("halfspace", "histogram"), eps_grid=eps_grid_for(epsilon),
        screen_samples=100, tail_bounds=True,
    )  # fmt: skip
    return AuditConfig(**(base | overrides))


_MECHANISMS: dict[tuple, tuple[tuple, AuditMechanism]] = {}


def audit_training(
    key: jax.Array, problem: TrainingProblem, claim: str | None = None, *, delta: float = 1e-5,
    config: Any = None,
) -> Any:  # fmt: skip
    """Audits a DP training's claim from ``config.samples`` runs on D and as many on D'.

    Args:
      key: A typed PRNG key (the audit splits it for D's runs, D''s runs and the critics).
      problem: The :class:`TrainingProblem`.
      claim: ``pure:``, ``approx:`` or ``dpsgd:`` text; default :func:`default_claim`.
      delta: The default claim's delta.
      config: An :class:`~cbdp_jax.audit.AuditConfig` (default :func:`training_audit_config` at the
        claim's epsilon).

    Returns:
      The :class:`~cbdp_jax.audit.AuditResult` of :func:`cbdp_jax.audit.audit` on the pair
      ([1], [0]): certified rows, empirical epsilon, verdict.

    Raises:
      InvalidParameterError: For a claim that is not an (epsilon, delta) claim or cannot be accounted.

    """
    from cbdp_jax._src.audit import audit, parse_claim

    check_key(key)
    text = default_claim(problem, delta) if claim is None else claim
    parsed = parse_claim(text)
    if parsed.kind not in ("pure", "approx"):
        raise InvalidParameterError(
            f"claim={text!r} is invalid: a training audit checks pure:, approx: or dpsgd: claims"
        )
    # one problem's mechanism (and compiled program) kept: audits of it with other keys reuse it
    mech = _remembered(_MECHANISMS, (problem,), None, lambda: training_mechanism(problem), keep=1)
    config = training_audit_config(parsed.epsilon) if config is None else config
    return audit(key, mech, parsed, pair=([1.0], [0.0]), config=config)
