"""The hockey-stick divergence E_gamma(P||Q) = sup_{0 <= h <= 1} E_P[h] - gamma E_Q[h].

A mechanism is (eps, delta)-DP exactly when E_{e^eps}(M(D)||M(D')) <= delta for every neighbouring pair
in both orders; pure eps-DP is the case delta = 0. E_gamma is the f-divergence of f(t) = max(t - gamma,
0), whose conjugate is f*(s) = gamma s on [0, 1] (+inf elsewhere), so its critics are bounded by
construction: for ONE fixed critic h valued in [0, 1] and i.i.d. held-out pairs, Z = h(X) - gamma h(Y)
lies in [-gamma, 1] and has mean v(h) <= E_gamma^H <= E_gamma, so the finite-sample (betting) bound of
:mod:`cbdp_jax._src.statistics` applies with no further assumption. Restricting h to sigmoid(g), g in a
class H (linear, poly_k, MLP), or to indicators of half-spaces / histogram cells gives the restricted
divergence E_gamma^H <= E_gamma.

Closed forms (unit shift; docs/theory/auditing.md): for Laplace noise of scale 1/e0,
E_{e^eps} = 1 - exp((eps - e0)/2) for |eps| < e0, 0 for eps >= e0 and 1 - e^eps for eps <= -e0; for
Gaussian noise with mu = shift/sigma, E_{e^eps} = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu)
(Balle and Wang 2018, Theorem 8).

References:
  Balle, Wang, "Improving the Gaussian mechanism for differential privacy", ICML 2018, Theorem 8.
  Barthe, Olmedo, "Beyond differential privacy: composition theorems and relational logic for
  f-divergences between probabilistic programs", ICALP 2013 (the hockey-stick divergence).

"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from cbdp_jax._src.estimator.adversaries import make_adversary
from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    check_finite_scalar,
    check_in_range,
    check_int_at_least,
    check_key,
    check_positive,
)
from cbdp_jax._src.mechanism_auditor import blocks
from cbdp_jax._src.statistics import betting, binomial
from cbdp_jax._src.statistics.bounds import Bound, family_confidence

CRITICS = ("linear", "halfspace", "poly", "mlp", "histogram")


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def laplace_hockey_stick(epsilon: float, mechanism_epsilon: float, shift: float = 1.0) -> float:
    """E_{e^epsilon}(Lap(0, b) || Lap(shift, b)) with b = 1 / mechanism_epsilon.

    Args:
      epsilon: The log of gamma (any real number).
      mechanism_epsilon: The noise's epsilon: scale 1 / mechanism_epsilon, > 0.
      shift: The distance between the two centres, > 0.

    Returns:
      The exact value, in [0, 1).

    """
    eps = check_finite_scalar("epsilon", epsilon)
    e0 = check_positive("mechanism_epsilon", mechanism_epsilon) * check_positive("shift", shift)
    if eps >= e0:
        return 0.0
    if eps <= -e0:
        return -math.expm1(eps)
    return -math.expm1((eps - e0) / 2.0)


def gaussian_hockey_stick(epsilon: float, sigma: float, shift: float = 1.0) -> float:
    """E_{e^epsilon}(N(0, sigma^2) || N(shift, sigma^2)) (Balle and Wang 2018, Theorem 8).

    Args:
      epsilon: The log of gamma (any real number).
      sigma: The noise standard deviation, > 0.
      shift: The L2 distance between the means, > 0.

    Returns:
      The exact value, in [0, 1).

    """
    eps = check_finite_scalar("epsilon", epsilon)
    mu = check_positive("shift", shift) / check_positive("sigma", sigma)
    value = _phi(mu / 2.0 - eps / mu) - math.exp(eps) * _phi(-mu / 2.0 - eps / mu)
    return max(value, 0.0)


def gaussian_sigma_for(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """The least sigma with E_{e^epsilon} <= delta for a Gaussian of this sensitivity (bisection).

    The analytic Gaussian mechanism of Balle and Wang (2018): exact, not the classical
    sqrt(2 log(1.25/delta)) / epsilon bound.
    """
    check_positive("epsilon", epsilon)
    check_in_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    lo, hi = 1e-6 * sensitivity, 1e6 * sensitivity
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if gaussian_hockey_stick(epsilon, mid, sensitivity) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def laplace_linear_hockey_stick(
    epsilon: float, mechanism_epsilon: float, slope_max: float, *, points: int = 4001
) -> float:
    """The restricted E_{e^eps}^H for H = {sigmoid(a x + b): |a| <= slope_max}, Laplace pair.

    P = Lap(0, 1/e0), Q = Lap(1, 1/e0); computed by quadrature on a uniform grid wide enough that
    the tails outside carry less than 1e-9 of either law, maximised over a grid of (a, b) and refined.
    As slope_max grows it increases to the unrestricted value (the optimal h is the threshold 1{x < t}).
    """
    eps = check_finite_scalar("epsilon", epsilon)
    e0 = check_positive("mechanism_epsilon", mechanism_epsilon)
    a_max = check_positive("slope_max", slope_max)
    half = 1.0 + 25.0 / e0
    x = np.linspace(-half + 0.5, half + 0.5, points)
    w = np.full(points, x[1] - x[0])
    w[[0, -1]] *= 0.5
    p = 0.5 * e0 * np.exp(-e0 * np.abs(x)) * w
    q = 0.5 * e0 * np.exp(-e0 * np.abs(x - 1.0)) * w
    gamma = math.exp(eps)

    def value(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        h = jax.nn.sigmoid(np.multiply.outer(a, x) + b[:, None])
        return np.asarray(h @ p - gamma * (h @ q))

    slopes = np.concatenate([-np.geomspace(a_max, 1e-3, 40), np.geomspace(1e-3, a_max, 40)])
    best = -math.inf
    for a in slopes:
        b = -a * np.linspace(x[0], x[-1], 400)
        best = max(best, float(np.max(value(np.full_like(b, a), b))))
    return max(best, 0.0)


# ----------------------------------------------------------------------------------------------
# Critics fitted on samples
# ----------------------------------------------------------------------------------------------


class Critic(NamedTuple):
    """A fitted critic h: x ``[n, d]`` -> values in [0, 1] ``[n]`` (numpy in, numpy out).

    Attributes:
      fn: The critic.
      label: The class it belongs to, e.g. ``'sigmoid(mlp(32x2))'`` or ``'halfspace'``.
      train_value: Its value on the training samples (biased upwards; a diagnostic only).
      indicator: Its values are 0 or 1 by construction (a set's indicator: half-spaces, histogram
        cells), so its held-out terms are two binomial counts (:func:`certify_indicator`).

    """

    fn: Callable[[np.ndarray], np.ndarray]
    label: str
    train_value: float
    indicator: bool = False


def _empirical(hp: np.ndarray, hq: np.ndarray, gamma: float) -> float:
    return float(np.mean(hp) - gamma * np.mean(hq))


def _best_threshold(sp: np.ndarray, sq: np.ndarray, gamma: float) -> tuple[float, float]:
    """The t maximising mean(sp > t) - gamma mean(sq > t), and that value."""
    s = np.concatenate([sp, sq])
    gain = np.concatenate([np.full(sp.size, 1.0 / sp.size), np.full(sq.size, -gamma / sq.size)])
    order = np.argsort(-s, kind="stable")
    cum = np.cumsum(gain[order])
    s_sorted = s[order]
    # a threshold can only sit between distinct values: take the last index of each run of ties
    last = np.r_[s_sorted[1:] != s_sorted[:-1], True]
    cum = np.where(last, cum, -np.inf)
    i = int(np.argmax(cum))
    if cum[i] <= 0:
        return math.inf, 0.0
    nxt = s_sorted[i + 1] if i + 1 < s.size else s_sorted[i] - 1.0
    return float(0.5 * (s_sorted[i] + nxt)), float(cum[i])


def _directions(xp: np.ndarray, xq: np.ndarray) -> np.ndarray:
    d = xp.shape[1]
    diff = xp.mean(0) - xq.mean(0)
    scale = np.sqrt(0.5 * (xp.var(0) + xq.var(0))) + 1e-12
    cands = [diff / scale**2, np.sign(diff)] + list(np.eye(d))
    cands = [c for c in cands if np.linalg.norm(c) > 0]
    return np.array([s * c / np.linalg.norm(c) for c in cands for s in (1.0, -1.0)])


def fit_halfspace(xp: np.ndarray, xq: np.ndarray, gamma: float) -> Critic:
    """H = 1{w . x > t}: the best threshold on a few directions (mean difference, signs, axes).

    Half-space indicators are the pointwise limits of sigmoid(a (w . x - t)) as a -> infinity, so a
    bound for them bounds E_gamma for the closure of the sigmoid-linear class (and the unrestricted one).
    """
    best = (-math.inf, None, math.inf)
    for w in _directions(xp, xq):
        t, val = _best_threshold(xp @ w, xq @ w, gamma)
        if val > best[0]:
            best = (val, w, t)
    val, w, t = best
    if w is None or not math.isfinite(t):
        return Critic(lambda x: np.zeros(len(x)), "halfspace", 0.0, True)
    return Critic(lambda x: (np.asarray(x) @ w > t).astype(np.float64), "halfspace", val, True)


def _row_keys(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float64)
    return x.view(np.dtype((np.void, x.dtype.itemsize * x.shape[1]))).ravel()


def fit_histogram(xp: np.ndarray, xq: np.ndarray, gamma: float, max_cells: int = 256) -> Critic:
    """H = indicator of the cells where the training counts say p > gamma q (the unrestricted class).

    Discrete outputs with at most ``max_cells`` distinct rows: one cell per row. Otherwise cells are 64
    quantile bins of the projection on the mean-difference direction.
    """
    both = np.concatenate([xp, xq])
    rows, inverse = np.unique(both, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    if len(rows) <= max_cells:
        cp = np.bincount(inverse[: len(xp)], minlength=len(rows)) / len(xp)
        cq = np.bincount(inverse[len(xp) :], minlength=len(rows)) / len(xq)
        chosen = _row_keys(rows[cp - gamma * cq > 0])
        val = float(np.sum(np.maximum(cp - gamma * cq, 0.0)))

        def table(x: np.ndarray) -> np.ndarray:
            return np.isin(_row_keys(np.asarray(x, np.float64)), chosen).astype(np.float64)

        return Critic(table, "histogram(cells)", val, True)
    w = _directions(xp, xq)[0]
    edges = np.unique(np.quantile(both @ w, np.linspace(0, 1, 65)[1:-1]))
    cp = np.bincount(np.searchsorted(edges, xp @ w), minlength=len(edges) + 1) / len(xp)
    cq = np.bincount(np.searchsorted(edges, xq @ w), minlength=len(edges) + 1) / len(xq)
    keep = (cp - gamma * cq > 0).astype(np.float64)
    val = float(np.sum(np.maximum(cp - gamma * cq, 0.0)))
    return Critic(
        lambda x: keep[np.searchsorted(edges, np.asarray(x) @ w)], "histogram(64 bins)", val, True
    )


@functools.partial(jax.jit, static_argnames=("graphdef", "tx", "steps", "batch"))
def _train(graphdef, params, rest, tx, xp, xq, gamma, key, steps: int, batch: int):
    def loss(params, bp, bq):
        # logistic regression of P against Q: g approaches log(p/q) (weighted by the class sizes)
        g = nnx.merge(graphdef, params, rest)
        return jnp.mean(jax.nn.softplus(-g(bp))) + jnp.mean(jax.nn.softplus(g(bq)))

    def step(carry, k):
        params, opt = carry
        kp, kq = jax.random.split(k)
        bp = xp[jax.random.randint(kp, (batch,), 0, xp.shape[0])]
        bq = xq[jax.random.randint(kq, (batch,), 0, xq.shape[0])]
        grads = jax.grad(loss)(params, bp, bq)
        updates, opt = tx.update(grads, opt, params)
        return (optax.apply_updates(params, updates), opt), None

    (params, _), _ = jax.lax.scan(step, (params, tx.init(params)), jax.random.split(key, steps))
    return params


def fit_logit(
    key: jax.Array, xp: np.ndarray, xq: np.ndarray, adversary: str = "mlp", *, steps: int = 400,
    batch: int = 2048, features: Callable[[np.ndarray], np.ndarray] | None = None, **options,
) -> tuple[Callable[[np.ndarray], np.ndarray], str]:  # fmt: skip
    """G from the library's adversary class, trained by logistic regression of P against Q.

    g approaches log(p/q) (weighted by the class sizes), whose super-level sets are the optimal
    critics; the inputs are standardised by the training samples' mean and spread. Returns ``(g,
    label)``, g mapping ``[n, d]`` numpy to ``[n]`` float64. With ``features`` (a row-wise map of
    the rows, e.g. a :class:`FeatureGroup`'s), g is a logit of ``features(x)``: the features are
    computed a block of rows at a time (:mod:`~cbdp_jax._src.mechanism_auditor.blocks`) and only
    their float32 copy that training reads is held, never a float64 copy of the whole sample's.
    """
    check_key(key)
    spec = make_adversary(adversary, **options)
    k_init, k_train = jax.random.split(key)
    f = (lambda x: x) if features is None else features
    loc, std = blocks.mean_std(xp, xq, features=f)  # the mean and spread of both samples' rows
    f32 = [
        jnp.asarray(blocks.in_blocks(lambda b: np.asarray(f(b), np.float32), a)) for a in (xp, xq)
    ]
    module = spec.build(k_init, f32[0].shape[1], loc=loc, scale=std + 1e-6)
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)
    params = _train(
        graphdef, params, rest, optax.adam(1e-2), *f32, 1.0, k_train, steps,
        min(batch, len(xp), len(xq)),
    )  # fmt: skip
    del f32

    def block(x: np.ndarray) -> np.ndarray:
        x = jnp.asarray(f(x), jnp.float32)
        return np.asarray(_apply(graphdef, params, rest, x), np.float64)

    def logit(x: np.ndarray) -> np.ndarray:  # row-wise: a block at a time (the same numbers)
        return blocks.in_blocks(block, x)

    return logit, spec.label


def fit_trained(
    key: jax.Array,
    xp: np.ndarray,
    xq: np.ndarray,
    gamma: float,
    adversary: str,
    *,
    steps: int = 400,
    batch: int = 2048,
    **options,
) -> Critic:
    """H = sigmoid(g), g from the library's adversary class (``'linear'``, ``'poly'``, ``'mlp'``).

    g is trained with Adam by logistic regression of P against Q (so g approaches log p/q, whose
    super-level sets are the optimal critics), then h = sigmoid(T (g - c)) with the temperature T and
    the offset c that maximise mean(h(X)) - gamma mean(h(Y)) on the same training samples.
    """
    logit, label = fit_logit(key, xp, xq, adversary, steps=steps, batch=batch, **options)
    # T and c are chosen on (at most) 20000 training samples per side: a grid of 196 candidates
    gp, gq = logit(xp[:20_000]), logit(xq[:20_000])
    # h = sigmoid(T (g - c)) is in sigmoid(H) (the last layer is affine); T and c chosen on training data
    best = (-math.inf, 1.0, 0.0)
    for c in np.quantile(np.concatenate([gp, gq]), np.linspace(0.02, 0.98, 49)):
        for t in (1.0, 4.0, 16.0, 64.0):
            val = _empirical(_sigmoid(t * (gp - c)), _sigmoid(t * (gq - c)), gamma)
            best = max(best, (val, t, float(c)))
    val, t, c = best

    def fn(x: np.ndarray) -> np.ndarray:
        return _sigmoid(t * (logit(x) - c))

    return Critic(fn, f"sigmoid({label})", val)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _apply(graphdef, params, rest, x):
    return nnx.merge(graphdef, params, rest)(x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def fit_critic(key: jax.Array, kind: str, xp, xq, gamma: float) -> Critic:
    """Fits a critic of class ``kind`` (one of ``CRITICS``) on training samples ``[n, d]``."""
    if kind == "linear":
        # the half-space found by scanning thresholds, and a trained sigmoid-linear critic: both of
        # the linear family (a half-space is sigmoid(a (w . x - t)) as a -> inf); the row names the
        # family first, so that rows of one class read as one class whichever member won
        a = fit_halfspace(xp, xq, gamma)
        b = fit_trained(key, xp, xq, gamma, "linear")
        won, member = (a, "halfspace") if a.train_value >= b.train_value else (b, "sigmoid")
        return won._replace(label=f"linear ({member})")
    if kind == "halfspace":  # the threshold scan alone: cheap, no training
        return fit_halfspace(xp, xq, gamma)
    if kind == "poly":
        return fit_trained(key, xp, xq, gamma, "poly", degree=3)
    if kind in ("mlp", "bounded-mlp"):  # every sigmoid critic is bounded
        return fit_trained(key, xp, xq, gamma, "mlp", width=32, depth=2)
    if kind == "histogram":
        return fit_histogram(xp, xq, gamma)
    raise InvalidParameterError(f"critic={kind!r} is invalid: must be one of {list(CRITICS)}")


class FeatureGroup(NamedTuple):
    """A group of a mechanism's output features and the critics an audit fits on it.

    A mechanism whose samples are ``[n, F]`` feature rows may name groups of them (e.g. a training
    run's score, and statistics of everything its threat releases); the audit fits each group's
    critics on the training split and certifies them on the held-out split, all groups' bounds in
    ONE Bonferroni family (docs/theory/training_audit.md, section 10).

    Attributes:
      name: The group's name; its rows' critic labels are ``'name:label'`` (unprefixed for
        ``'score'``).
      features: ``[n, F] -> [n, d]`` numpy: the group's features of the samples.
      classes: The critic classes fitted at the grid points (None: the audit's ``classes``).
      grid: Every grid point (True), or only the lowest and the claim's eps (fewer members).
      tails: The tail critics (:func:`fit_tail`, one per direction) where the audit asks for them.
      learned: First learn a logit g of the group's features (:func:`fit_logit`, an MLP 32x2) on
        the training split; the group's critics are then fitted on g's values: a learned critic.

    """

    name: str
    features: Callable[[np.ndarray], np.ndarray]
    classes: tuple[str, ...] | None = None
    grid: bool = True
    tails: bool = True
    learned: bool = False


class HockeyStickBound(NamedTuple):
    """A held-out estimate of v(h) = E_P h - gamma E_Q h and its finite-sample lower bound.

    Attributes:
      estimate: The held-out mean of Z = h(X) - gamma h(Y).
      std_error: Its standard error.
      bound: The finite-sample lower bound (betting, or Clopper-Pearson for an indicator), a
        :class:`Bound`.
      n: Held-out pairs used.
      p_lower: For an indicator critic h = 1_S: an exact lower bound on P(S) (else NaN).
      q_upper: For an indicator critic: an exact upper bound on Q(S), holding together with
        ``p_lower`` and ``bound`` at the bound's level (else NaN).

    """

    estimate: float
    std_error: float
    bound: Bound
    n: int
    p_lower: float = math.nan
    q_upper: float = math.nan


def certify(
    hp: np.ndarray, hq: np.ndarray, gamma: float, *, confidence: float = 0.95, family_size: int = 1
) -> HockeyStickBound:
    """Finite-sample lower bound on E_gamma^H from one fixed critic's held-out values in [0, 1].

    Z_i = h(X_i) - gamma h(Y_i) in [-gamma, 1] (paired in draw order), so the betting bound of
    Waudby-Smith and Ramdas holds at every n (docs/theory/bounds.md section 3.1).
    """
    check_positive("gamma", gamma)
    check_int_at_least("family_size", family_size, 1)
    n = min(len(hp), len(hq))
    z = np.clip(np.asarray(hp[:n], np.float64), 0, 1) - gamma * np.clip(hq[:n], 0, 1)
    level = family_confidence(confidence, family_size)
    low = betting.lower_bound(z, -gamma, 1.0, level)
    bound = Bound(low, "finite-sample", "betting", level, family_size)
    se = float(z.std(ddof=1) / math.sqrt(n)) if n > 1 else math.inf
    return HockeyStickBound(float(z.mean()), se, bound, n)


def certify_indicator(
    hp: np.ndarray, hq: np.ndarray, gamma: float, *, confidence: float = 0.95,
    family_size: int = 1, betting_too: bool = True,
) -> HockeyStickBound:  # fmt: skip
    """Finite-sample lower bound on P(S) - gamma Q(S) from an indicator critic h = 1_S's held-out values.

    The held-out counts are binomial, so exact Clopper-Pearson bounds P_lo <= P(S) and Q_up >= Q(S)
    give L = P_lo - gamma Q_up, which (unlike a bound that only knows Z's range [-gamma, 1]) is tight
    in the tails, where Q(S) is tiny and the range term gamma log(1/a) / n swamps a small delta. With
    ``betting_too`` the betting bound of :func:`certify` is also computed and the larger is returned;
    the row's error budget a = 1 - level is split in advance: a / 2 to the betting bound, a / 4 to
    each side's Clopper-Pearson bound (a / 2 each without it), so everything returned (the bound,
    ``p_lower`` and ``q_upper``) holds together at the row's level by the union bound, whichever is
    larger. Which rule applies is decided by the critic's kind, before the held-out data are seen.

    References:
      Clopper, Pearson 1934 (:mod:`.statistics.binomial`); Waudby-Smith, Ramdas 2024 (betting);
      Nasr et al. 2023, "Tight auditing of differentially private machine learning" (section 4,
      Clopper-Pearson bounds on a test's two error rates).

    """
    check_positive("gamma", gamma)
    n = min(len(hp), len(hq))
    a = 1.0 - family_confidence(confidence, family_size)
    share = a / 4.0 if betting_too else a / 2.0
    kp, kq = (int(np.sum(np.asarray(h[:n], np.float64) > 0.5)) for h in (hp, hq))
    p_lo = float(binomial.clopper_pearson_lower(kp, n, 1.0 - share))
    q_up = float(binomial.clopper_pearson_upper(kq, n, 1.0 - share))
    exact = Bound(p_lo - gamma * q_up, "finite-sample", "clopper-pearson", 1.0 - a, family_size)
    z = (kp - gamma * kq) / n
    se = math.sqrt(kp / n * (1 - kp / n) + gamma**2 * kq / n * (1 - kq / n)) / math.sqrt(n)
    if not betting_too:
        return HockeyStickBound(z, se, exact, n, p_lo, q_up)
    res = certify(hp, hq, gamma, confidence=1.0 - a / 2.0)
    bound = exact if exact.value >= res.bound.value else res.bound
    return HockeyStickBound(z, se, bound._replace(confidence=1.0 - a, family_size=family_size),
                            n, p_lo, q_up)  # fmt: skip


def tail_epsilon(p_lower: float, q_upper: float, delta: float) -> float:
    """The largest eps refuted at ``delta`` by a set with P(S) >= p_lower and Q(S) <= q_upper.

    (eps, delta)-DP gives P(S) <= e^eps Q(S) + delta, so every eps below log((p_lower - delta) /
    q_upper) is refuted (0 when nothing is). Nasr et al. 2023, eq. (1); Jagielski, Ullman, Oprea 2020.
    Applied to the complement in the other direction (the claim holds for both orders of a
    neighbouring pair) it gives 1 - Q(S) <= e^eps (1 - P(S)) + delta, which refutes every eps below
    log((1 - delta - q_upper) / (1 - p_lower)); the larger of the two is returned. Together they are
    the (eps, delta) randomized response's trade-off curve, the tight one (Kairouz, Oh, Viswanath 2015).
    """
    eps = 0.0
    if p_lower > delta and q_upper > 0:
        eps = max(eps, math.log((p_lower - delta) / q_upper))
    if 1.0 - delta - q_upper > 0 and p_lower < 1.0:
        eps = max(eps, math.log((1.0 - delta - q_upper) / (1.0 - p_lower)))
    return eps


def fit_tail(
    xp: np.ndarray, xq: np.ndarray, delta: float, test_size: int, confidence: float
) -> Critic:
    """The half-space 1{w . x > t} whose Clopper-Pearson refutation at ``delta`` looks largest.

    For each direction of :func:`fit_halfspace` and about 2,000 thresholds (geometric in the number
    of training P samples above them, so the tail is scanned finely), the training counts give
    one-sigma pessimistic rates (the 0.84 Clopper-Pearson bounds: against the winner's curse of a
    maximum over thresholds whose tail counts are small), scaled to ``test_size`` held-out samples
    and turned into the eps :func:`tail_epsilon` would certify at ``confidence`` per side; the best is
    kept. Fitted on training samples only, so the held-out certificate of the chosen set costs no
    multiplicity. This targets eps at a small delta, where the threshold maximising P(S) - gamma
    Q(S) (:func:`fit_halfspace`) is not the best one.
    """
    best = (-math.inf, None, math.inf)
    for w in _directions(xp, xq):
        sa, sb = np.sort(xp @ w), np.sort(xq @ w)
        k = np.unique(np.geomspace(1, sa.size, 2048).astype(np.int64))
        t = np.where(k < sa.size, 0.5 * (sa[sa.size - k] + sa[np.maximum(sa.size - k - 1, 0)]),
                     sa[0] - 1.0)  # fmt: skip
        kp = sa.size - np.searchsorted(sa, t, side="right")
        kq = sb.size - np.searchsorted(sb, t, side="right")
        hp = np.floor(binomial.clopper_pearson_lower(kp, sa.size, _PESSIMISM) * test_size)
        hq = np.ceil(binomial.clopper_pearson_upper(kq, sb.size, _PESSIMISM) * test_size)
        p_lo = binomial.clopper_pearson_lower(hp, test_size, confidence)
        q_up = binomial.clopper_pearson_upper(np.minimum(hq, test_size), test_size, confidence)
        with np.errstate(divide="ignore", invalid="ignore"):
            pred = np.where(p_lo > delta, np.log((p_lo - delta) / q_up), p_lo - delta - 1e3)
        i = int(np.argmax(pred))
        if pred[i] > best[0]:
            best = (float(pred[i]), w, float(t[i]))
    val, w, t = best
    if w is None:
        return Critic(lambda x: np.zeros(len(x)), "tail-halfspace", 0.0, True)
    return Critic(lambda x: (np.asarray(x) @ w > t).astype(np.float64), "tail-halfspace", val, True)


_PESSIMISM = 0.84  # fit_tail's training rates: one-sided bounds at about one standard deviation


def samples_needed(gap: float, std: float, confidence: float, family_size: int) -> float:
    """About how many held-out pairs the betting bound needs to certify a value ``gap`` above a claim.

    From its large-n width std * sqrt(2 log(K / (1 - confidence)) / n) (docs/theory/bounds.md 3.1).
    """
    if gap <= 0:
        return math.inf
    log_inv = math.log(family_size / (1.0 - confidence))
    return math.ceil(2.0 * log_inv * max(std, 1e-12) ** 2 / gap**2)
