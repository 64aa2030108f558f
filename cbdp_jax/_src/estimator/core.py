"""The pure training core: an adversary class as functions of a parameter pytree.

In the blackjax style, an algorithm is a set of pure functions over NamedTuple pytrees that a user can
call inside their own ``jax.jit`` / ``jax.vmap`` / ``lax.scan``; the key comes first. Here:

- ``init(key, x_reference) -> TrainState``: parameters of one adversary (inputs standardised with the
  mean and spread of ``x_reference``), and the optimiser state;
- ``step(key, state, batch, alpha=None) -> (TrainState, StepInfo)``: one optimiser step on the
  training loss (minus the variational objective, plus its scale penalty) of one minibatch
  ``batch = (x_p [n, d], x_q [m, d])``;
- ``value(state, batch, alpha=None) -> scalar``: the training objective on a batch (validation);
- ``apply(params, rest, x) -> [n]``: the adversary's outputs.

:func:`trainer` builds them from a class (an :class:`~cbdp_jax.adversaries.AdversarySpec`, or any
``flax.nnx.Module`` with declared :class:`ClassProperties`), a divergence and an optax
``GradientTransformation`` (Adam with gradient clipping by default; its learning rate lives in the
optimiser state, so a new step size never recompiles). The estimator runs these functions vmapped over
its ensemble, the sweep vmapped and sharded over its members; both use
:func:`~cbdp_jax._src.estimator.adversary_fitting_ensemble.early_stopping_scan` around ``step`` and ``value``. The training forms
(Donsker-Varadhan for KL on translation-invariant classes, the scale-free Renyi form on cones) are
chosen from the class's properties: docs/theory/objectives.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from cbdp_jax._src.estimator.adversaries import (
    AdversarySpec,
    ClassProperties,
    CustomAdversary,
)
from cbdp_jax._src.estimator.objectives import conservative_fit, objective_functions
from cbdp_jax._src.infra import programs
from cbdp_jax._src.infra.validation import InvalidParameterError
from cbdp_jax._src.privacy.divergences import Divergence

GRADIENT_CLIP = 10.0


class TrainState(NamedTuple):
    """One adversary being trained.

    Attributes:
      params: Trainable parameters (``nnx.Param`` leaves).
      rest: Non-trainable state (input standardisation, fixed features).
      opt_state: The optimiser state (its learning rate included, for the default optimiser).

    """

    params: Any
    rest: Any
    opt_state: Any


class StepInfo(NamedTuple):
    """What one step saw.

    Attributes:
      value: The training objective on the step's batch, before the update.
      loss: The loss minimised: minus ``value`` plus the scale penalty (if any).

    """

    value: jax.Array
    loss: jax.Array


class Trainer(NamedTuple):
    """Pure functions training one adversary of a class (see the module docstring).

    Attributes:
      init: ``(key, x_reference [n, d]) -> TrainState``: inputs standardised with the reference
        sample's mean and spread.
      step: ``(key, state, (x_p, x_q), alpha=None) -> (TrainState, StepInfo)``.
      value: ``(state, (x_p, x_q), alpha=None, counts=None) -> scalar`` validation criterion: the
        training objective, or for the scale-free Renyi form its value minus 1.645 standard errors
        (``objectives.renyi_scale_free_score``), which picks the member and the stopping point.
        ``counts=(n_p, n_q)``: the samples are the first rows of padded arrays (:func:`outputs_of`
        computes the network only on the pieces that hold them).
      apply: ``(params, rest, x [n, d]) -> [n]`` outputs.
      init_standardised: ``(key, loc [d], scale [d]) -> TrainState``: inputs standardised with a
        known location and scale (the sweep knows its noise laws').
      graphdef: The class's module structure (static).
      properties: The class's :class:`ClassProperties`.
      objective: The training form: ``'dv'``, ``'renyi_scale_free'`` or ``'fform'``.
      label: A short name of the class.
      default_optimizer: The optimiser is :func:`default_optimizer` (its step size is in the state).
      line_search: The optimiser is L-BFGS (full batch only: its line search compares losses).

    """

    init: Callable[..., TrainState]
    step: Callable[..., tuple[TrainState, StepInfo]]
    value: Callable[..., jax.Array]
    apply: Callable[..., jax.Array]
    init_standardised: Callable[..., TrainState]
    graphdef: Any
    properties: ClassProperties
    objective: str
    label: str
    default_optimizer: bool = True
    line_search: bool = False


class StepSizeState(NamedTuple):
    """The default optimiser's step size, kept in its state (per member, traced)."""

    learning_rate: jax.Array


def scale_by_step_size(learning_rate: float) -> optax.GradientTransformation:
    """Multiplies the updates by ``-learning_rate``, the rate read from the state.

    What ``optax.scale_by_learning_rate`` does with the rate in the state instead of the closure: a
    restart with a smaller step, or members with different steps, reuse one compiled program. (Cheaper
    per step than ``optax.inject_hyperparams``, whose hyperparameter plumbing runs per member inside a
    vmapped ensemble.)
    """

    def init(params):
        del params
        return StepSizeState(jnp.asarray(learning_rate, dtype=float))

    def update(updates, state, params=None):
        del params
        lr = state.learning_rate
        return jax.tree.map(lambda u: -lr.astype(u.dtype) * u, updates), state

    return optax.GradientTransformation(init, update)


def default_optimizer(learning_rate: float = 1e-2) -> optax.GradientTransformation:
    """Adam with global-norm gradient clipping; the step size lives in the state.

    With b1, b2 fixed the bias corrections depend on the step count alone, which an ensemble shares
    (``adversary_fitting_ensemble.state_axes``), so they are computed once per ensemble step.
    """
    return optax.chain(
        optax.clip_by_global_norm(GRADIENT_CLIP),
        optax.scale_by_adam(),
        scale_by_step_size(learning_rate),
    )


def set_learning_rate(opt_state, learning_rate):
    """The default optimiser's state with a new step size (traced: changing it never recompiles)."""
    clip, adam, step = opt_state
    return (clip, adam, StepSizeState(jnp.asarray(learning_rate, step.learning_rate.dtype)))


def spec_properties(spec: AdversarySpec | CustomAdversary) -> ClassProperties:
    """The properties of a class (declared for a custom one)."""
    if isinstance(spec, CustomAdversary):
        return spec.properties
    return ClassProperties(
        cone=spec.is_cone,
        translation_invariant=spec.translation_invariant,
        contains_constants=spec.contains_constants,
        bound=spec.bound,
    )


def objective_kind(divergence: Divergence, properties: ClassProperties, tight: bool = True) -> str:
    """The training form the class allows (docs/theory/objectives.md)."""
    if tight and divergence.name == "kl" and properties.translation_invariant:
        return "dv"
    if (
        tight
        and divergence.name in ("renyi", "alpha")
        and properties.cone
        and divergence.convention == "abs"
    ):
        return "renyi_scale_free"
    return "fform"


def as_class(adversary, properties: ClassProperties | None = None):
    """A class ready to train.

    A built-in :class:`~cbdp_jax._src.estimator.adversaries.AdversarySpec` or a
    :class:`~cbdp_jax._src.estimator.adversaries.CustomAdversary` is returned as it is; a module instance or a
    factory ``rngs -> Module`` is wrapped with its declared ``properties``.
    """
    if isinstance(adversary, (AdversarySpec, CustomAdversary)):
        return adversary
    if not (isinstance(adversary, nnx.Module) or callable(adversary)):
        raise InvalidParameterError(
            f"adversary={adversary!r} is invalid: must be an AdversarySpec, a CustomAdversary, a "
            "flax.nnx.Module, or a function rngs -> nnx.Module"
        )
    if properties is None:
        raise InvalidParameterError(
            "properties is invalid: a custom class needs declared ClassProperties (cone, "
            "translation_invariant, contains_constants, bound)"
        )
    if isinstance(adversary, nnx.Module):
        template = nnx.split(adversary)  # every member starts from a copy of this module

        def factory(rngs):
            return nnx.merge(*template)

        return CustomAdversary(factory, properties, name=type(adversary).__name__)
    return CustomAdversary(adversary, properties)


def trainer(
    adversary: AdversarySpec | nnx.Module | Callable[[nnx.Rngs], nnx.Module],
    divergence: Divergence,
    *,
    dim: int,
    optimizer: optax.GradientTransformation | str | None = None,
    learning_rate: float = 1e-2,
    properties: ClassProperties | None = None,
    tight: bool = True,
    dtype=jnp.float32,
) -> Trainer:
    """The pure functions that train one adversary of a class against ``divergence``.

    Args:
      adversary: A built-in class (:class:`~cbdp_jax.adversaries.AdversarySpec`), or a custom class:
        a function ``rngs -> nnx.Module`` (each ``init`` builds a fresh module from its key) or a
        ``flax.nnx.Module`` instance (each ``init`` starts from a copy of it), mapping
        ``[n, dim] -> [n]``; its ``nnx.Param`` leaves are trained. A custom class needs
        ``properties``.
      divergence: What to maximise.
      dim: The input dimension.
      optimizer: Any ``optax.GradientTransformation``; ``'adam'`` or None for
        :func:`default_optimizer`; ``'lbfgs'`` for L-BFGS with a zoom line search (full batch only;
        for classes linear in their parameters, where the problem is concave).
      learning_rate: The default optimiser's step size (ignored with ``optimizer``).
      properties: The declared properties of a custom module (required for one; checked where the
        library can, see :func:`check_properties`).
      tight: Train with the tighter forms where the class allows them.
      dtype: Parameter and input dtype.

    Returns:
      A :class:`Trainer`.

    Raises:
      InvalidParameterError: A custom module without properties, or with a declaration its outputs
        contradict.

    Examples:
      >>> import jax, optax
      >>> from cbdp_jax.adversaries import AdversarySpec
      >>> from cbdp_jax.divergences import Divergence
      >>> t = trainer(AdversarySpec(name="linear"), Divergence.kl(), dim=1,
      ...             optimizer=optax.sgd(0.1))
      >>> x = jax.random.normal(jax.random.key(0), (256, 1))
      >>> state = t.init(jax.random.key(1), x)
      >>> state, info = t.step(jax.random.key(2), state, (x, x + 1.0))
      >>> info.value.shape
      ()

    """
    tx, is_default, line_search = _optimizer(optimizer, learning_rate)
    adversary = as_class(adversary, properties)
    props = spec_properties(adversary)
    label = adversary.label
    if isinstance(adversary, CustomAdversary):
        check_properties(adversary.build(jax.random.key(0), dim, dtype=dtype), props, dim, dtype)

    def build(key, loc, scale):
        return adversary.build(key, dim, loc=loc, scale=scale, dtype=dtype)

    # The graph definition from shapes alone (nnx.eval_shape): no array is computed, so building a
    # trainer runs no eager operation (each would be a separate program to load at cold start).
    graphdef = nnx.split(
        nnx.eval_shape(lambda: build(jax.random.key(0), None, None)), nnx.Param, ...
    )[0]
    kind = objective_kind(divergence, props, tight)
    fns = objective_functions(kind, divergence.name, divergence.convention)
    apply, value, loss = _apply_value_loss(graphdef, fns, divergence)
    init, init_standardised = _initialisers(build, tx, dtype)
    step = _line_search_step(loss, tx) if line_search else _gradient_step(loss, tx)
    out = Trainer(
        init,
        step,
        value,
        apply,
        init_standardised,
        graphdef,
        props,
        kind,
        label,
        is_default,
        line_search,
    )
    if is_default or line_search:
        _register_built_in(out, adversary, divergence, dim, learning_rate, tight, dtype)
    return out


def _optimizer(optimizer, learning_rate: float) -> tuple[optax.GradientTransformation, bool, bool]:
    """The optimiser :func:`trainer` names: (transformation, is the default, is L-BFGS)."""
    line_search = isinstance(optimizer, str) and optimizer == "lbfgs"
    if isinstance(optimizer, str) and optimizer not in ("adam", "lbfgs"):
        raise InvalidParameterError(
            f"optimizer={optimizer!r} is invalid: must be 'adam', 'lbfgs' or an "
            "optax.GradientTransformation"
        )
    is_default = optimizer is None or optimizer == "adam"
    if is_default:
        tx = default_optimizer(learning_rate)
    elif line_search:
        tx = optax.lbfgs()
    elif isinstance(optimizer, optax.GradientTransformation):
        tx = optimizer
    else:
        raise InvalidParameterError(
            f"optimizer={optimizer!r} is invalid: must be 'adam', 'lbfgs' or an "
            "optax.GradientTransformation"
        )
    return tx, is_default, line_search


def _apply_value_loss(graphdef, fns, divergence: Divergence) -> tuple[Callable, Callable, Callable]:
    """The class's outputs, its validation criterion and its training loss: (apply, value, loss)."""

    def apply(params, rest, x):
        return nnx.merge(graphdef, params, rest)(x)

    def _alpha(alpha):
        return divergence.alpha if alpha is None else alpha

    def value(state, batch, alpha=None, counts=None):
        # The validation criterion (the objective, or its lower value for the scale-free Renyi form).
        x_p, x_q = batch
        if counts is None:
            h_p, h_q = apply(state.params, state.rest, x_p), apply(state.params, state.rest, x_q)
            return fns.score(h_p, h_q, _alpha(alpha))
        net = functools.partial(apply, state.params, state.rest)
        h_p, h_q = outputs_of(net, x_p, counts[0]), outputs_of(net, x_q, counts[1])
        masks = tuple(jnp.arange(h.shape[0]) < n for h, n in zip((h_p, h_q), counts, strict=True))
        return fns.score(h_p, h_q, _alpha(alpha), masks)

    def loss(params, rest, batch, alpha):
        x_p, x_q = batch
        n = x_p.shape[0]
        # One pass over both sides: fewer, larger matrix products.
        h = apply(params, rest, jnp.concatenate([x_p, x_q], axis=0))
        h_p, h_q = h[:n], h[n:]
        v = fns.value(h_p, h_q, _alpha(alpha))
        return -v + fns.penalty(h_p, h_q), v

    return apply, value, loss


# The rows of each piece :func:`outputs_of` runs the network on.
PIECE_ROWS = 2048


def outputs_of(net: Callable, x: jax.Array, n, piece: int = PIECE_ROWS) -> jax.Array:
    """``net(x)`` ``[rows]`` on the pieces of ``piece`` rows that hold the first ``n`` rows of ``x``.

    ``x`` is a sample padded to ``rows`` rows (a multiple of ``piece``); ``n`` may be traced. The
    network runs on ``ceil(n / piece)`` pieces (a loop with a run-time trip count), not on the
    padding beyond them, whose outputs are 0: a program compiled for a bucket of rows costs about
    what the samples in it need. Each row's output is the network's on that row. Traceable.
    """
    rows = x.shape[0]
    if rows % piece or rows == piece:
        return net(x)
    shape = jax.eval_shape(net, jax.ShapeDtypeStruct((piece,) + x.shape[1:], x.dtype))

    def body(i, out):
        start = i * piece
        h = net(jax.lax.dynamic_slice_in_dim(x, start, piece))
        return jax.lax.dynamic_update_slice_in_dim(out, h, start, 0)

    pieces = (jnp.asarray(n, jnp.int32) + piece - 1) // piece
    return jax.lax.fori_loop(0, pieces, body, jnp.zeros((rows,), shape.dtype))


def _initialisers(build, tx: optax.GradientTransformation, dtype) -> tuple[Callable, Callable]:
    """``init`` (standardised by a reference sample) and ``init_standardised`` (by loc and scale)."""

    def init_standardised(key, loc, scale):
        _, params, rest = nnx.split(build(key, loc, scale), nnx.Param, ...)
        return TrainState(params, rest, tx.init(params))

    def init(key, x_reference):
        x_reference = jnp.asarray(x_reference, dtype)
        loc = jnp.mean(x_reference, axis=0)
        spread = jnp.std(x_reference, axis=0)
        return init_standardised(key, loc, jnp.where(spread > 0, spread, 1.0))

    return init, init_standardised


def _gradient_step(loss: Callable, tx: optax.GradientTransformation) -> Callable:
    """One optimiser step on a minibatch (Adam or a user's optax transformation)."""

    def step(key, state, batch, alpha=None):
        del key  # the optimisers are deterministic; the key is first for the blackjax signature
        (total, v), grad = jax.value_and_grad(loss, has_aux=True)(
            state.params, state.rest, batch, alpha
        )
        updates, opt_state = tx.update(grad, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return TrainState(params, state.rest, opt_state), StepInfo(v, total)

    return step


def _line_search_step(loss: Callable, tx: optax.GradientTransformation) -> Callable:
    """One L-BFGS step with its zoom line search (full batch)."""

    def line_search_step(key, state, batch, alpha=None):
        del key

        def fn(p):
            return loss(p, state.rest, batch, alpha)[0]

        total, grad = optax.value_and_grad_from_state(fn)(state.params, state=state.opt_state)
        updates, opt_state = tx.update(
            grad, state.opt_state, state.params, value=total, grad=grad, value_fn=fn
        )
        params = optax.apply_updates(state.params, updates)
        # L-BFGS's value_fn must return the loss alone: the curve shows -loss (objective - penalty).
        return TrainState(params, state.rest, opt_state), StepInfo(-total, total)

    return line_search_step


def _register_built_in(t: Trainer, adversary, divergence, dim, learning_rate, tight, dtype) -> None:
    """Declares a built-in class's trainer and graph definition to :mod:`~cbdp_jax._src.infra.programs`.

    What they compute is fixed by the class, dimension, dtype, divergence and named optimiser. A custom module or a user's optimiser is never declared, so programs over it are always traced.
    """
    graph = programs.fingerprint((adversary, dim, jnp.dtype(dtype)))
    if not isinstance(adversary, AdversarySpec) or graph is None:
        return
    optimizer = "lbfgs" if t.line_search else "adam"
    recipe = programs.fingerprint((graph, divergence, optimizer, float(learning_rate), bool(tight)))
    if recipe is not None:
        programs.register(t.graphdef, f"graphdef{graph}")
        programs.register(t, f"trainer{recipe}")


def check_properties(module: nnx.Module, props: ClassProperties, dim: int, dtype) -> None:
    """Checks the declarations a custom module's outputs can contradict, on probe inputs.

    - ``bound=B``: every output on 4096 normal inputs of spreads 1 to 100 lies in [-B, B].
    - ``cone=True``: scaling every parameter by 10 must scale the outputs' spread by at least 2 (a
      saturating output, such as a tanh, does not scale and is not a cone).

    Raises:
      InvalidParameterError: Naming the declaration and what the outputs showed.

    """
    x = jax.random.normal(jax.random.key(0), (4096, dim), dtype)
    x = x * jnp.geomspace(1.0, 100.0, 4096, dtype=dtype)[:, None]
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)
    h = np.asarray(nnx.merge(graphdef, params, rest)(x), np.float64)
    if h.shape != (4096,):
        raise InvalidParameterError(
            f"adversary is invalid: a custom module must map [n, {dim}] to [n]; it returned "
            f"shape {h.shape} for n = 4096"
        )
    if props.bound is not None and not np.all(np.abs(h) <= props.bound * (1 + 1e-6)):
        raise InvalidParameterError(
            f"properties.bound={props.bound:g} is invalid for this module: its outputs reach "
            f"{np.max(np.abs(h)):.4g} on probe inputs"
        )
    if props.cone:
        scaled = jax.tree.map(lambda p: 10.0 * p, params)
        h10 = np.asarray(nnx.merge(graphdef, scaled, rest)(x), np.float64)
        spread, spread10 = float(np.std(h)), float(np.std(h10))
        if not (spread10 >= 2.0 * spread and math.isfinite(spread10)):
            raise InvalidParameterError(
                "properties.cone=True is invalid for this module: scaling its parameters by 10 "
                f"changed the spread of its outputs from {spread:.4g} to {spread10:.4g}; a cone's "
                "outputs scale (t h is in H for t > 0)"
            )


@functools.lru_cache(maxsize=128)
def cached_trainer(
    adversary,
    divergence: Divergence,
    *,
    dim: int,
    optimizer=None,
    properties: ClassProperties | None = None,
    tight: bool = True,
    dtype=jnp.float32,
) -> Trainer:
    """:func:`trainer` for hashable arguments, built once per distinct argument set.

    Compiled programs that take the trainer as a static argument are then reused by every call with
    the same class, divergence and optimiser.

    The default optimiser keeps its step size in the state, so the learning rate is not part of the
    key (set it with :func:`set_learning_rate` or :func:`~cbdp_jax._src.estimator.adversary_fitting_ensemble.init_ensemble`).
    """
    return trainer(
        adversary,
        divergence,
        dim=dim,
        optimizer=optimizer,
        properties=properties,
        tight=tight,
        dtype=dtype,
    )


def fit(
    trainer: Trainer,
    divergence: Divergence,
    params,
    rest,
    fit_batch,
    val_batch,
    z,
    alpha=None,
) -> tuple[jax.Array, jax.Array]:
    """The fixed critic's affine map ``(scale, shift)``: closed form, then the best validation bound.

    The trained direction becomes one member of the plain f-form: the constant (KL) or the sign and
    scale (alpha family) fitted in closed form on ``fit_batch`` (training outputs), then moved to the
    point of the best lower confidence bound on ``val_batch`` (``objectives.conservative_fit``;
    docs/theory/objectives.md section 3). Pure and traceable (``alpha`` may be traced), so the sweep
    vmaps it over its members.
    """
    scale, shift = closed_form_fit(trainer, divergence, params, rest, fit_batch, alpha)
    h = lambda x: trainer.apply(params, rest, x)  # noqa: E731
    return conservative_fit_outputs(
        trainer.objective, divergence, h(val_batch[0]), h(val_batch[1]), scale, shift, z, alpha
    )


def fit_outputs(
    objective: str, divergence: Divergence, h_fit, h_val, z, alpha=None, *, masks_fit=None,
    masks_val=None,
) -> tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]:  # fmt: skip
    """:func:`fit` and :func:`closed_form_fit` from the network's outputs: ``(conservative, plain)``.

    ``h_fit = (h_p, h_q)`` on the fitting (training) samples and ``h_val`` on validation samples;
    ``masks_fit`` and ``masks_val`` mark the rows that are samples where the outputs are padded (the
    estimator computes the outputs in fixed-size chunks, so that one program serves every size).
    Pure and traceable.
    """
    fns = objective_functions(objective, divergence.name, divergence.convention)
    a = divergence.alpha if alpha is None else alpha
    if masks_fit is None:
        plain = fns.fit(h_fit[0], h_fit[1], a)
    else:
        plain = fns.fit(h_fit[0], h_fit[1], a, masks_fit)
    conservative = conservative_fit_outputs(
        objective, divergence, h_val[0], h_val[1], *plain, z, alpha, masks_val
    )
    return conservative, plain


def conservative_fit_outputs(
    objective: str, divergence: Divergence, h_p_val, h_q_val, scale, shift, z, alpha=None,
    masks=None,
) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """``objectives.conservative_fit`` of a class's objective and divergence (validation outputs)."""
    fns = objective_functions(objective, divergence.name, divergence.convention)
    a = divergence.alpha if alpha is None else alpha
    return conservative_fit(objective, fns.conjugate, h_p_val, h_q_val, scale, shift, z, a, masks)


def closed_form_fit(
    trainer: Trainer, divergence: Divergence, params, rest, fit_batch, alpha=None
) -> tuple[jax.Array, jax.Array]:
    """The closed-form ``(scale, shift)`` on ``fit_batch``.

    The member of the plain f-form with the largest mean along the trained direction: the estimate's
    critic (:func:`fit` then moves it to the best validation bound for the certified critic). Pure and
    traceable.
    """
    fns = objective_functions(trainer.objective, divergence.name, divergence.convention)
    a = divergence.alpha if alpha is None else alpha
    h = lambda x: trainer.apply(params, rest, x)  # noqa: E731
    return fns.fit(h(fit_batch[0]), h(fit_batch[1]), a)
