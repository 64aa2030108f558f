"""The library's DP-SGD step on per-example gradients, with planted bugs an audit must find.

:func:`dp_sgd` is an ``optax.GradientTransformationExtraArgs``: its ``update`` takes per-example
gradients with a leading batch axis and, as an optional extra argument, ``batch_mask`` (bool
``[batch]``: the slots that hold an example of the data set; a training audit passes it, and a
zeroed canary's slot is one of them). Invalid slots hold zero gradients.

References:
  Abadi, Chu, Goodfellow, McMahan, Mironov, Talwar, Zhang 2016, "Deep learning with differential
  privacy", Algorithm 1.

"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    check_choice,
    check_in_range,
    check_int_at_least,
    check_key,
    check_positive,
)
from cbdp_jax._src.training_auditor import normal_draws
from cbdp_jax._src.training_auditor.planted_bugs import BUGS


class SummedForm(NamedTuple):
    """A step given the clipped sum instead of per-example gradients (``update.summed_form``).

    A DP step that clips each gradient to ``clip`` (None: no clipping) and then only uses the sum
    can expose this on its ``update`` function; a training audit then computes the clipped sum
    without materialising per-example gradients where the model allows
    (:mod:`~cbdp_jax._src.training_auditor.ghost_clipping`), and ``from_sum(summed, state, batch_mask)`` returns
    ``(updates, state)`` exactly as ``update`` would.
    """

    clip: float | None
    from_sum: Callable


class DpSgdState(NamedTuple):
    """State of :func:`dp_sgd`: the key of the next step's noise and the steps taken."""

    rng_key: jax.Array
    count: jax.Array | int = 0


def dp_sgd(
    *, learning_rate: float, l2_norm_clip: float, noise_multiplier: float,
    expected_batch_size: float, key: jax.Array | None = None, bug: str = "none",
    dataset_size: int | None = None,
) -> optax.GradientTransformationExtraArgs:  # fmt: skip
    """A hand-written DP-SGD step on per-example gradients ``[b, ...]`` (leading batch axis).

    update = -lr (sum_i clip_C(g_i) + N(0, (S C)^2 I)) / B with B the expected batch size (qn for
    Poisson sampling, so a variable batch is divided by a constant, as the accountant assumes).
    ``bug`` plants a known flaw:

    * ``'noise-after-averaging'``: the noise std is S C / B, as if for the mean, and is then divided
      by B again (the effective noise multiplier is S / B);
    * ``'no-clip'``: gradients summed unclipped;
    * ``'noise-on-subset'``: no noise on parameters named ``bias``;
    * ``'mean-over-batch'``: the noisy sum divided by the REALIZED batch size, the number of slots
      that hold an example (``batch_mask``; all slots when it is not given; at least 1). A zeroed
      record's slot counts, an absent one does not: it leaks under add/remove, where the other
      examples' clipped gradients align with the canary's;
    * ``'mean-over-dataset'``: the noisy sum divided by ``dataset_size``, the size of the data set
      the step was built for (a step per data set: D has n + 1 examples, its add/remove neighbour
      n; under zero-out both keep n + 1). With every example in every batch (q = 1) that is the
      realized batch size, what a full-batch implementation divides by.

    Bugs of the noise's law (each named by a probe of :mod:`~cbdp_jax._src.training_auditor.noise_probes`):

    * ``'key-reuse'``: the state returns its key unchanged, so every step draws the same noise
      (the most common JAX randomness mistake);
    * ``'scalar-noise'``: one normal per step, broadcast over every coordinate of every parameter;
    * ``'noise-every-other-step'``: noise at steps 0, 2, 4, ... only;
    * ``'shared-noise-across-leaves'``: one normal vector, as long as the largest parameter, whose
      first entries every parameter takes (coordinate j of each parameter gets the same noise).

    Args:
      learning_rate: The SGD step size, > 0.
      l2_norm_clip: C, > 0.
      noise_multiplier: S, >= 0.
      expected_batch_size: B, > 0.
      key: The noise key (a training audit replaces it per run); default ``jax.random.key(0)``.
      bug: One of ``BUGS``.
      dataset_size: The data set's size, for ``bug='mean-over-dataset'`` only.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose state is :class:`DpSgdState`.

    References:
      Abadi et al. 2016, Algorithm 1.

    """
    lr, clip = check_positive("learning_rate", learning_rate), check_positive("clip", l2_norm_clip)
    sigma = check_in_range("noise_multiplier", noise_multiplier, 0.0, math.inf)
    batch = check_positive("expected_batch_size", expected_batch_size)
    check_choice("bug", bug, BUGS)
    if bug == "mean-over-dataset":
        if dataset_size is None:
            raise InvalidParameterError(
                "dataset_size=None is invalid with bug='mean-over-dataset': give the data set's size"
            )
        batch = float(check_int_at_least("dataset_size", dataset_size, 1))
    key = jax.random.key(0) if key is None else check_key(key)

    def init(params):
        del params
        return DpSgdState(key, jnp.zeros((), jnp.int32))

    def update(grads, state, params=None, *, batch_mask=None, **extra_args):
        del params, extra_args
        norms = jax.vmap(optax.tree.norm)(grads)
        factor = jnp.ones_like(norms) if bug == "no-clip" else jnp.minimum(1.0, clip / norms)
        factor = jnp.nan_to_num(factor, nan=1.0)
        summed = jax.tree.map(lambda g: jnp.tensordot(factor, g, 1), grads)
        mask = jnp.ones(norms.shape, bool) if batch_mask is None else batch_mask
        return from_sum(summed, state, mask)

    def from_sum(summed, state, batch_mask):
        divisor = batch
        if bug == "mean-over-batch":
            divisor = jnp.maximum(jnp.sum(batch_mask), 1).astype(jnp.float32)
        paths, treedef = jax.tree_util.tree_flatten_with_path(summed)
        next_key, *keys = jax.random.split(state.rng_key, len(paths) + 1)
        noises = _noises(keys, [s for _, s in paths], sigma * clip, bug, state.count)
        out = []
        for (path, s), noise in zip(paths, noises, strict=True):
            if bug == "noise-on-subset" and "bias" in jax.tree_util.keystr(path):
                noise = jnp.zeros_like(noise)
            if bug == "noise-after-averaging":
                out.append(-lr * (s / batch + (noise / batch) / batch))
            else:
                out.append(-lr * (s + noise) / divisor)
        kept = state.rng_key if bug == "key-reuse" else next_key
        return jax.tree.unflatten(treedef, out), DpSgdState(kept, state.count + 1)

    # what the engine's ghost clipping needs: the clipping norm and the step after the clipped sum
    update.summed_form = SummedForm(None if bug == "no-clip" else clip, from_sum)
    return optax.GradientTransformationExtraArgs(init, update)


def _noises(keys, sums, std: float, bug: str, count) -> list:
    """Each leaf's noise of std ``std``, drawn as ``bug`` says (a fresh normal per coordinate if none)."""
    if bug == "scalar-noise":
        z = jax.random.normal(keys[0], ())
        return [std * jnp.broadcast_to(z, s.shape).astype(s.dtype) for s in sums]
    if bug == "shared-noise-across-leaves":
        z = jax.random.normal(keys[0], (max(s.size for s in sums),))
        return [std * z[: s.size].reshape(s.shape).astype(s.dtype) for s in sums]
    out = [std * normal_draws.normal(k, s.shape, s.dtype) for k, s in zip(keys, sums, strict=True)]
    if bug == "noise-every-other-step":
        return [jnp.where(count % 2 == 0, n, jnp.zeros_like(n)) for n in out]
    return out
