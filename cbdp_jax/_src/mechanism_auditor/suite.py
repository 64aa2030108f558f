"""Mechanisms with known privacy flaws and their correct twins, written here from the literature.

Each :class:`SuiteCase` is a JAX mechanism ``(key, dataset, n) -> [n, d]``, the claim its author makes,
whether the claim is false, the dataset space to search and the counterexample pair the literature
gives (our transcription). All claims are pure eps-DP at eps = 1 unless stated.

References:
  Lyu, Su, Li, "Understanding the sparse vector technique for differential privacy", PVLDB 10(6), 2017
  (Algorithms 1, 5 and 6).
  Dwork, Roth, "The algorithmic foundations of differential privacy", 2014 (report noisy max, 3.3;
  Laplace and randomized response).
  Ding, Wang, Wang, Zhang, Kifer, "Detecting violations of differential privacy", CCS 2018.
  Balle, Wang, ICML 2018 (the analytic Gaussian mechanism).

"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cbdp_jax._src.mechanism_auditor.hockey_stick import gaussian_sigma_for
from cbdp_jax._src.mechanism_auditor.pairs import DatasetSpace

EPS = 1.0
SVT_QUERIES = 10


class SuiteCase(NamedTuple):
    """One audited mechanism.

    Attributes:
      name: Short id.
      fn: The mechanism ``(key, dataset, n) -> [n, d]`` (pure JAX).
      claim: The claim its author makes (``pure:1``, ``approx:1:1e-05``).
      flawed: True when the claim is false.
      space: The dataset space searched.
      paper_pair: The literature's counterexample pair ``(D, D')``.
      description: What the mechanism does and what is wrong with it.
      beyond_sampling: True for a false claim no audit with 10^6 samples per side can refute.

    """

    name: str
    fn: Callable
    claim: str
    flawed: bool
    space: DatasetSpace
    paper_pair: tuple[list, list]
    description: str
    beyond_sampling: bool = False


def _laplace_sum(key, d, n, scale):
    return jnp.sum(d) + scale * jax.random.laplace(key, (n, 1))


def _rnm(key, q, n, scale, gaussian: bool):
    noise = jax.random.normal if gaussian else jax.random.laplace
    noisy = q[None, :] + scale * noise(key, (n, q.shape[0]))
    return jnp.argmax(noisy, axis=1)[:, None].astype(jnp.float32)


def _svt(key, q, n, *, variant: int, eps: float = EPS, threshold: float = 0.5):
    """Lyu et al.'s Algorithm 1 (c = 1), 5 (no query noise) or 6 (no cutoff); Delta = 1.

    Outputs per query: 1 (above), 0 (below), -1 (not answered: after the cutoff).
    """
    k_rho, k_nu = jax.random.split(key)
    m = q.shape[0]
    if variant == 1:
        rho = 2.0 / eps * jax.random.laplace(k_rho, (n, 1))  # eps1 = eps/2, Lap(Delta/eps1)
        nu = 4.0 / eps * jax.random.laplace(k_nu, (n, m))  # eps2 = eps/2, Lap(2 c Delta/eps2)
    elif variant == 5:
        rho = 2.0 / eps * jax.random.laplace(k_rho, (n, 1))
        nu = jnp.zeros((n, m))
    else:  # variant 6
        rho = 2.0 / eps * jax.random.laplace(k_rho, (n, 1))  # Lap(Delta/eps1)
        nu = 2.0 / eps * jax.random.laplace(k_nu, (n, m))  # Lap(Delta/eps2), no cutoff
    above = (q[None, :] + nu >= threshold + rho).astype(jnp.float32)
    if variant == 6:
        return above
    # cutoff c = 1: answers after the first "above" are not given
    seen = jnp.cumsum(above, axis=1) - above
    return jnp.where(seen >= 1, -1.0, above)


def _histogram(key, d, n, *, bins: int, scale: float):
    counts = jnp.sum(jax.nn.one_hot(d.astype(jnp.int32), bins), axis=0)
    return counts[None, :] + scale * jax.random.laplace(key, (n, bins))


def _vector_laplace(key, d, n, scale):
    total = jnp.sum(d, axis=0)
    return total[None, :] + scale * jax.random.laplace(key, (n, d.shape[1]))


def _clipped_gaussian(key, d, n, *, clip: float, sigma: float):
    norms = jnp.linalg.norm(d, axis=1, keepdims=True)
    clipped = d * jnp.minimum(1.0, clip / jnp.maximum(norms, 1e-12))
    return jnp.sum(clipped, axis=0)[None, :] + sigma * jax.random.normal(key, (n, d.shape[1]))


def _randomized_response(key, d, n, *, eps: float):
    keep = math.exp(eps) / (1.0 + math.exp(eps))
    bit = jnp.reshape(d, (-1,))[0]
    flip = jax.random.uniform(key, (n, 1)) > keep
    return jnp.where(flip, 1.0 - bit, bit)


# The add/remove pair used for DP-Auditorium's "non_private_mean_v2" (issue 26): M(D) has an atom of mass
# exp(-1/2) / 2 = 0.303 at 0, M(D') one of mass exp(-1) / 2 = 0.184 at 0.5, so D_alpha = +inf (each law
# puts mass where the other has none); the smallest datasets give the heaviest atoms.
MEAN_V2_PAIR = ([0.0], [0.0, 1.0])


def noisy_count_mean(
    key: jax.Array,
    dataset,
    n: int,
    *,
    epsilon: float = EPS,
    lower: float = 0.0,
    upper: float = 1.0,
    noisy_mean: bool = False,
    noisy_scale: bool = True,
) -> jax.Array:
    """``n`` outputs ``[n, 1]`` of DP-Auditorium's ``MeanMechanism`` (Laplace), written here in JAX.

    The data are clipped to ``[lower, upper]``; each output draws a noisy count c = |D| + Lap(2 /
    epsilon) (half the budget) and releases sum(D) / m + Lap(s), s = max(1e-12, (upper - lower) /
    (epsilon / 2) / k), where m is c if ``noisy_mean`` else |D| and k is c if ``noisy_scale`` else
    |D|. The defaults are DP-Auditorium's ``non_private_mean_v2`` (true count for the mean, noisy
    count for the scale): when c < 0 the scale is clamped to 1e-12 (an atom at the true mean), and
    when c is near 0 it is huge (outliers up to ~1e6 in 10^5 outputs). With neither flag the budget
    is not halved (their ``non_private_mean_v1``). One departure: s is also capped at 1e30, so that
    a count of exactly 0 (probability ~1e-8 per float32 output) gives a huge finite output, not inf.

    References:
      DP-Auditorium, python/dp_auditorium/dp_auditorium/mechanisms/mean.py (``MeanMechanism``) and
      mechanisms/mechanisms_utils.py (``default_mean_mechanism_config_generator``), in
      github.com/google/differential-privacy; Kong et al., "DP-Auditorium: a large scale library for
      auditing differential privacy", IEEE S&P 2024.

    """
    d = jnp.clip(jnp.reshape(jnp.asarray(dataset, jnp.float32), (-1,)), lower, upper)
    size = d.shape[0]
    budget = 0.5 if (noisy_mean or noisy_scale) else 1.0
    k_count, k_noise = jax.random.split(key)
    count = size + jax.random.laplace(k_count, (n, 1)) / (budget * epsilon)
    divisor = count if noisy_scale else size
    scale = jnp.clip(abs(upper - lower) / budget / epsilon / divisor, 1e-12, 1e30)
    centre = jnp.sum(d) / (count if noisy_mean else size)
    return centre + scale * jax.random.laplace(k_noise, (n, 1))


def _p(fn, **kw) -> Callable:
    return functools.partial(fn, **kw)


# module-level wrappers so that each variant is a distinct, hashable function for jit
def _laplace_sum_fn(key, d, n, *, scale):
    return _laplace_sum(key, d, n, scale / EPS)


def _rnm_fn(key, q, n, *, scale, gaussian):
    return _rnm(key, q, n, scale / EPS, gaussian)


def _svt_fn(key, q, n, *, variant):
    return _svt(key, q, n, variant=variant)


def _hist_fn(key, d, n, *, bins, scale):
    return _histogram(key, d, n, bins=bins, scale=scale / EPS)


def _vec_fn(key, d, n, *, scale):
    return _vector_laplace(key, d, n, scale / EPS)


def _clip_fn(key, d, n, *, clip, sigma):
    return _clipped_gaussian(key, d, n, clip=clip, sigma=sigma)


def _rr_fn(key, d, n, *, eps):
    return _randomized_response(key, d, n, eps=eps)


# The dataset spaces searched and the literature's counterexample pairs shared by several cases.
_SUM_SPACE = DatasetSpace(shape=(5,), low=0.0, high=2.0)
_RNM_SPACE = DatasetSpace(shape=(8,), low=0.0, high=4.0, integer=True, relation="linf")
_SVT_SPACE = DatasetSpace(shape=(SVT_QUERIES,), low=0.0, high=1.0, integer=True, relation="linf")
_HIST_SPACE = DatasetSpace(shape=(6,), low=0.0, high=3.0, integer=True)
_VEC_SPACE = DatasetSpace(shape=(3, 4), low=0.0, high=1.0)
_CLIP_SPACE = DatasetSpace(shape=(3, 2), low=-3.0, high=3.0, relation="zero-out")
_RR_SPACE = DatasetSpace(shape=(1,), low=0.0, high=1.0, integer=True)
_HALF = SVT_QUERIES // 2
_SVT_PAIR = ([0] * _HALF + [1] * _HALF, [1] * _HALF + [0] * _HALF)
_RNM_PAIR = ([1] + [0] * 7, [0] + [1] * 7)
_SIGMA1 = gaussian_sigma_for(1.0, 1e-5, 1.0)  # the analytic Gaussian's sigma for L2 norm 1
_SIGMA2 = gaussian_sigma_for(1.0, 1e-5, 2.0)  # and for L2 norm 2

# The suite: one row per audited mechanism (SuiteCase's fields in order).
SUITE: tuple[SuiteCase, ...] = (
    SuiteCase(
        "laplace_sensitivity",
        _p(_laplace_sum_fn, scale=1.0),
        "pure:1",
        True,
        _SUM_SPACE,
        ([0, 0, 0, 0, 0], [2, 0, 0, 0, 0]),
        "sum of 5 records in [0, 2] plus Lap(1/eps): sensitivity taken as 1, it is 2",
    ),
    SuiteCase(
        "laplace_sensitivity_correct",
        _p(_laplace_sum_fn, scale=2.0),
        "pure:1",
        False,
        _SUM_SPACE,
        ([0, 0, 0, 0, 0], [2, 0, 0, 0, 0]),
        "as above with Lap(2/eps)",
    ),
    SuiteCase(
        "rnm_scale",
        _p(_rnm_fn, scale=1.0, gaussian=False),
        "pure:1",
        True,
        _RNM_SPACE,
        _RNM_PAIR,
        "report noisy max of 8 sensitivity-1 queries with Lap(1/eps): "
        "eps-DP only for monotone queries; needs Lap(2/eps)",
    ),
    SuiteCase(
        "rnm_gaussian",
        _p(_rnm_fn, scale=2.0, gaussian=True),
        "pure:1",
        True,
        _RNM_SPACE,
        _RNM_PAIR,
        "report noisy max with N(0, (2/eps)^2) noise: no finite pure eps",
    ),
    SuiteCase(
        "rnm_correct",
        _p(_rnm_fn, scale=2.0, gaussian=False),
        "pure:1",
        False,
        _RNM_SPACE,
        _RNM_PAIR,
        "report noisy max with Lap(2/eps)",
    ),
    SuiteCase(
        "svt_alg5",
        _p(_svt_fn, variant=5),
        "pure:1",
        True,
        _SVT_SPACE,
        _SVT_PAIR,
        "Lyu et al. Algorithm 5: no noise on the queries (infinite eps)",
    ),
    SuiteCase(
        "svt_alg6",
        _p(_svt_fn, variant=6),
        "pure:1",
        True,
        _SVT_SPACE,
        _SVT_PAIR,
        "Lyu et al. Algorithm 6: no cutoff, answers every query (infinite eps)",
    ),
    SuiteCase(
        "svt_alg1",
        _p(_svt_fn, variant=1),
        "pure:1",
        False,
        _SVT_SPACE,
        _SVT_PAIR,
        "Lyu et al. Algorithm 1 with c = 1: eps-DP",
    ),
    SuiteCase(
        "histogram_bins",
        _p(_hist_fn, bins=4, scale=2.0 / 4),
        "pure:1",
        True,
        _HIST_SPACE,
        ([0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]),
        "noisy histogram of 4 bins, scale divided by the bin count: Lap(2/(4 eps))",
    ),
    SuiteCase(
        "histogram_correct",
        _p(_hist_fn, bins=4, scale=2.0),
        "pure:1",
        False,
        _HIST_SPACE,
        ([0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]),
        "noisy histogram with Lap(2/eps)",
    ),
    SuiteCase(
        "vector_laplace_l2",
        _p(_vec_fn, scale=2.0),
        "pure:1",
        True,
        _VEC_SPACE,
        ([[0.0] * 4] * 3, [[1.0] * 4] + [[0.0] * 4] * 2),
        "sum of records in [0, 1]^4 plus Lap(sqrt(4)/eps): L2 sensitivity used, L1 is 4",
    ),
    SuiteCase(
        "vector_laplace_correct",
        _p(_vec_fn, scale=4.0),
        "pure:1",
        False,
        _VEC_SPACE,
        ([[0.0] * 4] * 3, [[1.0] * 4] + [[0.0] * 4] * 2),
        "with Lap(4/eps)",
    ),
    SuiteCase(
        "gaussian_clip",
        _p(_clip_fn, clip=2.0, sigma=_SIGMA1),
        "approx:1:1e-05",
        True,
        _CLIP_SPACE,
        ([[2.0, 0.0], [0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0]] * 3),
        "sum of records clipped to L2 norm 2 plus Gaussian noise calibrated for norm 1",
    ),
    SuiteCase(
        "gaussian_clip_correct",
        _p(_clip_fn, clip=2.0, sigma=_SIGMA2),
        "approx:1:1e-05",
        False,
        _CLIP_SPACE,
        ([[2.0, 0.0], [0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0]] * 3),
        "sigma calibrated (analytic Gaussian) for norm 2",
    ),
    SuiteCase(
        "randomized_response_2eps",
        _p(_rr_fn, eps=2.0),
        "pure:1",
        True,
        _RR_SPACE,
        ([0], [1]),
        "randomized response with flip probability 1/(1+e^2): it is 2-DP",
    ),
    SuiteCase(
        "randomized_response_correct",
        _p(_rr_fn, eps=1.0),
        "pure:1",
        False,
        _RR_SPACE,
        ([0], [1]),
        "randomized response with flip probability 1/(1+e)",
    ),
    SuiteCase(
        "gaussian_tiny_delta",
        _p(_clip_fn, clip=1.0, sigma=gaussian_sigma_for(1.0, 1e-8)),
        "approx:1:1e-10",
        True,
        _CLIP_SPACE,
        ([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0]] * 3),
        "Gaussian with delta 1e-8 claimed as 1e-10: the excess 1e-8 is "
        "far below what 10^6 samples can certify",
        beyond_sampling=True,
    ),
)


def suite_case(name: str) -> SuiteCase:
    """The suite case called ``name``."""
    for case in SUITE:
        if case.name == name:
            return case
    from cbdp_jax._src.infra.validation import InvalidParameterError

    raise InvalidParameterError(
        f"case={name!r} is invalid: must be one of {[c.name for c in SUITE]}"
    )


def as_arrays(pair) -> tuple[np.ndarray, np.ndarray]:
    """A pair of nested lists as float arrays."""
    return np.asarray(pair[0], np.float64), np.asarray(pair[1], np.float64)


class ThirdPartyCase(NamedTuple):
    """A third-party mechanism run as a black box on the host.

    Attributes:
      name: Short id.
      fn: ``(rng, dataset, n) -> [n]`` calling the library once per output.
      pair: The neighbouring pair audited.
      claim: The library's stated guarantee.
      understated: The same claim with epsilon halved (false).

    """

    name: str
    fn: Callable
    pair: tuple[list, list]
    claim: str
    understated: str


def diffprivlib_cases(epsilon: float = 1.0, delta: float = 1e-5) -> list[ThirdPartyCase]:
    """IBM diffprivlib's Laplace, analytic Gaussian, Geometric and Exponential mechanisms.

    Each call builds the library's mechanism with a ``RandomState`` seeded from the audit's
    Generator, so the same key gives the same outputs. Needs the ``audit`` extra (diffprivlib).
    """
    from diffprivlib import mechanisms as dpl

    def seeded(rng: np.random.Generator) -> np.random.RandomState:
        return np.random.RandomState(int(rng.integers(2**31 - 1)))

    def laplace(rng, d, n):
        m = dpl.Laplace(epsilon=epsilon, sensitivity=1.0, random_state=seeded(rng))
        v = float(np.ravel(d)[0])
        return np.array([m.randomise(v) for _ in range(n)])

    def gaussian(rng, d, n):
        m = dpl.GaussianAnalytic(
            epsilon=epsilon, delta=delta, sensitivity=1.0, random_state=seeded(rng)
        )
        v = float(np.ravel(d)[0])
        return np.array([m.randomise(v) for _ in range(n)])

    def geometric(rng, d, n):
        m = dpl.Geometric(epsilon=epsilon, sensitivity=1, random_state=seeded(rng))
        v = int(np.ravel(d)[0])
        return np.array([m.randomise(v) for _ in range(n)], np.float64)

    def exponential(rng, d, n):
        utility = [float(u) for u in np.ravel(d)]
        m = dpl.Exponential(
            epsilon=epsilon, sensitivity=1.0, utility=utility, random_state=seeded(rng)
        )
        return np.array([m.randomise() for _ in range(n)], np.float64)

    pure, half = f"pure:{epsilon:g}", f"pure:{epsilon / 2:g}"
    approx, approx_half = f"approx:{epsilon:g}:{delta:g}", f"approx:{epsilon / 2:g}:{delta:g}"
    # the exponential mechanism's tight pair: one candidate loses 1, the 19 others gain 1
    utilities = ([1] + [0] * 19, [0] + [1] * 19)
    return [
        ThirdPartyCase("diffprivlib.Laplace", laplace, ([0], [1]), pure, half),
        ThirdPartyCase("diffprivlib.GaussianAnalytic", gaussian, ([0], [1]), approx, approx_half),
        ThirdPartyCase("diffprivlib.Geometric", geometric, ([0], [1]), pure, half),
        ThirdPartyCase("diffprivlib.Exponential", exponential, utilities, pure, half),
    ]
