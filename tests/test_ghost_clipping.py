"""Ghost clipping (cbdp_jax._src.training_auditor.ghost_clipping) against per-example gradients, alone and in the engine;
the CNN (cbdp_jax._src.training_auditor.models)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from cbdp_jax import InvalidParameterError
from cbdp_jax import training_audit as ta
from cbdp_jax._src.training_auditor import ghost_clipping as gc
from cbdp_jax._src.training_auditor import runs as tr
from cbdp_jax._src.training_auditor.models import CNN, conv_same

# the probes of the step's noise are tested in tests/test_noise_probes.py; here they are skipped
pytestmark = pytest.mark.usefixtures("no_noise_probes")

CE = optax.losses.softmax_cross_entropy_with_integer_labels


@pytest.fixture(autouse=True)
def _float32_products():
    # The comparisons below are of two float32 orders of summation (about 1e-6 relative). On a GPU
    # matrix products default to TF32 (a 10-bit mantissa, ~1e-4 relative; measured on an H200: 45%
    # of the logistic regression's entries off by up to 1.2e-5 against atol 6.9e-7), which would
    # test the hardware's rounding instead. Full float32 products on every backend (a no-op on CPU).
    with jax.default_matmul_precision("highest"):
        yield


def _reference(graphdef, params, x, y, w, clip):
    def loss(p, xi, yi):
        return CE(nnx.merge(graphdef, p)(xi[None])[0], yi)

    g = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(params, x, y)
    norms = jax.vmap(optax.tree.norm)(g)
    f = jnp.minimum(1.0, clip / norms) * w
    return jax.tree.map(lambda a: jnp.tensordot(f, a, 1), g), norms


@pytest.mark.parametrize("kind", ["logreg", "mlp", "cnn"])
def test_clipped_sum_equals_the_per_example_gradients_clipped_sum(kind):
    # float32 sums of 96 terms: the two orders of summation agree to about 1e-6 relative (measured
    # 4e-7); 1e-5 leaves room and still catches any wrong term (a missing bias is ~1e-1).
    x, y = ta.load_data("digits", n=96)
    x, y = jnp.asarray(x), jnp.asarray(y)
    graphdef, params = nnx.split(ta.make_model(kind, 64, 10, seed=3), nnx.Param)
    plan = gc.ghost_plan(graphdef, params, x.shape)
    assert plan is not None
    w = (jnp.arange(96) % 3 != 0).astype(jnp.float32)
    got, norms = jax.jit(lambda p: gc.clipped_sum(plan, graphdef, p, x, y, w, 0.05, CE))(params)
    want, want_norms = _reference(graphdef, params, x, y, w, 0.05)
    np.testing.assert_allclose(norms, want_norms, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(b))))
    # negative control: without clipping the sum is another one, far outside the tolerance
    plain, _ = gc.clipped_sum(plan, graphdef, params, x, y, w, None, CE)
    assert max(float(jnp.max(jnp.abs(a - b))) for a, b in
               zip(jax.tree.leaves(plain), jax.tree.leaves(want), strict=True)) > 1e-2  # fmt: skip


class _Normed(nnx.Module):
    def __init__(self):
        self.norm = nnx.LayerNorm(8, rngs=nnx.Rngs(0))
        self.out = nnx.Linear(8, 2, rngs=nnx.Rngs(0))

    def tapped_call(self, x, tap=lambda layer, a, o: o):
        return tap(self.out, x, self.out(self.norm(x)))

    def __call__(self, x):
        return self.tapped_call(x)


class _Twice(nnx.Module):
    def __init__(self):
        self.layer = nnx.Linear(8, 8, rngs=nnx.Rngs(0))

    def tapped_call(self, x, tap=lambda layer, a, o: o):
        h = tap(self.layer, x, self.layer(x))
        return tap(self.layer, h, self.layer(h))

    def __call__(self, x):
        return self.tapped_call(x)


@pytest.mark.parametrize("model", [_Normed, _Twice])
def test_ghost_plan_refuses_models_it_cannot_clip(model):
    # parameters outside the tapped layers (LayerNorm's), or a layer tapped twice (its per-example
    # gradient is a sum of two outer products): no plan, so the engine keeps per-example gradients
    graphdef, params = nnx.split(model(), nnx.Param)
    assert gc.ghost_plan(graphdef, params, (2, 8)) is None
    # and the library's models do have one (the positive control)
    g2, p2 = nnx.split(ta.make_model("mlp", 8, 2), nnx.Param)
    assert gc.ghost_plan(g2, p2, (2, 8)) is not None


SMALL = dict(data="synthetic", n=31, sampler="poisson", rate=0.25, steps=4, noise=1.0, chunk=64)


def _scores(monkeypatch, ghost: bool, **kw):
    if not ghost:
        monkeypatch.setattr(tr, "ghost_update", lambda *a: None)
    problem = ta.build_problem(**(SMALL | kw))  # a fresh problem: its own compiled programs
    prep = ta.prepare(problem)
    out = [tr.training_runs(jax.random.key(4), problem, 32, canary=c, prep=prep) for c in (1, 0)]
    monkeypatch.undo()
    return np.concatenate([o.score for o in out]), np.concatenate([o.z for o in out])


@pytest.mark.parametrize(
    "kw",
    [
        dict(threat="black-box", relation="zero-out", model="mlp"),
        dict(threat="white-box", relation="replace-one"),
        dict(threat="gradient", relation="replace-one"),
        dict(threat="black-box", bug="no-clip", sampler="fixed", batch_size=8, rate=None),
        dict(threat="black-box", bug="mean-over-batch", relation="add-remove"),
    ],
    ids=lambda kw: "-".join(str(v) for v in kw.values()),
)
def test_the_engine_gives_the_same_runs_with_and_without_ghost_clipping(monkeypatch, kw):
    # Same keys, same step: only the order of float32 summation differs (about 1e-6 relative on the
    # scores, whose magnitude is ~10); 1e-4 absolute leaves room and is far below a wrong clip.
    fast, fz = _scores(monkeypatch, True, **kw)
    slow, sz = _scores(monkeypatch, False, **kw)
    np.testing.assert_allclose(fast, slow, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(fz, sz, rtol=1e-5, atol=1e-4)
    # negative control: another clipping norm (noise, for the gradient canary's normalised score)
    # moves the scores by far more than the tolerance
    other, _ = _scores(monkeypatch, True, **(kw | ({"noise": 1.5} if "gradient" in kw.values()
                                                    else {"clip": 0.5})))  # fmt: skip
    assert np.max(np.abs(other - slow)) > 1e-2


def test_the_engine_takes_the_ghost_path_for_the_library_step_and_models():
    problem = ta.build_problem(**(SMALL | {"threat": "black-box"}))
    prep = ta.prepare(problem)
    assert gc.ghost_update(prep, problem.step_for(problem.examples), True) is not None
    optax_step = ta.build_problem(**(SMALL | {"threat": "black-box", "step": "optax"}))
    assert gc.ghost_update(prep, optax_step.step_for(problem.examples), True) is None
    assert gc.ghost_update(prep, problem.step_for(problem.examples), False) is None  # own loss


def test_cnn_convolutions_equal_nnx_conv():
    cnn = CNN(64, 10, rngs=nnx.Rngs(0))
    h = jax.random.normal(jax.random.key(0), (5, 8, 8, 1))
    np.testing.assert_allclose(conv_same(cnn.conv1, h), cnn.conv1(h), rtol=1e-5, atol=1e-6)
    h2 = jax.random.normal(jax.random.key(1), (5, 4, 4, 4))
    np.testing.assert_allclose(conv_same(cnn.conv2, h2), cnn.conv2(h2), rtol=1e-5, atol=1e-6)
    assert cnn(jnp.zeros((3, 64))).shape == (3, 10)
    with pytest.raises(InvalidParameterError, match="features=60"):
        CNN(60, 10, rngs=nnx.Rngs(0))
