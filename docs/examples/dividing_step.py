"""A user's DP-SGD step as one might write it, with a normalisation leak (README, docs/theory/training_audit.md).

It clips each example's gradient to norm ``clip``, sums, adds Gaussian noise of std ``noise * clip``
and divides by the number of non-zero per-example gradients: the realized batch, as the step sees
it. That division leaks under add/remove (an absent example lowers the count) and, because the step
cannot tell a zeroed row from an absent one, under zero-out too. `tests/test_training_relations.py`
and `benchmarks/training_relations.py` audit it; `TrainingProblem(step=dividing_step(...))` is how a
user's own step is audited.
"""

import jax
import jax.numpy as jnp
import optax


def dividing_step(learning_rate: float, clip: float, noise: float, seed: int = 0):
    """Clip, sum, add noise, divide by the number of non-zero per-example gradients.

    The count is the realized batch as the step sees it; it cannot tell a zeroed row from an absent
    one, so zero-out and add/remove see the same leak.
    """

    def init(params):
        del params
        return (jax.random.key(seed),)

    def update(grads, state, params=None):
        del params
        norms = jax.vmap(optax.tree.norm)(grads)
        count = jnp.maximum(jnp.sum(norms > 0), 1).astype(jnp.float32)
        scale = jnp.minimum(1.0, clip / jnp.where(norms > 0, norms, 1.0))
        summed = jax.tree.map(lambda g: jnp.tensordot(scale, g, 1), grads)
        leaves, treedef = jax.tree.flatten(summed)
        key, *keys = jax.random.split(state[0], len(leaves) + 1)
        noisy = [
            s + noise * clip * jax.random.normal(k, s.shape)
            for s, k in zip(leaves, keys, strict=True)
        ]
        updates = [-learning_rate * v / count for v in noisy]
        return jax.tree.unflatten(treedef, updates), (key,)

    return optax.GradientTransformation(init, update)
