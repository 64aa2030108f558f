"""A user's DP-SGD step in optax that forgets to advance its key (docs/theory/training_audit.md, 11).

The step clips each example's gradient to norm C = 1, sums, adds N(0, (S C)^2) with S = 1 and
divides by the expected batch 8. Its state returns the key it was given, so every step draws the
same noise: the most common JAX randomness mistake. Under the accountant's own threat model (every
update released) its privacy loss is unbounded; the noise probes name it before any training
(``noise-not-fresh``), and ``correct_problem`` is the same step with its key split (the control):

    cbdp audit-training --problem docs/examples/key_reusing_step.py:reusing_problem --runs 2000
    cbdp audit-training --problem docs/examples/key_reusing_step.py:correct_problem --runs 2000
"""

import jax
import jax.numpy as jnp
import optax

from cbdp_jax import training_audit as ta


def dp_step(learning_rate=0.5, clip=1.0, noise=1.0, batch=8.0, *, reuse=True):
    """Clip, sum, add noise, divide by the expected batch; ``reuse`` keeps the key unchanged."""

    def init(params):
        del params
        return (jax.random.key(0),)

    def update(grads, state, params=None):
        del params
        norms = jax.vmap(optax.tree.norm)(grads)
        scale = jnp.minimum(1.0, clip / jnp.where(norms > 0, norms, 1.0))
        summed = jax.tree.map(lambda g: jnp.tensordot(scale, g, 1), grads)
        leaves, treedef = jax.tree.flatten(summed)
        key, *keys = jax.random.split(state[0], len(leaves) + 1)
        out = [
            -learning_rate * (s + noise * clip * jax.random.normal(k, s.shape)) / batch
            for s, k in zip(leaves, keys, strict=True)
        ]
        return jax.tree.unflatten(treedef, out), (state[0] if reuse else key,)

    return optax.GradientTransformation(init, update)


def _problem(reuse: bool):
    x, y = ta.load_data("digits", n=63)
    return ta.TrainingProblem(
        model=ta.make_model("logreg", x.shape[1], 10), data=(x, y), step=dp_step(reuse=reuse),
        sampler=ta.BatchSampler(kind="poisson", rate=0.125), steps=16, noise_multiplier=1.0,
        l2_norm_clip=1.0, name="my logreg, key reused" if reuse else "my logreg",
    )  # fmt: skip


def reusing_problem():
    """The user's logistic regression on 63 digits with the key-reusing step."""
    return _problem(True)


def correct_problem():
    """The same with the key split at every step (the control)."""
    return _problem(False)
