"""The default training budget (derived from the sample size), the segmented training loop that runs it,
and the checks made before any sample is drawn (memory, values a float32 cannot hold)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbdp_jax import InvalidParameterError
from cbdp_jax._src.estimator import adversary_fitting, adversary_fitting_ensemble
from cbdp_jax._src.estimator.core import trainer
from cbdp_jax._src.infra import sizes
from cbdp_jax.adversaries import AdversarySpec
from cbdp_jax.divergences import Divergence
from cbdp_jax.estimator import (
    Budget,
    EstimatorConfig,
    default_budget,
    estimate,
    estimate_from_samples,
    resolve_budget,
)
from cbdp_jax.mechanisms import LaplaceMechanism


def test_default_budget_follows_the_documented_rule():
    # Up to about 10^5 per side: the floor of 400 steps at the smallest minibatch, 10 checks.
    assert default_budget(5_000) == Budget(400, 1, 512, 40, 5)
    assert default_budget(50_000) == Budget(400, 1, 512, 40, 5)
    # 500k per side: a minibatch of 1/64 (7812, capped at 4096) and 4 passes, 489 steps.
    assert default_budget(500_000) == Budget(489, 1, 4096, 48, 5)
    # The ceiling.
    assert default_budget(10_000_000) == Budget(2000, 1, 4096, 200, 5)
    # The smallest samples: the smallest minibatch.
    assert default_budget(2).batch_size == 512


def test_default_budget_is_monotone_in_the_sample_size():
    sizes = np.unique(np.geomspace(2, 1e8, 200).astype(int))
    budgets = [default_budget(int(n)) for n in sizes]
    work = [b.steps * b.batch_size for b in budgets]
    assert all(b >= a for a, b in zip(work, work[1:], strict=False))
    assert all(b.eval_every * 10 <= b.steps for b in budgets)


def test_resolve_budget_keeps_what_the_user_gave():
    cfg = EstimatorConfig()
    assert (cfg.steps, cfg.ensemble, cfg.batch_size, cfg.eval_every, cfg.patience) == ("auto",) * 5
    got = resolve_budget(EstimatorConfig(steps=1000, batch_size=None), 5_000)
    # Given: steps and full batch; derived: one adversary, 10 checks of the given steps, and no
    # early stop (the steps given are trained in full, as before the rule).
    assert (got.steps, got.batch_size, got.ensemble, got.eval_every, got.patience) == (
        1000, None, 1, 100, None,
    )  # fmt: skip
    # With the steps derived too, the rule's patience applies (negative control of the line above).
    assert resolve_budget(EstimatorConfig(batch_size=None), 5_000).patience == 5
    # Given steps: a check every tenth of them, at most every 100 steps.
    assert resolve_budget(EstimatorConfig(steps=200_000), 5_000).eval_every == 100
    assert resolve_budget(EstimatorConfig(steps=50), 5_000).eval_every == 5
    fixed = EstimatorConfig(steps=2000, ensemble=4, batch_size=4096, eval_every=100, patience=None)
    assert resolve_budget(fixed, 5_000) is fixed
    with pytest.raises(InvalidParameterError, match=r"steps='many' is invalid: must be 'auto'"):
        EstimatorConfig(steps="many")
    with pytest.raises(InvalidParameterError, match="ensemble=0 is invalid"):
        EstimatorConfig(ensemble=0)


def test_a_result_records_the_budget_that_ran():
    rng = np.random.default_rng(0)
    p, q = rng.laplace(0, 1, 3_000), rng.laplace(1, 1, 3_000)
    res = estimate_from_samples(jax.random.key(0), p, q, adversary="linear")
    # 1500 training samples per side: default_budget(1500).
    want = default_budget(1_500)
    assert res.config["steps"] == want.steps and res.config["batch_size"] == want.batch_size
    assert res.config["ensemble"] == 1 and res.config["patience"] == want.patience
    assert res.config["budget"] == {
        "derived": ["steps", "ensemble", "batch_size", "eval_every", "patience"],
        "n_train": 1500,
        "rule": "default_budget",
    }
    # The curves end where training did: at most the budget's checks.
    assert 1 <= len(res.curves["val_objective"]) <= want.steps // want.eval_every


def _small_training(seconds: float, progress=None, cancelled=None, patience=None):
    t = trainer(AdversarySpec(name="mlp", width=8, depth=1), Divergence.kl(), dim=1)
    rng = np.random.default_rng(1)
    xp = jnp.asarray(rng.laplace(0, 1, (3000, 1)), jnp.float32)
    xq = jnp.asarray(rng.laplace(1, 1, (3000, 1)), jnp.float32)
    state = adversary_fitting_ensemble.init_ensemble(jax.random.split(jax.random.key(0), 2), t, xp)
    return adversary_fitting.train_ensemble(
        jax.random.key(1), t, state, val_p=xp[:500], val_q=xq[:500], train_p=xp, train_q=xq,
        steps=60, eval_every=7, batch_size=128, progress=progress, patience=patience,
        segment_seconds=seconds, cancelled=cancelled,
    )  # fmt: skip


def test_how_training_is_cut_into_segments_changes_no_number():
    seen = []
    # One step per segment against the whole run in one: the same minibatches, the same states.
    tiny = _small_training(1e-9, progress=seen.append)
    whole = _small_training(1e9)
    np.testing.assert_array_equal(np.asarray(tiny.best_value), np.asarray(whole.best_value))
    np.testing.assert_array_equal(tiny.trace.val_value, whole.trace.val_value)
    for a, b in zip(
        jax.tree.leaves(tiny.best_params), jax.tree.leaves(whole.best_params), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # 60 steps at 7 per check: 8 blocks of 7 (56 steps). Two first segments of min(7, 8) steps (the
    # first compiles), then one step per segment at this time target; a progress call after each.
    steps = [s.step for s in seen]
    assert steps == [7, 14, *range(15, 57)]
    assert all(s.block == s.step // 7 and (s.blocks, s.steps) == (8, 56) for s in seen)
    assert tiny.trace.val_value.shape == (8, 2) and np.isfinite(tiny.trace.val_value).all()


def test_patience_stops_between_blocks_and_leaves_the_rest_unrun():
    out = _small_training(1e-9, patience=1)
    ran = int(np.sum(~np.isnan(out.trace.val_value[:, 0])))
    # Negative control above: without patience all 8 blocks run; with patience 1 a run stops after
    # the first check without a new best for both members, so some block must be left unrun unless
    # every check improved on both members (then the curves are strictly increasing).
    curve = out.trace.val_value[:ran]
    improving = np.all(np.diff(curve, axis=0) > 0)
    assert ran < 8 or improving


def test_a_cancelled_run_stops_after_its_first_segment():
    calls = []

    def cancelled():
        calls.append(1)
        return True

    with pytest.raises(KeyboardInterrupt):
        _small_training(1e-9, cancelled=cancelled)
    assert len(calls) == 1


def test_sample_counts_that_would_not_fit_are_refused_before_drawing(monkeypatch):
    with pytest.raises(InvalidParameterError, match=r"samples=10000000000 is invalid: .* GiB"):
        estimate(jax.random.key(0), LaplaceMechanism(epsilon=1.0), samples=10**10)
    monkeypatch.setattr(sizes, "available_bytes", lambda **_: 2**20)  # 1 MiB free
    with pytest.raises(InvalidParameterError, match=r"samples=100000 is invalid: .*1 MiB"):
        estimate(jax.random.key(0), LaplaceMechanism(epsilon=1.0), samples=100_000)
    rng = np.random.default_rng(0)
    with pytest.raises(
        InvalidParameterError, match=r"p_samples=.* is invalid: the samples' copies need"
    ):
        estimate_from_samples(jax.random.key(0), rng.normal(size=100_000), rng.normal(size=100_000))


def test_values_beyond_float32_are_refused_without_a_warning():
    p = np.full(1000, 1e300)
    q = np.zeros(1000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InvalidParameterError, match=r"p_samples=.* is invalid: .*1e\+300"):
            estimate_from_samples(jax.random.key(0), p, q)
    # Negative control: the largest float32 itself passes the check (and fails nothing else here).
    sizes.check_representable("p_samples", "<array>", np.full(3, 3.0e38), "float32")


@pytest.mark.slow
@pytest.mark.ci
def test_an_interrupt_stops_a_long_estimate_within_two_seconds(tmp_path):
    """SIGINT to a process training 200,000 steps: the estimate raises KeyboardInterrupt within 2 s.

    Timed to the line the child prints when the interrupt reaches it; the interpreter's own teardown
    after that (JAX's backends, several seconds under load) is the command line's to cut short.
    """
    script = textwrap.dedent(
        """
        import signal, time
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
        import jax, numpy as np
        from cbdp_jax.estimator import EstimatorConfig, estimate_from_samples
        rng = np.random.default_rng(0)
        p, q = rng.laplace(0, 1, 200_000), rng.laplace(1, 1, 200_000)
        def progress(info):
            if info.step > 8:  # the first two segments (one compiled) are behind
                print("training", flush=True)
        cfg = EstimatorConfig(steps=200_000, ensemble=4, batch_size=4096, progress=progress)
        try:
            estimate_from_samples(jax.random.key(0), p, q, config=cfg)
        except KeyboardInterrupt:
            print("interrupted", time.time(), flush=True)
        """
    )
    env = {**os.environ, "CBDP_JAX_CACHE_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "training"
        time.sleep(1.0)
        sent = time.time()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    stopped = [
        float(line.split()[1]) for line in out.splitlines() if line.startswith("interrupted")
    ]
    assert stopped, out[-500:]
    assert stopped[0] - sent < 2.0, stopped[0] - sent
