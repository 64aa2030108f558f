"""A user's DP-SGD step in optax, correct or with one of three structural noise bugs.

The step clips each example's gradient to norm C, sums, adds N(0, (S C)^2) per coordinate and divides
by the expected batch size. ``bug`` plants what the accountant assumes away
(docs/theory/training_audit.md, sections 10 and 11):

- ``'key-reuse'``: the state returns the key it was given, so every step draws the same noise;
- ``'scalar'``: one normal per step, broadcast over every coordinate;
- ``'even-steps'``: noise at even steps only.

``problem(bug)`` is the setting of benchmarks/release_critics.py and tests/test_training_release.py:
logistic regression on 63 synthetic examples plus the gradient canary, Poisson q = 1/8, T = 16,
S = 1, C = 1, the step dividing by the expected batch 8. From the command line:

    cbdp audit-training --problem docs/examples/user_noise_bugs.py:key_reuse --runs 20000
"""

import jax
import jax.numpy as jnp
import optax

from cbdp_jax import training_audit as ta


def user_step(bug="none", *, lr=0.5, clip=1.0, noise=1.0, expected=8.0):
    """Clip to ``clip``, sum, add N(0, (noise clip)^2) per coordinate, divide by ``expected``."""

    def init(params):
        del params
        return (jax.random.key(0), jnp.zeros((), jnp.int32))

    def update(grads, state, params=None, **extra):
        del params, extra
        key, t = state
        norms = jax.vmap(optax.tree.norm)(grads)
        scale = jnp.minimum(1.0, clip / jnp.maximum(norms, 1e-12))
        summed = jax.tree.map(lambda g: jnp.tensordot(scale, g, 1), grads)
        leaves, treedef = jax.tree.flatten(summed)
        new_key, sub = jax.random.split(key)
        keys = jax.random.split(sub, len(leaves))
        if bug == "scalar":
            xi = jax.random.normal(keys[0], ())
            noises = [jnp.full(s.shape, xi) for s in leaves]
        else:
            noises = [jax.random.normal(k, s.shape) for s, k in zip(leaves, keys, strict=True)]
        if bug == "even-steps":
            noises = [(t % 2 == 0).astype(jnp.float32) * e for e in noises]
        noisy = [s + noise * clip * e for s, e in zip(leaves, noises, strict=True)]
        updates = jax.tree.unflatten(treedef, [-lr * v / expected for v in noisy])
        return updates, (key if bug == "key-reuse" else new_key, t + 1)

    return optax.GradientTransformationExtraArgs(init, update)


def problem(step=None, *, name="user step", noise=1.0, steps=16, chunk=None):
    """The logistic regression of the module docstring with ``step`` (default: the correct one)."""
    x, y = ta.load_data("synthetic", n=63, seed=0)
    extra = {} if chunk is None else {"chunk": chunk}
    return ta.TrainingProblem(
        model=ta.make_model("logreg", x.shape[1], 2, seed=0), data=(x, y),
        step=user_step(noise=noise) if step is None else step,
        sampler=ta.BatchSampler(kind="poisson", rate=0.125), steps=steps,
        canary=ta.Canary(kind="gradient", norm=4.0), noise_multiplier=max(noise, 1.0),
        l2_norm_clip=1.0, name=name, **extra,
    )  # fmt: skip


def correct():
    """The correct step (the control)."""
    return problem(user_step(), name="user step")


def key_reuse():
    """The step that returns its key unchanged."""
    return problem(user_step("key-reuse"), name="user step [key-reuse]")


def scalar_noise():
    """The step that adds one normal per step to every coordinate."""
    return problem(user_step("scalar"), name="user step [scalar noise]")


def even_steps():
    """The step that adds noise at even steps only."""
    return problem(user_step("even-steps"), name="user step [noise at even steps]")
