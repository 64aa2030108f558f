"""The pure core: usable inside a user's jit / scan, custom classes and optimisers, no retracing."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from cbdp_jax import InvalidParameterError
from cbdp_jax._src.estimator import adversary_fitting, adversary_fitting_ensemble, evaluation
from cbdp_jax.adversaries import AdversarySpec, ClassProperties, CustomAdversary
from cbdp_jax.core import fit, trainer
from cbdp_jax.divergences import Divergence
from cbdp_jax.estimator import EstimatorConfig, estimate, estimate_from_samples
from cbdp_jax.mechanisms import LaplaceMechanism

LIN_KL_LAPLACE_1 = 0.225987  # exact (lin, KL), Laplace eps = 1 (docs/theory/mechanisms.md)


class Affine(nnx.Module):
    """h(x) = w x + b: the linear class, written by a user."""

    def __init__(self, rngs: nnx.Rngs):
        self.w = nnx.Param(0.1 * jax.random.normal(rngs.params(), ()))
        self.b = nnx.Param(jnp.zeros(()))

    def __call__(self, x):
        return self.w[...] * x[:, 0] + self.b[...]


class Saturating(nnx.Module):
    """tanh(w x + b): bounded by 1, not a cone."""

    def __init__(self, rngs: nnx.Rngs):
        self.lin = nnx.Linear(1, 1, rngs=rngs)

    def __call__(self, x):
        return jnp.tanh(self.lin(x))[:, 0]


AFFINE = ClassProperties(cone=True, translation_invariant=True, contains_constants=True)


def _laplace(key, n, shift=0.0):
    return (jax.random.laplace(key, (n, 1)) + shift).astype(jnp.float32)


def test_trainer_runs_inside_a_users_jit_and_scan_and_reaches_the_exact_value():
    t = trainer(AdversarySpec(name="linear"), Divergence.kl(), dim=1, optimizer=optax.adam(0.05))

    @jax.jit
    def train(key):
        k_init, k_data = jax.random.split(key)
        ref = _laplace(k_data, 1024)
        state = t.init(k_init, ref)

        def body(state, k):
            kp, kq = jax.random.split(k)
            return t.step(k, state, (_laplace(kp, 2048), _laplace(kq, 2048, 1.0)))

        state, infos = jax.lax.scan(body, state, jax.random.split(k_data, 600))
        return state, infos.value

    state, values = train(jax.random.key(0))
    assert values.shape == (600,) and bool(jnp.all(jnp.isfinite(values)))
    # The fixed critic on 400k fresh samples per side: its KL f-form is within 4 SE (+ a 0.005
    # optimisation allowance) of the exact linear value; SE from the sample variances.
    kp, kq, kf = jax.random.split(jax.random.key(1), 3)
    fit_batch = (_laplace(kf, 50_000), _laplace(jax.random.fold_in(kf, 1), 50_000, 1.0))
    scale, shift = fit(t, Divergence.kl(), state.params, state.rest, fit_batch, fit_batch, 1.645)
    xp, xq = _laplace(kp, 400_000), _laplace(kq, 400_000, 1.0)
    hp = np.asarray(scale * t.apply(state.params, state.rest, xp) + shift, np.float64)
    tq = np.exp(np.asarray(scale * t.apply(state.params, state.rest, xq) + shift, np.float64) - 1)
    value = hp.mean() - tq.mean()
    se = math.sqrt(hp.var() / hp.size + tq.var() / tq.size)
    assert abs(value - LIN_KL_LAPLACE_1) < 4 * se + 0.005


@pytest.mark.slow
@pytest.mark.ci
def test_a_custom_module_with_a_users_optax_optimizer_through_the_estimator():
    custom = CustomAdversary(Affine, AFFINE, name="affine")
    cfg = EstimatorConfig(steps=600, eval_every=100, ensemble=2, batch_size=2048,
                          optimizer=optax.adamw(0.05, weight_decay=1e-4))  # fmt: skip
    res = estimate(
        jax.random.key(2), LaplaceMechanism(epsilon=1.0), samples=60_000, adversary=custom,
        config=cfg,
    )  # fmt: skip
    assert res.adversary == "affine" and res.objective == "dv"
    # A user's linear class reaches the exact (lin, KL) value: 4 SE noise band + 0.005 allowance.
    assert abs(res.estimate - LIN_KL_LAPLACE_1) < 4 * res.std_error + 0.005
    assert res.config["optimizer"].startswith("custom")


def test_wrong_declarations_the_outputs_contradict_are_errors():
    with pytest.raises(InvalidParameterError, match=r"properties.cone=True is invalid"):
        trainer(CustomAdversary(Saturating, ClassProperties(cone=True)), Divergence.kl(), dim=1)
    with pytest.raises(InvalidParameterError, match=r"properties.bound=0.5 is invalid"):
        trainer(CustomAdversary(Saturating, ClassProperties(bound=0.5)), Divergence.kl(), dim=1)
    # Negative control: the true declarations are accepted.
    t = trainer(CustomAdversary(Saturating, ClassProperties(bound=1.0)), Divergence.kl(), dim=1)
    assert t.objective == "fform" and t.properties.bound == 1.0
    with pytest.raises(InvalidParameterError, match="properties is invalid"):
        trainer(Saturating(nnx.Rngs(0)), Divergence.kl(), dim=1)


@pytest.mark.slow
@pytest.mark.ci
def test_lbfgs_refuses_minibatches_and_runs_full_batch():
    rng = np.random.default_rng(3)
    p, q = rng.laplace(0, 1, 20_000), rng.laplace(1, 1, 20_000)
    with pytest.raises(InvalidParameterError, match="optimizer='lbfgs' is invalid"):
        t = trainer(AdversarySpec(name="linear"), Divergence.kl(), dim=1, optimizer="lbfgs")
        x = jnp.asarray(p[:, None], jnp.float32)
        state = adversary_fitting_ensemble.init_ensemble(
            jax.random.split(jax.random.key(0), 2), t, x
        )
        adversary_fitting.train_ensemble(
            jax.random.key(0), t, state, val_p=x, val_q=x, train_p=x, train_q=x, batch_size=256
        )
    res = estimate_from_samples(
        jax.random.key(4), p, q, adversary="linear",
        config=EstimatorConfig(steps=50, eval_every=10, ensemble=1, optimizer="lbfgs"),
    )  # fmt: skip
    # The concave 2-parameter problem is solved: the best validation Donsker-Varadhan value (5000
    # samples per side, SE about 0.015) is within 0.05 of the exact value.
    assert abs(max(res.curves["val_objective"]) - LIN_KL_LAPLACE_1) < 0.05


def test_a_second_fresh_sample_estimate_with_the_same_shapes_does_not_retrace(max_traces):
    cfg = EstimatorConfig(steps=100, eval_every=50, ensemble=2, batch_size=512)
    kwargs = dict(
        samples=4000, test_samples=4000, fresh_samples=True, adversary="linear", config=cfg
    )
    estimate(jax.random.key(5), LaplaceMechanism(epsilon=1.0), **kwargs)
    max_traces(adversary_fitting, "_train_body", 0)
    max_traces(evaluation, "_chunk_body", 0)
    # A new key and a new epsilon: the same compiled programs (the noise scale is not a shape).
    estimate(jax.random.key(6), LaplaceMechanism(epsilon=1.0), **kwargs)


def test_mechanisms_are_pytrees_validated_where_concrete():
    """A vmapped batch of mechanisms samples with each member's own scale; bad concrete values are
    errors naming the parameter; traced values pass through (vmap, grad)."""
    from cbdp_jax.mechanisms import GaussianMechanism

    batch = LaplaceMechanism(epsilon=jnp.array([0.5, 4.0]))
    x = jax.vmap(lambda m, k: m.sample(k, jnp.zeros(1), 20_000))(
        batch, jax.random.split(jax.random.key(0), 2)
    )
    # Laplace(b) has sd sqrt(2) b: 2.83 and 0.354; 20k draws give the sd to about 1% (4 SE < 0.05 rel).
    np.testing.assert_allclose(np.std(np.asarray(x), axis=(1, 2)), [2.828, 0.354], rtol=0.05)
    with pytest.raises(InvalidParameterError, match=r"epsilon=.* every entry"):
        LaplaceMechanism(epsilon=jnp.array([0.5, -1.0]))
    with pytest.raises(InvalidParameterError, match="sigma=0.0 is invalid"):
        GaussianMechanism(sigma=0.0)
    # d/dsigma of log N(1; 0, sigma^2) = -1/sigma + 1/sigma^3: -1/2 + 1/8 at sigma = 2.
    grad = jax.grad(
        lambda s: GaussianMechanism(sigma=s).log_density(jnp.zeros(1), jnp.ones((1, 1)))[0]
    )
    assert float(grad(2.0)) == pytest.approx(-0.5 + 0.125, rel=1e-6)
