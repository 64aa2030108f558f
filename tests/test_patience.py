"""Early stopping with patience: the blocks that run are the scan's blocks, and it stops when stale."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbdp_jax import InvalidParameterError
from cbdp_jax._src.estimator import adversary_fitting_ensemble
from cbdp_jax._src.estimator.core import TrainState
from cbdp_jax.estimator import EstimatorConfig, estimate_from_samples


def _toy(peaks):
    """Members whose validation value is -(t - peak)^2 after t steps: member m peaks at block
    ``peaks[m]`` (10 steps per block, one step adds 1 to its parameter)."""
    peaks = jnp.asarray(peaks, jnp.float32) * 10.0
    state = TrainState(params=jnp.zeros(peaks.shape), opt_state=(), rest=())

    def step(st, _):
        return st._replace(params=st.params + 1.0), -st.params

    def validate(st):
        return -((st.params - peaks) ** 2)

    blocks = jnp.zeros((8, 10))  # 8 blocks of 10 steps
    return step, validate, state, blocks


def _run(peaks, patience):
    step, validate, state, blocks = _toy(peaks)
    return jax.jit(
        lambda s: adversary_fitting_ensemble.early_stopping_scan(
            step, validate, s, blocks, patience=patience
        )
    )(state)


def test_blocks_that_run_equal_the_scans_and_it_stops_when_every_member_is_stale():
    full = _run([2, 3], None)
    out = _run([2, 3], 2)
    # Member 1 peaks after block 3 (index 2); two more blocks without a new best: 5 blocks run.
    ran = ~np.isnan(np.asarray(out[4])[:, 0])
    assert ran.tolist() == [True] * 5 + [False] * 3
    for got, want in zip(out[3:], full[3:], strict=True):  # curves: the run prefix is the scan's
        np.testing.assert_array_equal(np.asarray(got)[ran], np.asarray(want)[ran])
    # The best over the blocks run is the best over all blocks here (both peaks are inside).
    np.testing.assert_array_equal(np.asarray(out[1]), np.asarray(full[1]))
    np.testing.assert_array_equal(np.asarray(out[0]), np.asarray(full[0]))


def test_a_member_still_improving_keeps_the_loop_going():
    # Negative control: the second member improves until the last block, so nothing is skipped.
    out = _run([1, 8], 1)
    assert not np.any(np.isnan(np.asarray(out[4])))
    # ... and a patience as long as the run equals the scan bit for bit.
    full, long = _run([2, 3], None), _run([2, 3], 8)
    for a, b in zip(jax.tree.leaves(long), jax.tree.leaves(full), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_estimator_with_patience_trains_fewer_blocks_and_keeps_its_best():
    rng = np.random.default_rng(0)
    p, q = rng.laplace(0.0, 1.0, 20_000), rng.laplace(1.0, 1.0, 20_000)
    kw = dict(adversary="linear", divergence="kl")
    base = dict(steps=2000, eval_every=100, ensemble=2, batch_size=512, learning_rate=0.05)
    full = estimate_from_samples(
        jax.random.key(1), p, q, config=EstimatorConfig(**base, patience=None), **kw
    )
    short = estimate_from_samples(
        jax.random.key(1), p, q, config=EstimatorConfig(**base, patience=2), **kw
    )
    blocks = len(short.curves["val_objective"])
    assert blocks < len(full.curves["val_objective"]) == 20
    # The same blocks ran first (same key): the short run's curve is the full run's prefix.
    np.testing.assert_array_equal(
        short.curves["val_objective"], full.curves["val_objective"][:blocks]
    )
    assert short.curves["block_step"] == full.curves["block_step"][:blocks]


@pytest.mark.parametrize("bad", [0, -1])
def test_patience_must_be_a_positive_integer(bad):
    with pytest.raises(InvalidParameterError, match="patience"):
        EstimatorConfig(patience=bad)
