"""The Poisson sampler's law (geometric gaps from both words of each Threefry block): batch sizes
exactly Binomial(n, q), every example in at rate q, two examples together at rate q^2."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from scipy import stats

from cbdp_jax import training_audit as ta
from cbdp_jax._src.training_auditor.batch_sampling import geometric_gaps

N, Q, STEPS = 50, 0.1, 10_000
LEVEL = 1e-4  # raised level: a correct sampler fails one of these tests about once in 10^4 runs


def size_p_value(sizes: np.ndarray, n: int, q: float) -> float:
    """Chi-square p-value of the batch sizes against Binomial(n, q), tails pooled to >= 5 expected."""
    expected = stats.binom.pmf(np.arange(n + 1), n, q) * sizes.size
    observed = np.bincount(sizes, minlength=n + 1).astype(float)
    lo = int(np.argmax(np.cumsum(expected) >= 5))
    hi = n - int(np.argmax(np.cumsum(expected[::-1]) >= 5))
    e = np.concatenate([[expected[: lo + 1].sum()], expected[lo + 1 : hi], [expected[hi:].sum()]])
    o = np.concatenate([[observed[: lo + 1].sum()], observed[lo + 1 : hi], [observed[hi:].sum()]])
    return float(stats.chisquare(o, e).pvalue)


def masks_of(sampler, key=0) -> np.ndarray:
    return np.asarray(sampler.masks(jax.random.key(key), N, STEPS))


def test_poisson_batch_sizes_are_binomial_and_inclusions_independent_at_rate_q():
    masks = masks_of(ta.BatchSampler(kind="poisson", rate=Q))
    assert size_p_value(masks.sum(1), N, Q) > LEVEL
    # each example's rate: 10,000 Bernoulli(0.1), se 0.0030; 50 examples at 4.5 se (two-sided
    # normal tail 7e-6 each, 3e-4 for all 50)
    se = math.sqrt(Q * (1 - Q) / STEPS)
    assert np.all(np.abs(masks.mean(0) - Q) < 4.5 * se)
    # two examples in the same batch at rate q^2 (all 1225 pairs pooled, the
    # pairs' dependence within a step only shrinks the effective count, 5 se of the pooled mean
    # counted as if one pair: conservative)
    pairs = (masks.sum(1) * (masks.sum(1) - 1) / (N * (N - 1))).mean()
    assert abs(pairs - Q * Q) < 5 * math.sqrt(Q * Q * (1 - Q * Q) / STEPS)


@pytest.mark.parametrize(
    "sampler",
    [ta.BatchSampler(kind="fixed", batch_size=5), ta.BatchSampler(kind="poisson", rate=0.105)],
    ids=["fixed size 5 (same mean)", "poisson at q = 0.105"],
)
def test_negative_control_a_sampler_of_another_law_fails_the_binomial_test(sampler):
    # the same statistics on a law off Binomial(50, 0.1): fixed batches of 5 (the mean batch, no
    # spread), or Poisson at 0.105 (mean 5.25 against 5: 12 se of the mean over 10,000 batches)
    assert size_p_value(masks_of(sampler).sum(1), N, Q) < LEVEL


def test_geometric_gaps_have_the_geometric_law():
    # 200,000 gaps of Geometric(0.3) on {1, 2, ...}: the chi-square of the first 20 values and the
    # pooled tail, at the raised level; a Geometric(0.32) sample fails it (negative control)
    def p_value(gaps, q):
        counts = np.bincount(np.minimum(gaps, 21) - 1, minlength=21).astype(float)
        pmf = stats.geom.pmf(np.arange(1, 21), q)
        expected = np.concatenate([pmf, [1.0 - pmf.sum()]]) * gaps.size
        return float(stats.chisquare(counts, expected).pvalue)

    gaps = np.asarray(geometric_gaps(jax.random.key(3), 200_000, 0.3)).astype(int)
    assert gaps.min() >= 1
    assert p_value(gaps, 0.3) > LEVEL
    assert p_value(gaps, 0.32) < LEVEL
