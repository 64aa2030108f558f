"""Stage 1 of a training audit: prepare what every run shares, then probe the step.

:func:`prepare` splits the model, lays the data out in slots with the canary's slot last, fixes what
that slot holds on D and on D' under the audited relation, the canary's direction and its unit (the
step's response to a lone canary), and then hands the step to the probes (stage 2:
:mod:`~cbdp_jax._src.training_auditor.probes` for blind spots,
:mod:`~cbdp_jax._src.training_auditor.noise_probes` for the noise's law). The runs (stage 3,
:mod:`~cbdp_jax._src.training_auditor.runs`) read the :class:`Prepared` it returns.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.flatten_util import ravel_pytree

from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    check_in_range,
)
from cbdp_jax._src.training_auditor.noise_probes import noise_defects
from cbdp_jax._src.training_auditor.ops import (
    Prepared,
    example_loss,
    lone_response,
    per_example_grads,
    raw_key_leaves,
)
from cbdp_jax._src.training_auditor.probes import blind_spots, check_step
from cbdp_jax._src.training_auditor.problem import TrainingProblem, check_labels, cross_entropy


def _dead_coordinate(loss, graphdef, params, x, y) -> tuple[int, bool]:
    """The first flat coordinate no example's gradient moves (at init and at a perturbed point)."""
    flat, unravel = ravel_pytree(params)
    shaken = unravel(flat + 0.1 * jax.random.normal(jax.random.key(1), flat.shape))

    @jax.jit
    def largest(p):
        g = per_example_grads(loss, graphdef, p, x, y)
        return jnp.max(jnp.abs(jax.vmap(lambda t: ravel_pytree(t)[0])(g)), axis=0)

    moved = largest(params) + largest(shaken)
    i = int(jnp.argmin(moved))
    return i, bool(moved[i] == 0.0)


def _arrays(problem: TrainingProblem, graphdef, params):
    """The data as arrays (labels int32 for the default loss), checked against the model's classes."""
    x = jnp.asarray(problem.data[0], jnp.float32)
    y = np.asarray(problem.data[1])
    if problem.loss_fn is None:
        out = jax.eval_shape(lambda a: nnx.merge(graphdef, params)(a), x[:1])
        classes = int(out.shape[-1])
        check_labels(y, classes)
        if problem.canary.kind == "input":
            check_labels(np.atleast_1d(problem.canary.y), classes, name="canary y")
        return x, jnp.asarray(y, jnp.int32)
    dtype = jnp.int32 if np.issubdtype(y.dtype, np.integer) else jnp.float32
    return x, jnp.asarray(y, dtype)


def _slots(problem: TrainingProblem, x, y):
    """The slots: the data (less a replaced example) and the canary's slot last; D''s slot example."""
    c = problem.canary
    j = problem.replaced_index
    x_out = y_out = None
    if j is not None:
        x_out, y_out = x[j], y[j]
        x, y = jnp.delete(x, j, axis=0), jnp.delete(y, j, axis=0)
    if c.kind == "gradient":
        cx, cy = jnp.zeros((1, *x.shape[1:]), x.dtype), jnp.zeros((1, *y.shape[1:]), y.dtype)
    else:
        cx = jnp.asarray(c.x, x.dtype)[None]
        cy = jnp.asarray(c.y, y.dtype).reshape((1, *y.shape[1:]))
    return jnp.concatenate([x, cx]), jnp.concatenate([y, cy]), x_out, y_out


def _canary(problem: TrainingProblem, loss, graphdef, params, x, y, xs, ys):
    """The canary's unit direction, its gradient (gradient canary), coordinate and exactness."""
    flat, unravel = ravel_pytree(params)
    c = problem.canary
    if c.kind == "input":
        g0 = jax.grad(example_loss, argnums=2)(loss, graphdef, params, xs[-1], ys[-1])
        gflat = ravel_pytree(g0)[0]
        norm = float(jnp.linalg.norm(gflat))
        if not norm > 0:
            raise InvalidParameterError("canary is invalid: its gradient at initialisation is zero")
        return unravel(-gflat / norm), None, -1, False
    if c.coordinate is None:
        coord, exact = _dead_coordinate(loss, graphdef, params, x, y)
    else:
        coord = int(check_in_range("canary coordinate", c.coordinate, 0, flat.size - 1))
        exact = False
    direction = unravel(jnp.zeros_like(flat).at[coord].set(1.0))
    return direction, jax.tree.map(lambda d: problem.canary_norm() * d, direction), coord, exact


def prepare(problem: TrainingProblem, *, noise_probes: bool = True) -> Prepared:
    """Splits the model, lays out the slots, fixes the canary's records, direction and unit, probes the step.

    ``noise_probes=False`` leaves out the probes of the step's noise (``defects`` stays empty: a
    result for the blind spots alone, never for an audit).
    """
    graphdef, params = nnx.split(problem.model, nnx.Param)
    loss = cross_entropy if problem.loss_fn is None else problem.loss_fn
    x, y = _arrays(problem, graphdef, params)
    xs, ys, x_out, y_out = _slots(problem, x, y)
    slot = xs.shape[0] - 1
    relation = problem.audited_relation
    direction, canary_grad, coord, exact = _canary(problem, loss, graphdef, params, x, y, xs, ys)
    neighbour_grad, mean = None, 0.0  # zero-out weighs the slot by 0, add-remove leaves it out
    if relation == "replace-one" and x_out is None:  # a gradient canary replacing its opposite
        neighbour_grad, mean = jax.tree.map(jnp.negative, canary_grad), -1.0
    tx = problem.step_for(problem.examples)
    check_step(problem, tx, params)
    raw = raw_key_leaves(tx, params, problem.sampler.capacity(problem.examples))
    c = problem.canary
    prep = Prepared(
        graphdef, params, xs, ys, slot, canary_grad, direction, 1.0, coord, exact,
        neighbour_grad, x_out, y_out, relation, mean, (), loss, raw,
    )  # fmt: skip
    if c.kind == "gradient":
        prep = prep._replace(unit=_unit(problem, tx, prep))
    prep = prep._replace(blind_spots=blind_spots(problem, tx, prep))
    if not noise_probes:
        return prep
    return prep._replace(defects=noise_defects(jax.random.key(0), problem, tx, prep))


def _unit(problem: TrainingProblem, tx, prep: Prepared) -> float:
    """The step's response along the canary's direction to the lone canary."""
    cap = problem.sampler.capacity(problem.examples)
    unit = lone_response(tx, prep.params, prep.direction, prep.canary_grad, cap)
    if not (math.isfinite(unit) and abs(unit) > 0):
        raise InvalidParameterError(
            "step is invalid: a lone canary gradient does not move the parameters along its "
            f"direction (response {unit:g}; is the step applied to per-example gradients?)"
        )
    return unit
