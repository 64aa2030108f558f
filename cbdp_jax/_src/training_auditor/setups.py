"""Ready-made training audits: data (the bundled 8x8 digits, synthetic), models, and problems.

Nothing is downloaded: the digits ship with this package (:mod:`~cbdp_jax._src.training_auditor.digits`; 8x8 images,
1797 examples, 10 classes, pixels scaled to [0, 1]; its always-blank border pixels give the gradient
canary a coordinate no example moves). The synthetic data is two Gaussian blobs with one always-zero feature for the same
purpose. Models are logistic regression (one ``nnx.Linear``), a 2-layer ReLU MLP and a small CNN
(:mod:`~cbdp_jax._src.training_auditor.models`).

:func:`worst_case_problem` is the data set of the shuffled-batch lower bound
(:mod:`~cbdp_jax._src.training_auditor.shuffle_lower_bound`) built as training data, with a one-parameter model.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    check_choice,
    check_int_at_least,
    check_positive,
)
from cbdp_jax._src.training_auditor.batch_sampling import BatchSampler
from cbdp_jax._src.training_auditor.digits import load_digits
from cbdp_jax._src.training_auditor.dp_steps import dp_sgd
from cbdp_jax._src.training_auditor.models import CNN, MLP
from cbdp_jax._src.training_auditor.problem import DEFAULT_CANARY_NORM, Canary, TrainingProblem

DATASETS = ("digits", "synthetic")
MODELS = ("logreg", "mlp", "cnn")
STEPS = ("dp-sgd", "optax")


def load_data(name: str, *, n: int | None = None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(X [n, d] float32, y [n] int32)``: ``'digits'`` (first n of 1797) or ``'synthetic'`` (n = 256).

    Raises:
      InvalidParameterError: For an unknown name.

    """
    check_choice("data", name, DATASETS)
    if name == "digits":
        images, y = (
            load_digits()
        )  # bundled with the package (_src/training_auditor/digits.py): no scikit-learn
        x = images / 16.0
        if n is not None:
            x, y = x[: check_int_at_least("n", n, 1)], y[:n]
        return x.astype(np.float32), y.astype(np.int32)
    n = 256 if n is None else check_int_at_least("n", n, 2)
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    x = rng.normal(0.0, 1.0, (n, 8)) + 1.5 * (2 * y[:, None] - 1) / np.sqrt(7)
    x[:, 0] = 0.0  # a feature no example uses, like digits' blank border
    return x.astype(np.float32), y.astype(np.int32)


def make_model(kind: str, features: int, classes: int, *, seed: int = 0, hidden: int = 32):
    """A model initialised from ``seed``: ``'logreg'``, ``'mlp'`` or ``'cnn'``.

    ``'logreg'`` is one ``nnx.Linear``, ``'mlp'`` an :class:`MLP`, ``'cnn'`` a :class:`CNN` (square
    images).
    """
    check_choice("model", kind, MODELS)
    rngs = nnx.Rngs(seed)
    if kind == "logreg":
        return nnx.Linear(features, classes, rngs=rngs)
    if kind == "cnn":
        return CNN(features, classes, rngs=rngs)
    return MLP(features, hidden, classes, rngs=rngs)


class SingleWeight(nnx.Module):
    """Two-class logits (0, w x_0) with one parameter w (initially 0): every gradient lies along w."""

    def __init__(self):
        self.w = nnx.Param(jnp.zeros((1,)))

    def __call__(self, x):
        return jnp.concatenate([jnp.zeros_like(x[..., :1]), x[..., :1] * self.w[...]], axis=-1)


def worst_case_problem(
    *, steps: int, noise: float, batch_size: int | None = None, sampler: str = "shuffle",
    clip: float = 1.0, epochs: int = 1, rate: float | None = None, bug: str = "none",
    step: str = "dp-sgd", relation: str | None = None, chunk: int = 2048,
    canary_norm: float = DEFAULT_CANARY_NORM,
) -> TrainingProblem:  # fmt: skip
    """DP-SGD on the worst case of shuffled batches and of batch normalisation, as real training.

    ``steps * batch_size - 1`` examples with the one feature 1000 and label 1 train
    :class:`SingleWeight`: each example's gradient along w is -1000 (1 - sigmoid(w x)), far beyond the
    clipping norm, so every clipped gradient is -``clip`` along w (the learning rate 1e-6 keeps w x near
    0 for the whole epoch). The gradient canary is +``clip`` along w after clipping, so the T released
    coordinates are those of :mod:`~cbdp_jax._src.training_auditor.shuffle_lower_bound` (Chua et al. 2024) under
    zero-out, and a step that divides by the realized batch moves its mean from -C to
    -C + 2C / (k + 1) when the canary joins k others (Annamalai and De Cristofaro's normalisation
    leak) under add/remove.

    ``sampler`` is ``'shuffle'`` (T = ``steps`` batches of ``batch_size`` an epoch, default 4, each
    example in exactly one, a fresh shuffle each of ``epochs`` epochs) or ``'poisson'`` at ``rate``
    (default q = 1 / T, an expected batch of ``batch_size``, default 8; q = 1 is full-batch
    training) for as many steps. ``step`` is ``'dp-sgd'`` (:func:`dp_sgd`, with ``bug``) or
    ``'optax'`` (``optax.contrib.dpsgd``); ``relation`` as in :class:`TrainingProblem`. Under
    add/remove a shuffled D' has T b - 1 examples: T - 1 full batches an epoch, b - 1 left out (the
    sampler drops the remainder), so its epochs are one step shorter; the papers' pair is zero-out.
    The canary's raw gradient has norm ``canary_norm`` times ``clip`` (default 4: clipping binds).
    """
    check_int_at_least("steps", steps, 1)
    check_positive("canary_norm", canary_norm)
    check_int_at_least("epochs", epochs, 1)
    check_choice("sampler", sampler, ("shuffle", "poisson"))
    batch_size = (4 if sampler == "shuffle" else 8) if batch_size is None else batch_size
    check_int_at_least("batch_size", batch_size, 1)
    n = steps * batch_size - 1
    if n < 1:
        raise InvalidParameterError(
            f"steps={steps} is invalid with batch_size={batch_size}: the epoch needs at least 2 examples"
        )
    if rate is not None and sampler != "poisson":
        raise InvalidParameterError(
            f"rate={rate!r} is invalid with sampler={sampler!r}: Poisson only"
        )
    x, y = np.full((n, 1), 1000.0, np.float32), np.ones(n, np.int32)
    if sampler == "shuffle":
        batches = BatchSampler(kind="shuffle", batch_size=batch_size)
    else:
        batches = BatchSampler(kind="poisson", rate=1.0 / steps if rate is None else rate)
    tx = _step(step, 1e-6, clip, noise, batches.expected_batch(n + 1), bug, seed=0)
    where = sampler if rate is None else f"poisson q={rate:g}"
    return TrainingProblem(
        model=SingleWeight(), data=(x, y), step=tx, sampler=batches, steps=steps * epochs,
        canary=Canary(kind="gradient", coordinate=0, norm=canary_norm * clip),
        noise_multiplier=noise, l2_norm_clip=clip,
        relation=relation, chunk=chunk,
        name=(
            f"{_step_name(step, bug)} worst case, {where}, b={batch_size}, T={steps}"
            f"{f' x {epochs} epochs' if epochs > 1 else ''}, S={noise:g}"
        ),
    )  # fmt: skip


def _step(step: str, learning_rate: float, clip: float, noise: float, expected: float, bug: str,
          *, seed: int):  # fmt: skip
    """The DP step: ``optax.contrib.dpsgd``, or :func:`dp_sgd` (per data set size for mean-over-dataset)."""
    check_choice("step", step, STEPS)
    if step == "optax":
        if bug != "none":
            raise InvalidParameterError(f"bug={bug!r} is invalid: bugs are planted in step dp-sgd")
        return optax.contrib.dpsgd(learning_rate, clip, noise, seed)
    kw = dict(
        learning_rate=learning_rate, l2_norm_clip=clip, noise_multiplier=noise,
        expected_batch_size=expected, bug=bug,
    )  # fmt: skip
    if bug == "mean-over-dataset":
        return lambda size: dp_sgd(**kw, dataset_size=size)
    return dp_sgd(**kw)


def _step_name(step: str, bug: str) -> str:
    return f"{step}{'' if bug == 'none' else f' [{bug}]'}"


def _worst_case_from_options(sampler, noise, clip, batch_size, steps, threat, step, bug, n, rate,
                             relation, chunk, canary_norm):  # fmt: skip
    """:func:`worst_case_problem` from the command line's options, refusing those that do not apply."""
    if threat != "gradient":
        raise InvalidParameterError(
            f"threat={threat!r} is invalid with data='worst-case': that setup is the 'gradient' one"
        )
    if n is not None:
        raise InvalidParameterError(
            f"examples={n} is invalid with data='worst-case': it has steps x batch size - 1 examples"
        )
    return worst_case_problem(
        steps=steps, noise=noise, batch_size=batch_size, sampler=sampler, clip=clip, rate=rate,
        bug=bug, step=step, relation=relation, chunk=chunk, canary_norm=canary_norm,
    )  # fmt: skip


def input_canary(x: np.ndarray, y: np.ndarray) -> Canary:
    """An out-of-distribution example: every feature at its maximum, labelled with the rarest class."""
    counts = np.bincount(y)
    return Canary(kind="input", x=x.max(axis=0), y=int(np.argmin(counts)))


def build_problem(
    *, model: str = "logreg", data: str = "digits", sampler: str = "poisson",
    noise: float = 1.0, clip: float = 1.0, rate: float | None = None,
    batch_size: int | None = None, steps: int = 100, learning_rate: float = 0.5,
    threat: str = "gradient", step: str = "dp-sgd", bug: str = "none", n: int | None = None,
    seed: int = 0, chunk: int = 2048, relation: str | None = None,
    canary_norm: float = DEFAULT_CANARY_NORM,
) -> TrainingProblem:  # fmt: skip
    """A :class:`TrainingProblem` from the command line's options (``cbdp audit-training``).

    ``data='worst-case'`` is :func:`worst_case_problem` (``batch_size`` default 4 shuffled, 8
    Poisson; ``rate`` default 1 / steps; ``model`` and ``learning_rate`` do not apply: one weight,
    learning rate 1e-6).

    ``step='optax'`` is ``optax.contrib.dpsgd(learning_rate, clip, noise, seed)``; ``'dp-sgd'`` is
    :func:`dp_sgd` (which can plant ``bug``). The fixed-size samplers take ``batch_size``, Poisson
    ``rate`` (default 0.01); the gradient threat gets a gradient canary of norm ``canary_norm``
    times ``clip`` (default 4: clipping binds on it), the others an input canary. ``relation`` as in
    :class:`TrainingProblem` (None: the claim's, add-remove by default).
    """
    check_choice("step", step, STEPS)
    check_choice("data", data, (*DATASETS, "worst-case"))
    check_positive("canary_norm", canary_norm)
    if data == "worst-case":
        return _worst_case_from_options(
            sampler, noise, clip, batch_size, steps, threat, step, bug, n, rate, relation, chunk,
            canary_norm,
        )  # fmt: skip
    x, y = load_data(data, n=n, seed=seed)
    examples = x.shape[0] + 1
    if sampler == "poisson":
        batches = BatchSampler(kind="poisson", rate=0.01 if rate is None else rate)
    else:
        batches = BatchSampler(kind=sampler, batch_size=batch_size)
    tx = _step(step, learning_rate, clip, noise, batches.expected_batch(examples), bug, seed=seed)
    if threat == "gradient":
        canary = Canary(kind="gradient", norm=canary_norm * clip)
    else:
        canary = input_canary(x, y)
    net = make_model(model, x.shape[1], int(y.max()) + 1, seed=seed)
    return TrainingProblem(
        model=net, data=(x, y), step=tx, sampler=batches, steps=steps, canary=canary,
        threat=threat, noise_multiplier=noise, l2_norm_clip=clip, relation=relation, chunk=chunk,
        name=f"{_step_name(step, bug)} {model}/{data}, {sampler}",
    )  # fmt: skip
