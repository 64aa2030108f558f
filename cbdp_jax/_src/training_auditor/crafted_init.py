r"""Worst-case initial parameters for black-box audits of DP training, and the average case beside them.

DP-SGD's accounting holds for every initialisation, so an auditor may choose it (Annamalai & De
Cristofaro 2024). Our construction makes the final model's loss on the canary an (almost) exactly
Gaussian statistic, so that a black-box adversary, who sees only that loss, sees all that the
accountant's composition allows:

1. **Fit.** The model is trained, non-privately (full-batch Adam on the cross-entropy), on the
   data D \\ {canary}.
2. **Canary.** An input canary on the features no example uses (the digits' always-blank pixels):
   ``canary_value`` there, 0 elsewhere, labelled with the class the fitted model finds LEAST likely,
   so its gradient points the same way all along training and clipping binds on it.
3. **Rescale.** Every layer's kernel is multiplied by a and its bias by a^l (l = the layer's depth):
   ReLU networks with average pooling are positively homogeneous, so the logits become a^L times
   the fitted ones and the predictions do not change. a is the least power of 2 for which, over
   the whole training (T steps of noise N(0, (S C)^2) scaled by lr / B, and the canary's own
   clipped steps), with eight standard deviations to spare: (i) every correctly classified example
   keeps a margin above 120 (the softmax then rounds to one-hot in float32: its gradient is exactly
   zero, so the data add nothing to the updates but what the noise does); (ii) the canary's largest
   logit stays 20 above its second (its loss is then z_top - z_label, linear in the logits, to
   float32 rounding, and its gradient's direction in logit space is fixed); (iii) the noise moves each layer by at most 1e-3 of its norm
   (the margin is then linear in the noise to about that relative error).

Then the canary's final loss is, up to those errors, l_0 - (lr / B) ||grad m|| C (present T + S
sqrt(T) Z) under full-batch training: a shift of sqrt(T) / S standard deviations between D and D',
the accountant's own GDP mu. Under Poisson sampling the shift is C times the number of steps that
held the canary, the sum a final-model adversary sees. :class:`StartReport` records each condition.

The average case is the model's default initialisation with the same canary rule and no fit or
rescale.

References:
  Annamalai, De Cristofaro 2024, "Nearly tight black-box auditing of differentially private machine
  learning", NeurIPS (worst-case initial parameters, full-batch training with summed gradients).

"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
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
from cbdp_jax._src.training_auditor.dp_steps import dp_sgd
from cbdp_jax._src.training_auditor.problem import Canary, TrainingProblem
from cbdp_jax._src.training_auditor.setups import load_data, make_model

INITS = ("worst-case", "average-case")
DATA_MARGIN = 120.0  # float32 softmax is exactly one-hot beyond a margin of about 104
CANARY_MARGIN = 20.0  # float32 logsumexp equals the largest logit beyond about 17
LINEARITY = 1e-3  # the largest share of a layer's norm the training's noise may move it by
SPARE = 8.0  # standard deviations of the noise kept in reserve


class StartReport(NamedTuple):
    """How the initial parameters and the canary meet the construction's conditions.

    Attributes:
      init: ``'worst-case'`` or ``'average-case'``.
      train_accuracy: The initial model's accuracy on the data.
      saturated: The share of data examples whose cross-entropy gradient is exactly 0 in float32 at
        the initial parameters.
      scale: a, the factor of every layer's kernel (1 for the average case).
      data_margin: The smallest margin over correctly classified examples, less the training's
        worst drift of it (condition (i): >= 120).
      canary_margin: The gap between the canary's two largest logits, less its worst drift
        (condition (ii): >= 20; its label is the least likely class, far below both).
      canary_gradient: ||grad of the canary's loss|| / C at the initial parameters (> 1: clipping
        binds).
      noise_share: The largest share of a layer's norm the noise moves it by (condition (iii)).
      dead_features: The features the canary lights (no example uses them).

    """

    init: str
    train_accuracy: float
    saturated: float
    scale: float
    data_margin: float
    canary_margin: float
    canary_gradient: float
    noise_share: float
    dead_features: tuple[int, ...]

    def to_dict(self) -> dict:
        """A JSON-ready dict."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self._asdict().items()}


class Start(NamedTuple):
    """The initial model, the canary and the report of :func:`crafted_start`."""

    model: nnx.Module
    canary: Canary
    report: StartReport


class Training(NamedTuple):
    """What the construction needs of the training: lr, C, S, T and the divisor B of the sum."""

    learning_rate: float
    clip: float
    noise: float
    steps: int
    divisor: float = 1.0

    def reach(self) -> float:
        """The parameters' largest move along any unit direction, per unit of gradient norm.

        (lr / B) C (T + SPARE S sqrt(T)): the canary's own T clipped steps plus SPARE standard
        deviations of the noise.
        """
        lr = self.learning_rate / self.divisor
        return lr * self.clip * (self.steps + SPARE * self.noise * math.sqrt(self.steps))


def _layers(model) -> list:
    """The model's tapped layers in call order (a bare ``nnx.Linear`` is its own layer)."""
    if isinstance(model, nnx.Linear):
        return [model]
    if not hasattr(model, "tapped_call"):
        raise InvalidParameterError(
            f"model={type(model).__name__} is invalid for crafted initial parameters: it needs "
            "tapped_call (the library's logreg, mlp and cnn have it)"
        )
    found: list = []

    def record(layer, a, out):
        del a
        found.append(layer)
        return out

    x = jnp.zeros((1, _features(model)), jnp.float32)
    model.tapped_call(x, record)
    return found


def _features(model) -> int:
    for _, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Linear):
            return int(node.in_features)
        if isinstance(node, nnx.Conv):
            return int(model.side) ** 2 * int(node.in_features)
    raise InvalidParameterError(f"model={type(model).__name__} is invalid: it has no input layer")


def _logits(model, x) -> jax.Array:
    return model(jnp.asarray(x, jnp.float32))


def margins(model, x, y) -> np.ndarray:
    """logit_y - max_{j != y} logit_j for each example ``[n]`` (float64)."""
    z = np.asarray(_logits(model, x), np.float64)
    own = z[np.arange(len(y)), y]
    z[np.arange(len(y)), y] = -np.inf
    return own - z.max(axis=1)


def fit(model, x, y, *, steps: int = 2000, learning_rate: float = 1e-2) -> nnx.Module:
    """The model trained in place, non-privately: full-batch Adam on the mean cross-entropy."""
    graphdef, params = nnx.split(model, nnx.Param)
    tx = optax.adam(learning_rate)
    xs, ys = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.int32)

    def loss(p):
        z = nnx.merge(graphdef, p)(xs)
        return optax.losses.softmax_cross_entropy_with_integer_labels(z, ys).mean()

    @jax.jit
    def train(p):
        def step(carry, _):
            p, s = carry
            u, s = tx.update(jax.grad(loss)(p), s, p)
            return (optax.apply_updates(p, u), s), None

        return jax.lax.scan(step, (p, tx.init(p)), None, length=steps)[0][0]

    nnx.update(model, train(params))
    return model


def rescale(model, a: float) -> nnx.Module:
    """Every layer's kernel times a, its bias times a^l (l = 1, 2, ... in call order), in place."""
    for depth, layer in enumerate(_layers(model), start=1):
        layer.kernel.set_value(layer.kernel[...] * a)
        if getattr(layer, "bias", None) is not None:
            layer.bias.set_value(layer.bias[...] * a**depth)
    return model


def dead_features(x: np.ndarray) -> np.ndarray:
    """The features no example uses (always 0); if none, the one of least largest magnitude."""
    top = np.max(np.abs(np.asarray(x)), axis=0)
    dead = np.flatnonzero(top == 0.0)
    return dead if dead.size else np.array([int(np.argmin(top))])


def _gaps(model, x) -> tuple[np.ndarray, np.ndarray]:
    """Each example's top gap z_(1) - z_(2) and the norm of its gradient in the parameters ``[n]``.

    The top gap is the example's margin when it is classified right. Blocks of 256 examples, one
    compiled program per model graph (the rescaling loop calls this at every scale).
    """
    graphdef, params = nnx.split(model, nnx.Param)
    xs = jnp.asarray(x, jnp.float32)
    parts = [_gap_program(graphdef, params, xs[i : i + 256]) for i in range(0, len(xs), 256)]
    return tuple(np.concatenate([np.asarray(p[j], np.float64) for p in parts]) for j in (0, 1))


@functools.partial(jax.jit, static_argnums=0)
def _gap_program(graphdef, params, xs):
    def gap(p, xi):
        z = nnx.merge(graphdef, p)(xi[None])[0]
        top = jax.lax.top_k(z, 2)[0]
        return top[0] - top[1]

    grads = jax.vmap(jax.grad(gap), in_axes=(None, 0))(params, xs)
    return jax.vmap(gap, in_axes=(None, 0))(params, xs), jax.vmap(optax.tree.norm)(grads)


def _noise_share(model, training: Training) -> float:
    """The largest ||noise over the training on a layer|| / ||layer|| (SPARE standard deviations)."""
    per = training.learning_rate / training.divisor * training.noise * training.clip
    per *= math.sqrt(training.steps)
    worst = 0.0
    for layer in _layers(model):
        _, p = nnx.split(layer, nnx.Param)
        leaves = [np.asarray(v, np.float64) for v in jax.tree.leaves(p)]
        size = sum(v.size for v in leaves)
        norm = math.sqrt(sum(float(np.sum(v * v)) for v in leaves))
        worst = max(worst, (per * (math.sqrt(size) + SPARE)) / max(norm, 1e-30))
    return worst


def _conditions(model, x, y, cx, training: Training) -> dict[str, float]:
    reach = training.reach()
    gap, grad = _gaps(model, x)
    right = margins(model, x, y) > 0
    cgap, cgrad = _gaps(model, cx[None])
    data = float(np.min((gap - reach * grad)[right])) if right.any() else -math.inf
    return {
        "data_margin": data,
        "canary_margin": float(cgap[0] - reach * cgrad[0]),
        "noise_share": _noise_share(model, training),
    }


def _canary_gradient(model, cx, cy, clip: float) -> float:
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(p):
        z = nnx.merge(graphdef, p)(jnp.asarray(cx, jnp.float32)[None])
        return optax.losses.softmax_cross_entropy_with_integer_labels(z, jnp.array([cy]))[0]

    return float(optax.tree.norm(jax.grad(loss)(params))) / clip


def _saturated(model, x, y) -> float:
    graphdef, params = nnx.split(model, nnx.Param)

    def grad_max(xi, yi):
        def loss(p):
            z = nnx.merge(graphdef, p)(xi[None])
            return optax.losses.softmax_cross_entropy_with_integer_labels(z, yi[None])[0]

        g = jax.grad(loss)(params)
        return jnp.max(jnp.stack([jnp.max(jnp.abs(a)) for a in jax.tree.leaves(g)]))

    top = jax.jit(jax.vmap(grad_max))(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.int32))
    return float(np.mean(np.asarray(top) == 0.0))


def crafted_start(
    model: nnx.Module, x, y, *, init: str = "worst-case", training: Training,
    canary_value: float = 1.0, fit_steps: int = 2000, max_scale: float = 2.0**40,
) -> Start:  # fmt: skip
    """The initial parameters and the canary of a black-box audit (module docstring).

    Args:
      model: The model at its default initialisation (changed in place for the worst case).
      x: The data's features ``[n, d]`` (the canary not among them).
      y: Their integer labels ``[n]``.
      init: ``'worst-case'`` (fit, canary, rescale) or ``'average-case'`` (the canary only).
      training: The training's lr, C, S, T and divisor (:class:`Training`).
      canary_value: The canary's value on the unused features.
      fit_steps: Adam steps of the non-private fit.
      max_scale: The largest rescaling factor tried.

    Returns:
      :class:`Start`: the model, the input canary and the :class:`StartReport`.

    Raises:
      InvalidParameterError: For an unknown ``init``, or a model the rescaling cannot bring to the
        conditions (its report's values in the message).

    """
    check_choice("init", init, INITS)
    check_positive("canary_value", canary_value)
    check_int_at_least("fit_steps", fit_steps, 1)
    x, y = np.asarray(x, np.float32), np.asarray(y, np.int32)
    if init == "worst-case":
        fit(model, x, y, steps=fit_steps)
    dead = dead_features(x)
    cx = np.zeros(x.shape[1], np.float32)
    cx[dead] = canary_value
    cy = int(np.argmin(np.asarray(_logits(model, cx[None]))[0]))
    a = 1.0
    if init == "worst-case":
        while True:
            c = _conditions(model, x, y, cx, training)
            if (c["data_margin"] >= DATA_MARGIN and c["canary_margin"] >= CANARY_MARGIN
                    and c["noise_share"] <= LINEARITY):  # fmt: skip
                break
            if a >= max_scale:
                raise InvalidParameterError(
                    f"model={type(model).__name__} is invalid for crafted initial parameters: at "
                    f"scale {a:g} the conditions still fail ({c})"
                )
            rescale(model, 2.0)
            a *= 2.0
    c = _conditions(model, x, y, cx, training)
    report = StartReport(
        init, float(np.mean(margins(model, x, y) > 0)), _saturated(model, x, y), a,
        c["data_margin"], c["canary_margin"], _canary_gradient(model, cx, cy, training.clip),
        c["noise_share"], tuple(int(i) for i in dead),
    )  # fmt: skip
    return Start(model, Canary(kind="input", x=cx, y=cy), report)


def describe(report: StartReport) -> str:
    """One line: the report's values."""
    return (
        f"{report.init} start: accuracy {report.train_accuracy:.4f}, {report.saturated:.4f} of the "
        f"data with zero gradient, scale {report.scale:g}, worst data margin {report.data_margin:.4g}"
        f", worst canary margin {report.canary_margin:.4g}, canary gradient "
        f"{report.canary_gradient:.4g} C, noise share {report.noise_share:.2g}"
    )


def crafted_problem(
    *, model: str = "logreg", data: str = "digits", n: int | None = 1000,
    init: str = "worst-case", noise: float, rate: float = 1.0, steps: int = 100,
    clip: float = 1.0, learning_rate: float = 5e-4, divisor: float = 1.0,
    threat: str = "black-box", relation: str | None = None, seed: int = 0, chunk: int = 2048,
    fit_steps: int = 2000,
) -> tuple[TrainingProblem, StartReport]:  # fmt: skip
    """A black-box (or white-box) audit's problem from :func:`crafted_start`.

    DP-SGD (:func:`~cbdp_jax._src.training_auditor.dp_steps.dp_sgd`) with the sum of clipped gradients divided by the
    constant ``divisor`` (1: summed, not averaged, as in Annamalai & De Cristofaro), Poisson
    sampling at ``rate`` (1: full batch, every example in every step), T = ``steps``.

    Returns:
      The :class:`TrainingProblem` and the start's :class:`StartReport`.

    """
    x, y = load_data(data, n=n, seed=seed)
    training = Training(learning_rate, clip, noise, steps, divisor)
    net = make_model(model, x.shape[1], int(y.max()) + 1, seed=seed)
    start = crafted_start(net, x, y, init=init, training=training, fit_steps=fit_steps)
    step = dp_sgd(
        learning_rate=learning_rate, l2_norm_clip=clip, noise_multiplier=noise,
        expected_batch_size=divisor,
    )  # fmt: skip
    sampling = "full batch" if rate == 1.0 else f"Poisson q={rate:g}"
    problem = TrainingProblem(
        model=start.model, data=(x, y), step=step, sampler=BatchSampler(kind="poisson", rate=rate),
        steps=steps, canary=start.canary, threat=threat, noise_multiplier=noise,
        l2_norm_clip=clip, relation=relation, chunk=chunk,
        name=f"dp-sgd {model}/{data} ({len(x)}), {sampling}, T={steps}, {init} init",
    )  # fmt: skip
    return problem, start.report
