"""No clean bill for a broken run: every broken input is refused in one line naming the problem and
the share affected, and an audit with NaN or inf runs never ends in "no violation"; a user's own
loss, step and problem file (docs/theory/training_audit.md, section 1)."""

from __future__ import annotations

import dataclasses
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from cbdp_jax import InvalidParameterError
from cbdp_jax import audit as au
from cbdp_jax import training_audit as ta

# the probes of the step's noise are tested in tests/test_noise_probes.py; here they are skipped
pytestmark = pytest.mark.usefixtures("no_noise_probes")

SYN = dict(data="synthetic", n=31, rate=0.125, steps=8, noise=1.0)


@pytest.fixture(scope="module")
def base():
    return ta.build_problem(**SYN)


def _with_data(problem, x=None, y=None):
    x0, y0 = (np.array(a) for a in problem.data)
    return dataclasses.replace(problem, data=(x0 if x is None else x, y0 if y is None else y))


# --- broken inputs, refused before training ------------------------------------------------------


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_features_are_refused_with_their_share(base, value):
    x = np.array(base.data[0])
    x[[2, 5, 7], 3] = value
    with pytest.raises(
        InvalidParameterError, match=r"data X is invalid: 3 of 31 \(9.68%\) examples"
    ):
        _with_data(base, x=x)


def test_non_finite_labels_are_refused(base):
    y = np.array(base.data[1], np.float64)
    y[0] = np.nan
    with pytest.raises(InvalidParameterError, match=r"data y is invalid: 1 of 31 \(3.23%\).*NaN"):
        _with_data(base, y=y)


def test_labels_outside_the_models_classes_are_refused_before_training(base):
    y = np.array(base.data[1])
    y[:4] = 2  # the synthetic model has 2 classes
    problem = _with_data(base, y=y)
    with pytest.raises(
        InvalidParameterError, match=r"4 of 31 \(12.9%\) labels lie outside the model's 2"
    ):
        ta.prepare(problem)
    y[:4] = -1
    with pytest.raises(InvalidParameterError, match=r"outside the model's 2 classes \[0, 1\]"):
        ta.prepare(_with_data(base, y=y))


def test_non_integer_labels_are_refused_with_the_default_loss(base):
    y = np.array(base.data[1], np.float32) + 0.25
    with pytest.raises(InvalidParameterError, match=r"31 of 31 \(100%\) labels are not integers"):
        _with_data(base, y=y)
    # whole-valued floats are class indices: accepted
    assert _with_data(base, y=np.array(base.data[1], np.float32)).examples == 32


def test_an_input_canary_with_nan_features_is_refused():
    problem = ta.build_problem(**(SYN | {"threat": "white-box"}))
    x = np.full(problem.data[0].shape[1], np.nan)
    with pytest.raises(InvalidParameterError, match="canary x is invalid: it holds NaN"):
        dataclasses.replace(problem, canary=ta.Canary(kind="input", x=x, y=0))


@pytest.mark.parametrize("optimizer", [optax.sgd(0.1), optax.adam(0.01)])
def test_a_plain_optax_optimizer_gets_one_line_on_how_to_wrap_it(base, optimizer):
    with pytest.raises(InvalidParameterError) as info:
        ta.prepare(dataclasses.replace(base, step=optimizer))
    message = str(info.value)
    assert "step is invalid" in message and "differentially_private_aggregate" in message
    assert len(message.splitlines()) == 1
    assert not isinstance(info.value, TypeError)


# --- broken runs, refused after training ---------------------------------------------------------


def _nan_step(threshold: float):
    """DP-SGD whose update turns NaN when the noise on coordinate 0 exceeds ``threshold`` std."""
    inner = ta.dp_sgd(
        learning_rate=0.5, l2_norm_clip=1.0, noise_multiplier=1.0, expected_batch_size=4.0
    )

    def update(grads, state, params=None, **extra):
        key = state.rng_key
        updates, state = inner.update(grads, state, params, **extra)
        bad = jax.random.normal(jax.random.fold_in(key, 7)) > threshold
        return jax.tree.map(lambda u: jnp.where(bad, jnp.nan, u), updates), state

    return optax.GradientTransformationExtraArgs(inner.init, update)


@pytest.mark.slow
@pytest.mark.ci  # 20-42 s: end to end (docs/guide/testing.md)
def test_runs_with_nan_parameters_refuse_the_audit_naming_their_share(base):
    # P(N > 2) = 2.3% per step, so about 1 - 0.977^8 = 17% of the runs end with NaN parameters
    problem = dataclasses.replace(base, step=_nan_step(2.0))
    config = ta.training_audit_config(3.0, samples=1000)
    with pytest.raises(ta.AuditRefusedError, match=r"of 1000 runs \(1\d.\d+%\) on D.*NaN or inf"):
        ta.audit_training(jax.random.key(0), problem, config=config)
    out = ta.training_runs(jax.random.key(1), problem, 1000)
    assert 0.1 < 1 - out.finite.mean() < 0.25
    # negative control: the same step without the NaN audits normally
    fine = dataclasses.replace(base, step=_nan_step(1e9))
    assert not ta.audit_training(jax.random.key(0), fine, config=config).violation


class _NanMechanism(au.AuditMechanism):
    """Gaussian outputs, ``share`` of them NaN on D'."""

    def __init__(self, share):
        super().__init__(lambda *a: None, f"nan-{share}")
        object.__setattr__(self, "share", share)

    def sample(self, key, dataset, n):
        x = np.asarray(jax.random.normal(key, (n, 1)), np.float64) + float(np.ravel(dataset)[0])
        if float(np.ravel(dataset)[0]) == 0.0:
            x[: max(1, int(self.share * n))] = np.nan
        return x


@pytest.mark.parametrize("share", [0.0001, 0.5, 1.0])
def test_an_audit_with_nan_samples_never_ends_in_no_violation(share):
    # cbdp audit's own path: a mechanism (any AuditMechanism, e.g. one that overrides sample) whose
    # outputs hold NaN is refused, whatever the share; a clean claim that would hold (eps 10) proves
    # the refusal is not a violation either.
    config = au.AuditConfig(
        samples=2000, classes=("halfspace",), eps_grid=(1.0,), screen_samples=100
    )
    with pytest.raises(au.AuditRefusedError, match=r"on D' are NaN or inf"):
        au.audit(jax.random.key(0), _NanMechanism(share), "approx:10:1e-5", pair=([1.0], [0.0]),
                 config=config)  # fmt: skip
    with pytest.raises(InvalidParameterError, match="NaN or inf"):
        au.audit(jax.random.key(0), lambda rng, d, n: np.full(n, np.nan), "approx:10:1e-5",
                 pair=([1.0], [0.0]), config=config)  # fmt: skip


def test_the_same_audit_without_nan_ends_in_no_violation():
    # the negative control of the test above: the clean mechanism passes the eps = 10 claim
    config = au.AuditConfig(
        samples=2000, classes=("halfspace",), eps_grid=(1.0,), screen_samples=100
    )
    ok = au.audit(
        jax.random.key(0), lambda rng, d, n: rng.normal(float(np.ravel(d)[0]), 1.0, n),
        "approx:10:1e-5", pair=([1.0], [0.0]), config=config,
    )  # fmt: skip
    assert not ok.violation and "no violation certified" in ok.verdict


# --- your own training: a loss, and a problem built in a file ------------------------------------


def mse(model, x, y):
    return jnp.mean((model(x)[..., 0] - y) ** 2)


def _regression():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(63, 4)).astype(np.float32)
    x[:, 0] = 0.0  # a feature no example uses: the canary's coordinate
    y = (x @ np.array([0.0, 1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=63)).astype(np.float32)
    step = ta.dp_sgd(
        learning_rate=0.2, l2_norm_clip=1.0, noise_multiplier=1.0, expected_batch_size=8.0
    )
    return ta.TrainingProblem(
        model=nnx.Linear(4, 1, rngs=nnx.Rngs(0)), data=(x, y), step=step,
        sampler=ta.BatchSampler(kind="poisson", rate=0.125), steps=8, noise_multiplier=1.0,
        l2_norm_clip=1.0, loss_fn=mse, name="regression",
    )  # fmt: skip


def test_a_regression_with_its_own_loss_is_audited():
    problem = _regression()
    prep = ta.prepare(problem)
    # the weight of the unused feature: flat index 1, after the bias
    assert prep.law_exact and prep.coordinate == 1
    res = ta.audit_training(
        jax.random.key(0), problem, config=ta.training_audit_config(3.175, samples=2000)
    )
    assert not res.violation and res.relation == "add-remove", res.verdict
    # the default loss refuses the same float targets
    with pytest.raises(InvalidParameterError, match="labels are not integers"):
        dataclasses.replace(problem, loss_fn=None)


def test_a_problem_built_in_a_users_file_is_loaded(tmp_path):
    path = tmp_path / "my_train.py"
    path.write_text(
        textwrap.dedent(
            """
            import numpy as np
            import jax.numpy as jnp
            from flax import nnx
            from cbdp_jax import training_audit as ta

            def huber(model, x, y):
                r = model(x)[..., 0] - y
                return jnp.mean(jnp.where(jnp.abs(r) < 1, 0.5 * r**2, jnp.abs(r) - 0.5))

            def make_problem():
                x = np.random.default_rng(1).normal(size=(31, 3)).astype(np.float32)
                y = x.sum(1).astype(np.float32)
                step = ta.dp_sgd(learning_rate=0.1, l2_norm_clip=1.0, noise_multiplier=1.0,
                                 expected_batch_size=4.0)
                return ta.TrainingProblem(
                    model=nnx.Linear(3, 1, rngs=nnx.Rngs(0)), data=(x, y), step=step,
                    sampler=ta.BatchSampler(kind="poisson", rate=0.125), steps=4,
                    noise_multiplier=1.0, loss_fn=huber, name="huber regression")

            def not_a_problem():
                return 3

            def broken():
                raise RuntimeError("no data here")
            """
        )
    )
    problem = ta.load_problem(f"{path}:make_problem")
    assert problem.name == "huber regression" and problem.loss_fn.__name__ == "huber"
    assert ta.training_runs(jax.random.key(0), problem, 8).finite.all()
    for spec, match in (
        (f"{path}:not_a_problem", "returned int, must return a cbdp_jax.training_audit"),
        (f"{path}:broken", "raised RuntimeError: no data here"),
        (f"{path}:missing", "has no callable named 'missing'"),
        (f"{tmp_path / 'nope.py'}:make_problem", "not found"),
        ("no_colon", "must be FILE.py:FUNCTION"),
    ):
        with pytest.raises(InvalidParameterError, match=match):
            ta.load_problem(spec)
