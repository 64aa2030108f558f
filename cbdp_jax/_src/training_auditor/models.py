"""The library's models (an MLP, a small CNN for the 8x8 digits), with layers that can be tapped.

:class:`CNN` maps flattened square images ``[b, side * side]`` to logits: two 3x3 convolutions
(``SAME`` padding, ReLU, 2x2 average pooling after each) and a linear read-out. Like the library's
other models it is a Flax NNX module split once with ``nnx.split(model, nnx.Param)`` and vmapped
over runs by the training engine.

Every model of the library also has ``tapped_call(x, tap)``: the same forward pass, with each
parameterised layer's output passed through ``tap(layer, input, output)``. The per-example clipping
of :mod:`~cbdp_jax._src.training_auditor.ghost_clipping` uses it to add zero perturbations to the layers' outputs
(whose gradients are the per-example output gradients) and to read each layer's input, so that it
never materialises per-example gradients of dense layers. ``__call__`` is ``tapped_call`` with the
identity tap, so the two are the same computation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from cbdp_jax._src.infra.validation import InvalidParameterError, check_int_at_least


def _identity(layer, inputs, outputs):
    del layer, inputs
    return outputs


def conv_same(layer: nnx.Conv, h: jax.Array) -> jax.Array:
    """``layer(h)`` for a stride-1, ``SAME``-padded ``nnx.Conv`` with an odd kernel, as shifted slices.

    The same convolution as ``layer(h)`` (to float rounding), computed as one contraction of the
    k^2 shifted copies of the padded input with the kernel: under ``vmap`` over runs, each with
    its own kernel, this is a batched matrix product, where ``lax.conv`` becomes a grouped
    convolution (2x slower on CPU for the digits CNN, measured).
    """
    kh, kw = layer.kernel_size
    big_h, big_w = h.shape[1], h.shape[2]
    padded = jnp.pad(h, ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0)))
    shifted = [padded[:, i : i + big_h, j : j + big_w, :] for i in range(kh) for j in range(kw)]
    kernel = layer.kernel[...]
    out = jnp.einsum(
        "bhwkc,kco->bhwo", jnp.stack(shifted, axis=3), kernel.reshape(kh * kw, *kernel.shape[2:])
    )
    return out + layer.bias[...] if layer.bias is not None else out


class CNN(nnx.Module):
    """Two 3x3 convolutions, each followed by ReLU and 2x2 average pooling, then a linear read-out.

    x ``[b, side^2]`` -> Conv(c1) -> ReLU -> pool -> Conv(c2) -> ReLU -> pool -> Linear(classes).

    Args:
      features: The flattened image size, a square ``side * side`` with ``side`` divisible by 4.
      classes: Output classes.
      channels: The two convolutions' output channels.
      rngs: Flax NNX random streams (initialisation).

    """

    def __init__(
        self, features: int, classes: int, *, channels: tuple[int, int] = (4, 8), rngs: nnx.Rngs
    ):
        side = round(features**0.5)
        if side * side != features or side % 4:
            raise InvalidParameterError(
                f"features={features} is invalid for model 'cnn': must be side * side with side "
                "divisible by 4 (e.g. 64 for the 8x8 digits)"
            )
        c1, c2 = (check_int_at_least("cnn channels", c, 1) for c in channels)
        self.side = side
        # nnx.Conv layers (parameters, initialisation, metadata), applied by conv_same
        self.conv1 = nnx.Conv(1, c1, (3, 3), padding="SAME", rngs=rngs)
        self.conv2 = nnx.Conv(c1, c2, (3, 3), padding="SAME", rngs=rngs)
        self.out = nnx.Linear(c2 * (side // 4) ** 2, classes, rngs=rngs)

    def tapped_call(self, x, tap=_identity):
        """The forward pass with ``tap(layer, input, output)`` applied to each layer's output."""
        h = x.reshape((-1, self.side, self.side, 1))
        h = tap(self.conv1, h, conv_same(self.conv1, h))
        h = nnx.avg_pool(nnx.relu(h), (2, 2), strides=(2, 2))
        h = tap(self.conv2, h, conv_same(self.conv2, h))
        h = nnx.avg_pool(nnx.relu(h), (2, 2), strides=(2, 2))
        h = h.reshape((h.shape[0], -1))
        return tap(self.out, h, self.out(h))

    def __call__(self, x):
        return self.tapped_call(x)


class MLP(nnx.Module):
    """x -> Linear(hidden) -> ReLU -> Linear(classes)."""

    def __init__(self, features: int, hidden: int, classes: int, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(features, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, classes, rngs=rngs)

    def tapped_call(self, x, tap=_identity):
        """The forward pass with ``tap(layer, input, output)`` applied to each layer's output."""
        h = nnx.relu(tap(self.hidden, x, self.hidden(x)))
        return tap(self.out, h, self.out(h))

    def __call__(self, x):
        return self.tapped_call(x)
