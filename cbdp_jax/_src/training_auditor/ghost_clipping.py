"""Per-example clipping without per-example gradients of dense layers ("ghost clipping").

A DP-SGD step needs, for a batch of b examples, each example's gradient norm ||g_i|| and the clipped
sum sum_i w_i min(1, C / ||g_i||) g_i. Materialising the b per-example gradients (what
``vmap(grad)`` does) costs b x (parameters) floats per step and dominates full-batch training. For
a dense layer z = a W + c the per-example gradient is the outer product a_i (x) delta_i of its input
and its output gradient, so ||g_i||^2 = ||a_i||^2 ||delta_i||^2 (+ ||delta_i||^2 for the bias)
without forming it (Goodfellow 2015), and the clipped sum is the gradient of the weighted loss
sum_i w_i c_i L_i, one more backward pass.

How: the model's ``tapped_call(x, tap)`` (:mod:`~cbdp_jax._src.training_auditor.models`; a bare
``nnx.Linear`` is tapped directly) adds a zero perturbation e_l to each layer's output and records
the layer's input. One forward pass under ``jax.vjp`` then gives everything: the cotangent of e_l
for the per-example loss gradients dL/dlogits is the per-example output gradient delta_l (row i of
the logits depends only on row i of e_l), and the same ``vjp`` applied to the weighted cotangents
is the clipped sum. Convolutions (and dense layers on inputs of more than one axis) share their
kernel over positions, so their per-example gradients are formed, for that layer only, by a
per-example ``vjp`` of the layer alone (the layer is affine in its parameters, so the point does
not matter).

Supported: models whose parameters all belong to ``nnx.Linear`` and ``nnx.Conv`` layers reached by
``tapped_call``, each called once per forward pass, with a loss that is a per-example function of
the logits. :func:`ghost_plan` says whether a model qualifies (None otherwise: the engine then uses
per-example gradients).

References:
  Goodfellow 2015, "Efficient per-example gradient computations"; Li, Tramer, Liang, Hashimoto
  2022, "Large language models can be strong differentially private learners" (ghost clipping);
  Bu, Mao, Xu 2022, "Scalable and efficient training of large convolutional neural networks with
  differential privacy" (mixed ghost clipping for convolutions).

"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from cbdp_jax._src.training_auditor.ops import slot_batch


class GhostLayer(NamedTuple):
    """One tapped layer: how its per-example gradient norms are computed.

    Attributes:
      kind: ``'dense'`` (the outer-product formula), ``'conv'`` (a 2-D convolution: its input's
        patches, then the per-example gradient or the Gram form, whichever is smaller) or
        ``'layer'`` (per-example ``vjp`` of the layer alone).
      bias: Whether a dense layer has a bias.
      graphdef: The layer's graph (``'layer'`` kind), to call it with other parameters.
      params: The layer's parameter shapes (``jax.ShapeDtypeStruct`` tree, ``'layer'`` kind).
      conv: A ``'conv'`` layer's (kernel size, strides, padding, kernel dilation).

    """

    kind: str
    bias: bool
    graphdef: Any = None
    params: Any = None
    conv: tuple = ()


class GhostPlan(NamedTuple):
    """What :func:`clipped_sum` needs about a model: its tapped layers, in call order."""

    layers: tuple[GhostLayer, ...]


def _call(model, x, tap):
    if isinstance(model, nnx.Linear):
        return tap(model, x, model(x))
    return model.tapped_call(x, tap)


def _size(tree) -> int:
    return int(sum(np.prod(a.shape) for a in jax.tree.leaves(tree)))


def ghost_plan(graphdef, params, x_shape: tuple[int, ...]) -> GhostPlan | None:
    """The model's tapped layers, or None when ghost clipping does not apply to it.

    It applies when the model is an ``nnx.Linear`` or has ``tapped_call``, every tapped layer is an
    ``nnx.Linear`` or ``nnx.Conv`` called once, and the tapped layers hold every parameter.
    """
    model = nnx.merge(graphdef, params)
    if not (isinstance(model, nnx.Linear) or hasattr(model, "tapped_call")):
        return None
    found: list[tuple[Any, tuple[int, ...]]] = []

    def record(layer, a, out):
        found.append((layer, a.shape))
        return out

    try:
        jax.eval_shape(lambda p, x: _call(nnx.merge(graphdef, p), x, record), params,
                       jax.ShapeDtypeStruct(x_shape, jnp.float32))  # fmt: skip
    except Exception:  # a tapped_call that does not trace: no plan (the engine's default path)
        return None
    if len({id(layer) for layer, _ in found}) != len(found):
        return None  # a layer called twice: its per-example gradient is a sum of two taps
    layers, covered = [], 0
    for layer, in_shape in found:
        if not isinstance(layer, (nnx.Linear, nnx.Conv)):
            return None
        lg, lp = nnx.split(layer, nnx.Param)
        covered += _size(lp)
        bias = getattr(layer, "bias", None) is not None
        if isinstance(layer, nnx.Linear) and len(in_shape) == 2:
            layers.append(GhostLayer("dense", bias))
        elif _patchable(layer, in_shape):
            layers.append(GhostLayer("conv", bias, conv=_conv_spec(layer)))
        else:
            shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), lp)
            layers.append(GhostLayer("layer", bias, lg, shapes))
    if covered != _size(params):
        return None
    return GhostPlan(tuple(layers))


def _patchable(layer, in_shape) -> bool:
    """A plain 2-D convolution on ``[b, H, W, C]`` (no groups, mask or input dilation)."""
    if not isinstance(layer, nnx.Conv) or len(in_shape) != 4 or len(layer.kernel_size) != 2:
        return False
    plain = lambda v: v is None or v == 1 or tuple(v) == (1, 1)
    padding = layer.padding
    return (
        layer.feature_group_count == 1 and layer.mask is None and plain(layer.input_dilation)
        and (padding in ("SAME", "VALID") or not isinstance(padding, str))
    )  # fmt: skip


def _conv_spec(layer) -> tuple:
    pair = lambda v: (1, 1) if v is None else (v, v) if isinstance(v, int) else tuple(v)
    padding = layer.padding
    if not isinstance(padding, str):
        padding = tuple((p, p) if isinstance(p, int) else tuple(p) for p in padding)
        padding = padding * 2 if len(padding) == 1 else padding
    return tuple(layer.kernel_size), pair(layer.strides), padding, pair(layer.kernel_dilation)


def _conv_norms2(layer: GhostLayer, a: jax.Array, d: jax.Array) -> jax.Array:
    """A 2-D convolution's squared per-example gradient norms from its input's patches.

    The kernel's gradient is sum_p patch_p (x) delta_p over the output positions p: formed per
    example ([K, O]) when K O <= P^2, else through the Gram form sum_{p,p'} (patch_p . patch_p')
    (delta_p . delta_p'), the mixed ghost norm of Bu et al. 2022.
    """
    size, strides, padding, dilation = layer.conv
    patches = jax.lax.conv_general_dilated_patches(
        a, size, strides, padding, rhs_dilation=dilation,
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )  # fmt: skip
    b = a.shape[0]
    patches, d = patches.reshape(b, -1, patches.shape[-1]), d.reshape(b, -1, d.shape[-1])
    p, k, o = d.shape[1], patches.shape[-1], d.shape[-1]
    if k * o <= p * p:
        g = jnp.einsum("bpk,bpo->bko", patches, d)
        out = jnp.sum(g * g, axis=(1, 2))
    else:
        out = jnp.sum(
            jnp.einsum("bpk,bqk->bpq", patches, patches) * jnp.einsum("bpo,bqo->bpq", d, d),
            axis=(1, 2),
        )
    if layer.bias:
        out = out + jnp.sum(jnp.sum(d, axis=1) ** 2, axis=1)
    return out


def _layer_norms2(layer: GhostLayer, a: jax.Array, d: jax.Array) -> jax.Array:
    """Squared per-example gradient norms ``[b]`` of one layer's parameters."""
    if layer.kind == "dense":
        dd = jnp.sum(d * d, axis=1)
        return jnp.sum(a * a, axis=1) * dd + (dd if layer.bias else 0.0)
    if layer.kind == "conv":
        return _conv_norms2(layer, a, d)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), layer.params)

    def one(ai, di):
        f = lambda p: nnx.merge(layer.graphdef, p)(ai[None])
        (g,) = jax.vjp(f, zeros)[1](di[None])
        return sum(jnp.sum(leaf * leaf) for leaf in jax.tree.leaves(g))

    return jax.vmap(one)(a, d)


def clipped_sum(
    plan: GhostPlan, graphdef, params, x: jax.Array, y: jax.Array, weights: jax.Array,
    clip: float | None, loss_on_logits: Callable,
) -> tuple[Any, jax.Array]:  # fmt: skip
    """sum_i w_i min(1, C / ||g_i||) g_i and the norms ||g_i|| ``[b]``, g_i = grad of L(x_i, y_i).

    Args:
      plan: The model's :func:`ghost_plan`.
      graphdef: The model's graph.
      params: Its parameters (where the gradients are taken).
      x: The batch ``[b, ...]``.
      y: The labels ``[b, ...]``.
      weights: w ``[b]`` (0 for slots that hold no example).
      clip: C, or None for no clipping (factor 1).
      loss_on_logits: ``(logits [b, k], y [b]) -> [b]``, the per-example losses.

    Returns:
      The clipped, weighted sum (a pytree like ``params``) and the per-example norms ``[b]``.

    """
    taps = len(plan.layers)

    def forward(p, perturbations):
        acts, it = [], iter(perturbations)

        def tap(layer, a, out):
            acts.append(a)
            return out + next(it)

        return _call(nnx.merge(graphdef, p), x, tap), acts

    shapes: list[Any] = []

    def record(layer, a, out):
        shapes.append(jax.ShapeDtypeStruct(out.shape, out.dtype))
        return out

    jax.eval_shape(lambda p: _call(nnx.merge(graphdef, p), x, record), params)
    assert len(shapes) == taps
    zeros = [jnp.zeros(s.shape, s.dtype) for s in shapes]
    logits, vjp_fn, acts = jax.vjp(forward, params, zeros, has_aux=True)
    dlogits = jax.grad(lambda z: jnp.sum(loss_on_logits(z, y)))(logits)
    _, deltas = vjp_fn(dlogits)
    norms2 = sum(
        _layer_norms2(layer, a.reshape(a.shape[0], -1) if layer.kind == "dense" else a, d)
        for layer, a, d in zip(plan.layers, acts, deltas, strict=True)
    )
    norms = jnp.sqrt(norms2)
    if clip is None:
        factor = jnp.ones_like(norms)
    else:
        factor = jnp.nan_to_num(jnp.minimum(1.0, clip / norms), nan=1.0)
    scale = (weights * factor).astype(dlogits.dtype)
    summed, _ = vjp_fn(dlogits * scale.reshape((-1,) + (1,) * (dlogits.ndim - 1)))
    return summed, norms


def _ce(logits, y):
    return optax.losses.softmax_cross_entropy_with_integer_labels(logits, y)


def ghost_update(prep, tx, default_loss: bool) -> Callable | None:
    """The engine's step by ghost clipping, or None where it does not apply.

    The step is ``(params, state, idx, valid, present) -> (updates, state)``. It applies when the step exposes ``update.summed_form`` (:class:`~cbdp_jax._src.training_auditor.dp_steps.
    SummedForm`, the library's ``dp_sgd``), the loss is the default cross-entropy and the model has
    a :func:`ghost_plan`. The batch is the one the engine's per-example path builds
    (``training_runs.batch_grads``): the slots' examples, D''s replaced example in the canary's slot
    under replace-one, a zero gradient in D''s slot under zero-out, and a fixed gradient (the
    gradient canary on D, its neighbour's on D') in that slot instead of the loss's, each clipped
    like any example's.
    """
    form = getattr(tx.update, "summed_form", None)
    if form is None or not default_loss:
        return None
    plan = ghost_plan(prep.graphdef, prep.params, (2, *prep.x.shape[1:]))
    if plan is None:
        return None
    fixed = [g for g in (prep.canary_grad, prep.neighbour_grad) if g is not None]
    factors = [
        1.0 if form.clip is None else min(1.0, form.clip / max(_tree_norm(g), 1e-30)) for g in fixed
    ]

    def update(params, state, idx, valid, present):
        x, y, is_slot, on_d = slot_batch(prep, idx, present)
        w = valid.astype(jnp.float32)
        here = []
        if prep.canary_grad is not None:
            here.append(is_slot & on_d)
        if prep.neighbour_grad is not None:
            here.append(is_slot & ~on_d)
        for h in here:  # a fixed gradient replaces the loss's in the slot
            w = jnp.where(h, 0.0, w)
        if prep.relation == "zero-out":  # D''s slot stays in the batch with a zero gradient
            w = jnp.where(is_slot & ~on_d, 0.0, w)
        summed, _ = clipped_sum(plan, prep.graphdef, params, x, y, w, form.clip, _ce)
        for g, f, h in zip(fixed, factors, here, strict=True):
            c = jnp.sum(h & valid).astype(jnp.float32) * f
            summed = jax.tree.map(lambda s, gi, c=c: s + c * gi, summed, g)
        return form.from_sum(summed, state, valid)

    return update


def _tree_norm(tree) -> float:
    return float(jnp.sqrt(sum(jnp.sum(jnp.square(a)) for a in jax.tree.leaves(tree))))
