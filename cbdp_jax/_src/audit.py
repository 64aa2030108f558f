"""Auditing a mechanism's privacy claim from samples: screen neighbouring pairs, certify on fresh ones.

1. **Screen.** Candidate pairs (given, generated from a :class:`DatasetSpace` by random and local
   search, or from the user's generator) are scored on a small budget: a half-space and a histogram
   critic fitted on half the screening samples, evaluated on the other half, at the claim's gamma.
2. **Certify.** The best pair is certified on FRESH samples never used in screening, so the search
   is a data-dependent choice of *which* pair to test and costs no multiplicity: conditionally on the
   screening data, the certification samples are independent draws. Every (class, direction, grid
   point) bound of the certification is one member of a Bonferroni family of size K.
3. **Verdict.** A violation is certified only when a certified lower bound exceeds the claimed value;
   otherwise the strongest certified bound is reported with how many samples a violation of a given
   size would need.

Claims (docs/theory/auditing.md): ``pure:EPS`` and ``approx:EPS:DELTA`` are checked with the
hockey-stick divergence (pure eps-DP as its delta = 0 case), and the audit reports the empirical
epsilon: the largest eps whose (eps, delta) claim the certified curve refutes, and the largest GDP mu
it refutes. ``renyi:ALPHA:EPS`` is checked with the estimator's finite-sample bound (any critic's bound
is a bound on the unrestricted divergence). ``capacity:CLASS:DIV[:ALPHA]:VALUE`` is a claim about D^H for
that class, so it is checked only with bounds on a subset of H: the finite-sample bound of a bounded
class, and for an unbounded class the asymptotic bound on the class itself (its assumption stated) --
never the finite-sample bound of ``B tanh(H / B)``, which is not inside H and has a larger divergence.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import jax
import numpy as np

from cbdp_jax._src import hockey_stick as hs
from cbdp_jax._src.audit_io import (
    AuditMechanism,
    finite_or,
    host_rng,
    load_mechanism,
    refuse_non_finite,
)
from cbdp_jax._src.statistics.bounds import family_confidence
from cbdp_jax._src.validation import (
    InvalidParameterError,
    check_choice,
    check_in_range,
    check_int_at_least,
    check_key,
)

CLAIM_KINDS = ("pure", "approx", "renyi", "capacity", "dpsgd")
RELATIONS = ("replace-one", "zero-out", "linf")


class Claim(NamedTuple):
    """A privacy claim.

    Attributes:
      kind: ``'pure'``, ``'approx'``, ``'renyi'`` or ``'capacity'``.
      epsilon: eps of a pure / approximate / Renyi claim.
      delta: delta of an approximate claim (0 for pure).
      alpha: The Renyi order (renyi, or a capacity claim on the Renyi divergence).
      adversary: The class of a capacity claim (``linear``, ``poly``, ``mlp``).
      divergence: The divergence of a capacity claim (``kl`` or ``renyi``).
      value: The claimed value of a capacity claim.
      text: The claim as written.
      source: For a ``dpsgd:`` claim, the run's parameters and the accountant
        (:class:`~cbdp_jax._src.accounting.DpsgdClaim`); the claim itself is the approximate one
        they imply.
      architecture: For a capacity claim, the class's architecture as audited (``'mlp(32x2)'``,
        ``'poly(3)'``, ``'linear'``).
      architecture_default: Whether the claim named only the family, so that the architecture is
        the default one (:data:`DEFAULT_ARCHITECTURES`).

    """

    kind: str
    epsilon: float = math.nan
    delta: float = 0.0
    alpha: float | None = None
    adversary: str | None = None
    divergence: str | None = None
    value: float = math.nan
    text: str = ""
    source: Any = None
    architecture: str | None = None
    architecture_default: bool = False

    def claimed_delta(self, eps: float) -> float:
        """delta(eps) implied by an (epsilon, delta) claim: the (epsilon, delta) randomized response's.

        Every (epsilon, delta)-DP mechanism is dominated by the (epsilon, delta) randomized response
        (Kairouz, Oh, Viswanath 2015, Theorem 2.1), so its hockey-stick curve bounds theirs:
        delta + (1 - delta) (max(0, e^epsilon - e^eps) + max(0, 1 - e^(epsilon + eps))) /
        (1 + e^epsilon). The second term is 0 for eps >= -epsilon (every grid of an audit).

        A ``dpsgd:`` claim is the accountant's whole curve: the run claims (eps, delta(eps))-DP at
        every eps, so the smaller of the two is claimed.

        References:
          Kairouz, Oh, Viswanath 2015, "The composition theorem for differential privacy".

        """
        implied = rr_delta(self.epsilon, self.delta, eps)
        if hasattr(self.source, "delta_at"):
            return min(implied, self.source.delta_at(eps))
        return implied


def rr_delta(epsilon: float, delta: float, eps: float) -> float:
    """E_{e^eps} of the (epsilon, delta) randomized response: the tight curve of an (epsilon, delta) claim.

    The pair is P = (delta, (1 - delta) e^epsilon / (1 + e^epsilon), (1 - delta) / (1 + e^epsilon), 0)
    and Q = P reversed; its hockey-stick divergence at gamma = e^eps, (1 - delta) times
    (max(0, e^epsilon - e^eps) + max(0, 1 - e^(epsilon + eps))) / (1 + e^epsilon) above delta, is
    computed with both terms divided by e^epsilon, so that a large epsilon does not overflow.
    """
    first = -math.expm1(eps - epsilon) / (1.0 + math.exp(-epsilon)) if eps < epsilon else 0.0
    second = (
        (math.exp(-epsilon) - math.exp(eps)) / (math.exp(-epsilon) + 1.0) if eps < -epsilon else 0.0
    )
    return delta + (1.0 - delta) * (first + second)


def _num(text: str, name: str, claim: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not math.isfinite(x):
        raise InvalidParameterError(f"claim={claim!r} is invalid: {name}={text!r} must be a number")
    return x


def parse_claim(text: str) -> Claim:
    """A claim from its text: one of the forms below.

    ``pure:EPS``, ``approx:EPS:DELTA``, ``renyi:ALPHA:EPS``, ``capacity:CLASS:DIV[:ALPHA]:VALUE`` or
    ``dpsgd:noise=S,rate=Q,steps=T,delta=D[,sampling=...][,relation=...][,accountant=...]``. A
    ``dpsgd:`` claim is the approximate claim (epsilon, delta) the run's accountant gives
    (:mod:`cbdp_jax._src.accounting`, dp_accounting's PLD accountant by default, under the
    add-remove relation unless it names another). A capacity claim's CLASS names the architecture
    audited, ``mlp(64x3)`` (width x depth), ``poly(3)`` (degree) or ``linear``; a family alone
    (``mlp``) is its default architecture (:data:`DEFAULT_ARCHITECTURES`), which the result states.

    Raises:
      InvalidParameterError: Naming ``claim``, the forms allowed and the part that is out of range.

    """
    forms = (
        "pure:EPS, approx:EPS:DELTA, renyi:ALPHA:EPS, capacity:CLASS:kl:VALUE (CLASS e.g. "
        "mlp(64x3)) or dpsgd:noise=S,rate=Q,steps=T,delta=D"
    )
    parts = str(text).split(":")
    kind = parts[0]
    if kind not in CLAIM_KINDS:
        raise InvalidParameterError(f"claim={text!r} is invalid: must be {forms}")
    if kind == "dpsgd":
        from cbdp_jax._src.accounting import parse_dpsgd

        run = parse_dpsgd(str(text))
        return Claim("approx", run.epsilon, run.delta, text=str(text), source=run)
    sizes = {"pure": (2,), "approx": (3,), "renyi": (3,), "capacity": (4, 5)}
    if len(parts) not in sizes[kind]:
        raise InvalidParameterError(f"claim={text!r} is invalid: must be {forms}")
    if kind == "pure":
        eps = _num(parts[1], "EPS", text)
        if eps < 0:
            raise InvalidParameterError(f"claim={text!r} is invalid: EPS must be >= 0")
        return Claim("pure", eps, 0.0, text=text)
    if kind == "approx":
        eps, delta = _num(parts[1], "EPS", text), _num(parts[2], "DELTA", text)
        if eps < 0 or not 0 <= delta < 1:
            raise InvalidParameterError(
                f"claim={text!r} is invalid: EPS must be >= 0 and DELTA in [0, 1)"
            )
        return Claim("approx", eps, delta, text=text)
    if kind == "renyi":
        alpha, eps = _num(parts[1], "ALPHA", text), _num(parts[2], "EPS", text)
        if alpha <= 1 or eps < 0:
            raise InvalidParameterError(
                f"claim={text!r} is invalid: ALPHA must be > 1 and EPS >= 0"
            )
        return Claim("renyi", eps, alpha=alpha, text=text)
    family, arch, defaulted = parse_architecture(parts[1], text)
    divergence = parts[2]
    check_choice("claim divergence", divergence, ("kl", "renyi"))
    alpha = _num(parts[3], "ALPHA", text) if len(parts) == 5 else None
    if (divergence == "renyi") != (alpha is not None) or (alpha is not None and alpha <= 1):
        raise InvalidParameterError(
            f"claim={text!r} is invalid: renyi needs capacity:CLASS:renyi:ALPHA:VALUE, ALPHA > 1"
        )
    return Claim(
        "capacity", alpha=alpha, adversary=family, divergence=divergence,
        value=_num(parts[-1], "VALUE", text), text=text, architecture=arch,
        architecture_default=defaulted,
    )  # fmt: skip


# A capacity claim's class: the family and its architecture (the default when only the family is named)
DEFAULT_ARCHITECTURES = {
    "linear": "linear",
    "poly": "poly(3)",
    "mlp": "mlp(32x2)",
    "bounded-mlp": "bounded-mlp(32x2)",
}
_ARCH = re.compile(r"^(linear|poly|mlp|bounded-mlp)(?:\((?:(\d+)x(\d+)|(\d+))\))?$")


def parse_architecture(name: str, claim: str = "") -> tuple[str, str, bool]:
    """``'mlp(64x3)'`` -> ``('mlp', 'mlp(64x3)', False)``; ``'mlp'`` -> ``('mlp', 'mlp(32x2)', True)``.

    ``mlp(WxD)`` and ``bounded-mlp(WxD)`` are width W and depth D; ``poly(K)`` is degree K.

    Raises:
      InvalidParameterError: For an unknown family or an architecture that does not fit it.

    """
    m = _ARCH.match(str(name).strip())
    families = tuple(DEFAULT_ARCHITECTURES)
    if m is None:
        family = str(name).split("(")[0]
        check_choice("claim class", family, families)
        raise InvalidParameterError(
            f"claim={claim!r} is invalid: class {name!r} must be linear, poly or poly(K), mlp or "
            "mlp(WIDTHxDEPTH), bounded-mlp or bounded-mlp(WIDTHxDEPTH), e.g. mlp(64x3)"
        )
    family, width, depth, degree = m.groups()
    if width is None and degree is None:
        return family, DEFAULT_ARCHITECTURES[family], family != "linear"
    fits = (family in ("mlp", "bounded-mlp") and width is not None) or (
        family == "poly" and degree is not None
    )
    sizes = [int(v) for v in (width, depth, degree) if v is not None]
    if not fits or min(sizes) < 1:
        raise InvalidParameterError(
            f"claim={claim!r} is invalid: class {name!r}: mlp and bounded-mlp take (WIDTHxDEPTH), "
            "poly takes (DEGREE), linear takes none; every size >= 1"
        )
    return family, f"{family}({width}x{depth})" if degree is None else f"poly({degree})", False


def architecture_kwargs(architecture: str) -> dict:
    """The estimator's keyword arguments for a parsed architecture (``'mlp(64x3)'``, ``'poly(3)'``)."""
    family, _, _ = parse_architecture(architecture)
    m = _ARCH.match(architecture)
    _, width, depth, degree = m.groups()
    if family == "linear":
        return {"adversary": "linear"}
    if family == "poly":
        return {"adversary": "poly", "degree": int(degree or 3)}
    out = {"adversary": "mlp", "width": int(width or 32), "depth": int(depth or 2)}
    return out | ({"bound": 2.0} if family == "bounded-mlp" else {})


@dataclasses.dataclass(frozen=True, kw_only=True)
class DatasetSpace:
    """The datasets to search: arrays of ``shape`` with entries in [low, high].

    Attributes:
      shape: The dataset's shape; axis 0 indexes records.
      low: The smallest entry.
      high: The largest entry.
      integer: Entries are integers.
      relation: ``'replace-one'`` (one record differs), ``'zero-out'`` (one record replaced by zeros,
        dp_accounting's ``REPLACE_SPECIAL``) or ``'linf'`` (query-answer vectors: every entry moves
        by at most ``radius``).
      radius: The l-infinity radius for ``'linf'``.

    """

    shape: tuple[int, ...]
    low: float = 0.0
    high: float = 1.0
    integer: bool = False
    relation: str = "replace-one"
    radius: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(s) for s in np.atleast_1d(self.shape)))
        if not self.shape or min(self.shape) < 1:
            raise InvalidParameterError(f"shape={self.shape!r} is invalid: must be positive sizes")
        if not self.high > self.low:
            raise InvalidParameterError(f"high={self.high!r} is invalid: must exceed low")
        check_choice("relation", self.relation, RELATIONS)

    def _value(self, rng: np.random.Generator, size) -> np.ndarray:
        corner = rng.random(size) < 0.5
        x = np.where(
            corner, rng.choice([self.low, self.high], size), rng.uniform(self.low, self.high, size)
        )
        return np.round(x) if self.integer else x

    def neighbour(self, rng: np.random.Generator, d: np.ndarray) -> np.ndarray:
        """A random neighbour of ``d`` under the relation."""
        d2 = d.copy()
        if self.relation == "linf":
            if (
                rng.random() < 0.5
            ):  # the farthest neighbour: every entry moves by radius towards the middle
                step = np.where(d < 0.5 * (self.low + self.high), self.radius, -self.radius)
            else:
                step = self._value(rng, d.shape) - d
            d2 = np.clip(d + np.clip(step, -self.radius, self.radius), self.low, self.high)
            return np.round(d2) if self.integer else d2
        i = rng.integers(d.shape[0])
        if self.relation == "zero-out":
            d2[i] = 0.0
        elif rng.random() < 0.5:  # the farthest record: every entry to the opposite end
            d2[i] = np.where(d[i] > 0.5 * (self.low + self.high), self.low, self.high)
        else:
            d2[i] = self._value(rng, d.shape[1:])
        return d2

    def random_pair(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """A random dataset and a random neighbour of it."""
        d = self._value(rng, self.shape)
        return d, self.neighbour(rng, d)

    def mutate(self, rng: np.random.Generator, pair) -> tuple[np.ndarray, np.ndarray]:
        """A nearby pair: one record (or entry) moved in both datasets, or a new neighbour."""
        d, d2 = (np.asarray(x, np.float64).copy() for x in pair)
        if rng.random() < 0.5:
            return d, self.neighbour(rng, d)
        i = rng.integers(d.shape[0])
        v = self._value(rng, d.shape[1:])
        if self.relation == "linf":
            delta = d2[i] - d[i]
            if np.all(np.abs(delta) == self.radius):  # keep a farthest pair farthest
                delta = np.where(v < 0.5 * (self.low + self.high), self.radius, -self.radius)
            d[i], d2[i] = v, np.clip(v + delta, self.low, self.high)
        elif np.all(d[i] == d2[i]):
            d[i] = d2[i] = v
        else:
            d[i] = v
        return d, d2


@dataclasses.dataclass(frozen=True, kw_only=True)
class AuditConfig:
    """Budgets and levels of an audit.

    Attributes:
      samples: Certification samples per side per certified pair (fresh; never used in screening).
      train_fraction: Share of them that fits the critics; the rest is held out for the bound.
      screen_samples: Samples per side for each screened candidate pair.
      random_pairs: Random candidates drawn from the dataset space.
      local_steps: Local-search moves from the best candidate.
      classes: Critic classes certified (hockey-stick: linear, poly, mlp, histogram; Renyi and capacity
        claims: linear, poly, mlp, bounded-mlp).
      eps_grid: Multiples of the claimed eps at which a pure / approximate claim is checked.
      confidence: Family-wise level of the certified bounds.
      violation_size: The size of violation for which "samples needed" is reported.
      estimator_steps: Training steps of the estimator for Renyi and capacity claims.
      gradient_steps: Gradient-ascent steps on the datasets after the local search, for mechanisms
        that trace under jit and are differentiable in the dataset (0: off).
      tail_bounds: Hockey-stick audits only. Indicator critics (half-spaces, histograms) also get
        exact binomial bounds on their set's two probabilities (the better of those and the betting
        bound, the level split between them in advance), and each direction gets one more critic,
        the half-space chosen on training samples to refute the largest eps at the claim's delta
        (:func:`~cbdp_jax._src.hockey_stick.fit_tail`; two more members of the family). This is
        what makes eps at a small delta certifiable (docs/theory/training_audit.md, section 8).
      feature_groups: Hockey-stick audits of a mechanism whose samples name feature groups
        (:class:`~cbdp_jax._src.hockey_stick.FeatureGroup`, e.g. a training run's score and
        statistics of its release): the names of the groups certified, in one family (None: all
        the mechanism names). A mechanism without groups certifies its whole output.

    """

    samples: int = 1_000_000
    train_fraction: float = 0.3
    screen_samples: int = 20_000
    random_pairs: int = 12
    local_steps: int = 12
    classes: tuple[str, ...] = ("linear", "poly", "mlp", "histogram")
    eps_grid: tuple[float, ...] = (0.5, 1.0, 1.5)
    confidence: float = 0.95
    violation_size: float = 0.01
    estimator_steps: int = 600
    gradient_steps: int = 0
    tail_bounds: bool = False
    feature_groups: tuple[str, ...] | None = None

    def __post_init__(self):
        check_int_at_least("samples", self.samples, 100)
        check_int_at_least("screen_samples", self.screen_samples, 100)
        check_in_range(
            "train_fraction", self.train_fraction, 0.0, 1.0, low_open=True, high_open=True
        )
        check_in_range("confidence", self.confidence, 0.0, 1.0, low_open=True, high_open=True)
        check_int_at_least("gradient_steps", self.gradient_steps, 0)
        if self.feature_groups is not None:
            object.__setattr__(self, "feature_groups", tuple(self.feature_groups))


class Row(NamedTuple):
    """One certified bound: class, direction, grid point, the claim there and the bound.

    ``guarantee`` is the bound's kind (``'finite-sample'`` or ``'asymptotic'``); ``note`` says why a
    row certifies nothing (a refused bound, or a bound not on the claimed class), else is empty.
    For an indicator critic h = 1_S certified with exact binomial bounds (``AuditConfig.tail_bounds``)
    ``p_lower`` <= P(S) and ``q_upper`` >= Q(S) hold together with ``lower_bound``; else NaN.
    """

    critic: str
    direction: str
    grid: float
    claimed: float
    estimate: float
    lower_bound: float
    std: float
    violation: bool
    guarantee: str = "finite-sample"
    note: str = ""
    p_lower: float = math.nan
    q_upper: float = math.nan


class EmpiricalEpsilon(NamedTuple):
    """What the certified hockey-stick curve refutes (the number ML auditing papers report).

    For every grid point eps_i the audit certifies (family-wise) a lower bound L_i on
    delta(eps_i) = E_{e^eps_i}(P || Q). An (eps, delta) claim implies delta(eps_i) <= delta +
    (1 - delta) max(0, e^eps - e^eps_i) / (1 + e^eps) (the randomized response's curve,
    :meth:`Claim.claimed_delta`), so it is refuted when some L_i exceeds that: solving for e^eps,
    every eps below ``epsilon = max_i log((L_i - delta + (1 - delta) e^eps_i) / (1 - L_i))`` (over i
    with L_i > delta) is refuted at the audit's level. A mu-GDP claim implies delta(eps) <= Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2), which
    grows with mu: every mu below ``gdp_mu`` is refuted. A row of an indicator critic 1_S with exact
    bounds P(S) >= p_lower and Q(S) <= q_upper (``AuditConfig.tail_bounds``) refutes directly every
    eps below the larger of log((p_lower - delta) / q_upper) and log((1 - delta - q_upper) /
    (1 - p_lower)) (the claim gives P(S) <= e^eps Q(S) + delta and, for the complement in the other
    direction, 1 - Q(S) <= e^eps (1 - P(S)) + delta: the randomized response's trade-off) and every
    mu below Phi^-1(p_lower) - Phi^-1(q_upper); ``epsilon`` and ``gdp_mu`` are the largest of all.

    Attributes:
      delta: The delta of the (eps, delta) claims considered (the claim's own; 0 for a pure claim).
      epsilon: The largest refuted eps (0 when none is refuted).
      gdp_mu: The largest refuted GDP mu (0 when none is).
      curve: ``(eps_i, L_i)`` of the certified curve (the best class and direction at each point).
      confidence: The family-wise level at which they are refuted.

    References:
      Nasr et al. 2023, "Tight auditing of differentially private machine learning"; Dong, Roth, Su
      2022, "Gaussian differential privacy" (the GDP trade-off curve, Corollary 2.13); Kairouz, Oh,
      Viswanath 2015, "The composition theorem for differential privacy" (Theorem 2.1).

    """

    delta: float
    epsilon: float
    gdp_mu: float
    curve: tuple[tuple[float, float], ...]
    confidence: float

    def to_dict(self) -> dict:
        """A JSON-ready dict."""
        return {
            "delta": self.delta,
            "epsilon": self.epsilon,
            "gdp_mu": self.gdp_mu,
            "confidence": self.confidence,
            "curve": [{"epsilon": e, "lower_bound": b} for e, b in self.curve],
        }


def gdp_delta(mu: float, eps: float) -> float:
    """delta(eps) of mu-GDP: Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Dong, Roth, Su, Cor. 2.13).

    Computed with log-CDFs so that large eps does not overflow e^eps.
    """
    from scipy.special import log_ndtr

    if mu <= 0:
        return 0.0
    a = log_ndtr(-eps / mu + mu / 2.0)
    b = eps + log_ndtr(-eps / mu - mu / 2.0)
    return float(math.exp(a) * -math.expm1(b - a)) if b < a else 0.0


def _refuted_mu(eps: float, lower: float) -> float:
    """The largest mu whose GDP delta at ``eps`` is below ``lower`` (0 if none): bisection on mu."""
    if lower <= 0.0:
        return 0.0
    if lower >= 1.0:
        return math.inf
    lo, hi = 0.0, 1.0
    while gdp_delta(hi, eps) < lower:
        hi *= 2.0
        if hi > 1e3:
            return math.inf
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gdp_delta(mid, eps) < lower else (lo, mid)
    return lo


def empirical_epsilon(rows, delta: float, confidence: float) -> EmpiricalEpsilon:
    """The largest eps (at ``delta``) and GDP mu that the certified rows refute (:class:`EmpiricalEpsilon`).

    Only rows of a hockey-stick audit (grid = epsilon) are meaningful here; every row is one member
    of the audit's Bonferroni family, so the refutations hold together at ``confidence``.
    """
    best: dict[float, float] = {}
    for r in rows:
        if math.isfinite(r.lower_bound):
            best[r.grid] = max(best.get(r.grid, -math.inf), r.lower_bound)
    curve = tuple(sorted(best.items()))
    eps_hat, mu_hat = 0.0, 0.0
    for eps_i, low in curve:
        eps_hat = max(eps_hat, refuted_epsilon(eps_i, low, delta))
        mu_hat = max(mu_hat, _refuted_mu(eps_i, low))
    for r in rows:  # a set's two exact bounds refute directly: P(S) <= e^eps Q(S) + delta
        if math.isfinite(r.p_lower) and math.isfinite(r.q_upper):
            eps_hat = max(eps_hat, hs.tail_epsilon(r.p_lower, r.q_upper, delta))
            mu_hat = max(mu_hat, _tradeoff_mu(r.p_lower, r.q_upper))
    return EmpiricalEpsilon(float(delta), eps_hat, mu_hat, curve, confidence)


def refuted_epsilon(eps_i: float, lower: float, delta: float) -> float:
    """The largest eps whose (eps, delta) claim a certified E_{e^eps_i} >= ``lower`` refutes (0 if none).

    The claim allows delta + (1 - delta) (e^eps - e^eps_i) / (1 + e^eps) at eps_i (:func:`rr_delta`),
    which grows with eps; ``lower`` exceeds it exactly when e^eps < (lower - delta + (1 - delta)
    e^eps_i) / (1 - lower). Nothing is refuted when ``lower`` does not refute even eps = 0.
    """
    if not lower > rr_delta(0.0, delta, eps_i):
        return 0.0
    if lower >= 1.0:
        return math.inf
    return max(0.0, math.log((lower - delta + (1.0 - delta) * math.exp(eps_i)) / (1.0 - lower)))


def _tradeoff_mu(p_lower: float, q_upper: float) -> float:
    """The largest GDP mu refuted by a test with power >= p_lower at size <= q_upper (0 if none).

    mu-GDP bounds every test's power by Phi(Phi^-1(size) + mu) (Dong, Roth, Su 2022, eq. (2.2)), so
    every mu below Phi^-1(p_lower) - Phi^-1(q_upper) is refuted.
    """
    from scipy.special import ndtri

    if not (0.0 < p_lower and 0.0 < q_upper < 1.0):
        return 0.0
    return max(0.0, float(ndtri(min(p_lower, 1.0)) - ndtri(q_upper)))


class ViolationPoint(NamedTuple):
    """Where a certified violation is: the grid point, what the samples certify there, what the claim allows.

    Attributes:
      grid: ``'epsilon'`` (a hockey-stick row: ``certified`` bounds delta(at)) or ``'alpha'`` (an
        estimator row: ``certified`` bounds the divergence).
      at: The grid point (eps, or the Renyi order alpha).
      certified: The certified lower bound there.
      claimed: What the claim allows there.
      critic: The critic (class) that certified it.
      direction: ``'P||Q'`` or ``'Q||P'``.
      guarantee: ``'finite-sample'`` or ``'asymptotic'``.

    """

    grid: str
    at: float
    certified: float
    claimed: float
    critic: str
    direction: str
    guarantee: str

    def describe(self, noun: str = "samples") -> str:
        """``'at eps 0.25 the runs certify delta >= 0.51, the claim allows 0.448'``."""
        if self.grid == "epsilon":
            return (
                f"at eps {self.at:.4g} the {noun} certify delta >= {self.certified:.4g}, the claim "
                f"allows {self.claimed:.4g}"
            )
        return (
            f"at alpha {self.at:.4g} the {noun} certify a divergence >= {self.certified:.4g}, the "
            f"claim allows {self.claimed:.4g}"
        )


class BlindSpot(NamedTuple):
    """What an audit could not see by construction (e.g. a threat that cannot see a kind of bug).

    Attributes:
      kind: A short tag (``'clip-not-binding'``, ``'unnoised-parameters'``, ``'batch-normalisation'``,
        ``'dataset-size'``).
      message: One sentence: what is not seen, why, and what would see it.

    """

    kind: str
    message: str


class Defect(NamedTuple):
    """A failed probe of what the accountant assumes of a DP step (e.g. noise reused across steps).

    A defect is found before any training, by a test at a stated level (or by an exact check), and
    means the claim's accountant does not describe the step: an audit that names one never ends in
    a plain "no violation" (docs/theory/training_audit.md, section 11).

    Attributes:
      kind: A short tag (``'noise-not-keyed'``, ``'noise-missing'``, ``'noise-not-fresh'``,
        ``'noise-dependent-coordinates'``, ``'noise-too-small'``, ``'noise-unchecked'``).
      message: One sentence: what the probe measured, and which assumption of the accountant fails.
      statistic: The test's statistic, as the message states it (NaN for an exact check).
      p_value: The bound on the test's p-value (0 for an exact check).
      level: The level it was compared with: the family-wise level split over the probes' tests.

    """

    kind: str
    message: str
    statistic: float = math.nan
    p_value: float = 0.0
    level: float = 0.0


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """The outcome of an audit (``to_dict`` for JSON).

    Attributes:
      mechanism: The mechanism's name.
      claim: The claim as written.
      violation: True only when some certified lower bound exceeds the claim.
      verdict: One line in words.
      pair: The certified pair ``(D, D')`` as lists.
      rows: Every certified bound (:class:`Row`).
      family_size: K, the Bonferroni family of the certification.
      confidence: The family-wise level.
      screened: The candidate pairs screened with their scores.
      samples: Certification samples per side.
      samples_needed: Held-out pairs a violation of ``violation_size`` would need (best row).
      seconds: Wall time.
      grid_name: ``'epsilon'`` (hockey-stick rows) or ``'alpha'`` (estimator rows).
      empirical: The empirical epsilon and GDP mu of a pure / approximate claim, else None.
      claimed: The claim as checked: its kind, epsilon and delta, and for a ``dpsgd:`` claim the run's
        parameters and the accountant that turned them into (epsilon, delta).
      violation_point: Where the violation is certified (:class:`ViolationPoint`), else None.
      guarantee: The kind of bound the verdict rests on: ``'finite-sample'`` or ``'asymptotic'``
        (then the verdict says so, with the assumption), ``'none'`` when no bound was certified.
      relation: The neighbouring relation of the pair audited, when known (training audits).
      blind_spots: What the audit could not see by construction (:class:`BlindSpot`).
      defects: What the step does that its claim's accountant does not assume (:class:`Defect`);
        a result with a defect and no violation is not a clean bill.

    """

    mechanism: str
    claim: str
    violation: bool
    verdict: str
    pair: tuple[Any, Any]
    rows: tuple[Row, ...]
    family_size: int
    confidence: float
    screened: tuple[dict, ...]
    samples: int
    samples_needed: float
    violation_size: float
    seconds: float
    grid_name: str = "epsilon"
    empirical: EmpiricalEpsilon | None = None
    claimed: dict | None = None
    violation_point: ViolationPoint | None = None
    guarantee: str = "finite-sample"
    relation: str | None = None
    blind_spots: tuple[BlindSpot, ...] = ()
    defects: tuple[Defect, ...] = ()

    def strongest(self) -> Row:
        """The row whose certified bound exceeds its claim by the most (or falls short least)."""
        return max(self.rows, key=lambda r: r.lower_bound - r.claimed)

    def to_dict(self) -> dict:
        """A JSON-ready dict (non-finite numbers as None)."""

        def clean(x):
            if isinstance(x, float):
                return x if math.isfinite(x) else None
            return x

        return {
            "mechanism": self.mechanism,
            "claim": self.claim,
            "violation": self.violation,
            "verdict": self.verdict,
            "pair": {"d": self.pair[0], "d_prime": self.pair[1]},
            "certified_bounds": [{k: clean(v) for k, v in r._asdict().items()} for r in self.rows],
            "grid": self.grid_name,
            "family_size": self.family_size,
            "confidence": self.confidence,
            "samples_per_side": self.samples,
            "screened": list(self.screened),
            "samples_needed": clean(float(self.samples_needed)),
            "violation_size": self.violation_size,
            "seconds": self.seconds,
            "empirical": None if self.empirical is None else self.empirical.to_dict(),
            "claimed": self.claimed,
            "violation_point": None
            if self.violation_point is None
            else {k: clean(v) for k, v in self.violation_point._asdict().items()},
            "guarantee": self.guarantee,
            "relation": self.relation,
            "blind_spots": [b._asdict() for b in self.blind_spots],
            "defects": [{k: clean(v) for k, v in d._asdict().items()} for d in self.defects],
        }


def screen_score(mech: AuditMechanism, key: jax.Array, pair, gamma: float, n: int) -> float:
    """Max over directions and cheap critics of (held-out E_gamma estimate) on n samples per side."""
    kp, kq = jax.random.split(key)
    xp, xq = mech.sample(kp, pair[0], n), mech.sample(kq, pair[1], n)
    half = n // 2
    best = -math.inf
    for a, b in ((xp, xq), (xq, xp)):
        for fit in (hs.fit_halfspace, hs.fit_histogram):
            c = fit(a[:half], b[:half], gamma)
            best = max(best, hs._empirical(c.fn(a[half:]), c.fn(b[half:]), gamma))
    return best


def search_pair(
    key: jax.Array,
    mech: AuditMechanism,
    gamma: float,
    config: AuditConfig,
    *,
    space: DatasetSpace | None = None,
    candidates: Iterable | None = None,
) -> tuple[tuple[np.ndarray, np.ndarray], list[dict]]:
    """Screens candidate pairs (user candidates, random, then local search) on screening samples.

    Returns:
      The best pair and every screened pair with its score (in the order screened).

    """
    rng = host_rng(key)
    keys = iter(jax.random.split(jax.random.fold_in(key, 1), 10_000))
    pool = [tuple(np.asarray(x, np.float64) for x in c) for c in (candidates or [])]
    if space is not None:
        pool += [space.random_pair(rng) for _ in range(config.random_pairs)]
    if not pool:
        raise InvalidParameterError(
            "pair=None is invalid: give --d and --d-prime, a dataset space or candidate pairs"
        )
    screened = []

    def score(pair) -> float:
        s = screen_score(mech, next(keys), pair, gamma, config.screen_samples)
        screened.append({"d": pair[0].tolist(), "d_prime": pair[1].tolist(), "score": s})
        return s

    scores = [score(p) for p in pool]
    best_i = int(np.argmax(scores))
    best, best_s = pool[best_i], scores[best_i]
    for _ in range(config.local_steps if space is not None else 0):
        cand = space.mutate(rng, best)
        s = score(cand)
        if s > best_s:
            best, best_s = cand, s
    if config.gradient_steps > 0 and space is not None and mech.runs_in_jax(best[0]):
        cand = gradient_pair(next(keys), mech.fn, best, gamma, space, steps=config.gradient_steps)
        s = score(cand)
        if s > best_s:
            best, best_s = cand, s
    return best, screened


def _project(space: DatasetSpace, d: np.ndarray, d2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Back into the space and the relation: clip, then keep only the most-changed record different."""
    d, d2 = (np.clip(x, space.low, space.high) for x in (d, d2))
    if space.relation == "linf":
        d2 = np.clip(d + np.clip(d2 - d, -space.radius, space.radius), space.low, space.high)
    else:
        gap = np.abs(d2 - d).reshape(d.shape[0], -1).sum(axis=1)
        i = int(np.argmax(gap))
        keep = d2[i].copy() if space.relation == "replace-one" else np.zeros_like(d2[i])
        d2 = d.copy()
        d2[i] = keep
    if space.integer:
        d, d2 = np.round(d), np.round(d2)
    return d, d2


def gradient_pair(
    key: jax.Array, fn: Callable, pair, gamma: float, space: DatasetSpace, *, steps: int = 20,
    n: int = 4096, learning_rate: float = 0.05,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Gradient ascent on (D, D') of mean h(M(D)) - gamma mean h(M(D')) for a differentiable JAX M.

    h = sigmoid((w . x - t) / s) is the half-space critic of the current pair, refitted every step,
    smoothed by the projection's spread s; the noise is reparameterised (the same keys at each step),
    so the gradient flows through the mechanism into the dataset. After each step the pair is projected
    back into the space and the neighbour relation. Mechanisms with zero gradient (argmax, thresholds)
    do not move.
    """
    import jax.numpy as jnp

    d, d2 = (np.asarray(x, np.float64) for x in pair)
    width = (space.high - space.low) * learning_rate
    for k in jax.random.split(key, steps):
        kp, kq = jax.random.split(k)
        xp = np.asarray(fn(kp, jnp.asarray(d, jnp.float32), n), np.float64).reshape(n, -1)
        xq = np.asarray(fn(kq, jnp.asarray(d2, jnp.float32), n), np.float64).reshape(n, -1)
        w_t, t = _critic_plane(xp, xq, gamma)
        spread = float(np.std(xp @ w_t)) + 1e-6

        def objective(a, b, w_t=w_t, t=t, spread=spread, kp=kp, kq=kq):
            hp = jax.nn.sigmoid((fn(kp, a, n).reshape(n, -1) @ w_t - t) / spread)
            hq = jax.nn.sigmoid((fn(kq, b, n).reshape(n, -1) @ w_t - t) / spread)
            return jnp.mean(hp) - gamma * jnp.mean(hq)

        ga, gb = jax.grad(objective, argnums=(0, 1))(
            jnp.asarray(d, jnp.float32), jnp.asarray(d2, jnp.float32)
        )
        step = lambda g: width * np.sign(np.asarray(g, np.float64))
        d, d2 = _project(space, d + step(ga), d2 + step(gb))
    return d, d2


def _critic_plane(xp: np.ndarray, xq: np.ndarray, gamma: float) -> tuple[np.ndarray, float]:
    """The half-space critic's (w, t) for the current samples (mean-difference direction if none)."""
    best = (-math.inf, hs._directions(xp, xq)[0], 0.0)
    for w in hs._directions(xp, xq):
        t, val = hs._best_threshold(xp @ w, xq @ w, gamma)
        if val > best[0] and math.isfinite(t):
            best = (val, w, t)
    return best[1], best[2]


def _hockey_rows(key, xp, xq, claim: Claim, config: AuditConfig,
                 groups: tuple = ()) -> tuple[list[Row], int]:  # fmt: skip
    """The certified rows of every feature group (the whole sample without groups), one family."""
    n = min(len(xp), len(xq))
    n_train = int(n * config.train_fraction)
    # 12 significant digits: a grid point eps * (e / eps) reads e, not 0.9999999999999999, in the JSON
    grid = (
        [float(f"{claim.epsilon * g:.12g}") for g in config.eps_grid]
        if claim.epsilon > 0
        else [0.0]
    )
    groups = tuple(groups) or (hs.FeatureGroup("score", lambda x: x),)
    plans = [_group_plan(g, grid, claim, config) for g in groups]
    family = sum(len(points) * len(classes) * 2 + tails for points, classes, tails in plans)
    rows = []
    for g_i, (group, plan) in enumerate(zip(groups, plans, strict=True)):
        k = key if g_i == 0 else jax.random.fold_in(key, 10_000 + g_i)
        rows += _group_rows(k, group, plan, xp[:n], xq[:n], n_train, claim, config, family)
    return rows, family


def _group_plan(group, grid: list[float], claim: Claim, config: AuditConfig):
    """A group's grid points, critic classes and tail rows (its share of the family)."""
    points = grid if group.grid else sorted({grid[0], claim.epsilon})
    classes = config.classes if group.classes is None else group.classes
    return points, classes, 2 if config.tail_bounds and group.tails else 0


def _group_rows(key, group, plan, xp, xq, n_train: int, claim: Claim, config: AuditConfig,
                family: int) -> list[Row]:  # fmt: skip
    """One group's rows: critics fitted on the training split, certified on the held-out split."""
    points, classes, tails = plan
    xp, xq = np.asarray(group.features(xp)), np.asarray(group.features(xq))
    if group.learned:  # a learned logit of the features, fitted on the training split only
        key, k_logit = jax.random.split(key)
        g, _ = hs.fit_logit(k_logit, xp[:n_train], xq[:n_train], "mlp", width=32, depth=2,
                            steps=_LEARNED_STEPS, batch=1024)  # fmt: skip
        xp, xq = g(xp)[:, None], g(xq)[:, None]
    prefix = "" if group.name == "score" else f"{group.name}:"
    n, rows = len(xp), []
    for i, eps in enumerate(points):
        for j, (name, a, b) in enumerate((("P||Q", xp, xq), ("Q||P", xq, xp))):
            for c_i, kind in enumerate(classes):
                k = jax.random.fold_in(key, 100 * i + 10 * j + c_i)
                critic = hs.fit_critic(k, kind, a[:n_train], b[:n_train], math.exp(eps))
                critic = critic._replace(label=prefix + critic.label)
                rows.append(
                    _row(critic, (a[n_train:n], b[n_train:n]), eps, name, claim, config, family)
                )
    # tail rows: the set refuting the largest eps at the claim's delta, certified at the claim's eps
    per_side = 1.0 - (1.0 - family_confidence(config.confidence, family)) / 2.0
    for name, a, b in (("P||Q", xp, xq), ("Q||P", xq, xp)) if tails else ():
        critic = hs.fit_tail(a[:n_train], b[:n_train], claim.delta, n - n_train, per_side)
        critic = critic._replace(label=prefix + critic.label)
        held = (a[n_train:n], b[n_train:n])
        rows.append(
            _row(critic, held, claim.epsilon, name, claim, config, family, betting_too=False)
        )
    return rows


_LEARNED_STEPS = 300  # Adam steps of a learned group's logit (batches of 1024 per side)


def _row(critic, held, eps: float, name: str, claim: Claim, config: AuditConfig, family: int,
         *, betting_too: bool = True) -> Row:  # fmt: skip
    """One certified row: the critic's held-out bound at gamma = e^eps against the claim there."""
    gamma, claimed = math.exp(eps), claim.claimed_delta(eps)
    a, b = held
    if config.tail_bounds and critic.indicator:
        res = hs.certify_indicator(
            critic.fn(a), critic.fn(b), gamma, confidence=config.confidence, family_size=family,
            betting_too=betting_too,
        )  # fmt: skip
    else:
        res = hs.certify(
            critic.fn(a), critic.fn(b), gamma, confidence=config.confidence, family_size=family
        )
    return Row(
        critic.label, name, eps, claimed, res.estimate, res.bound.value,
        res.std_error * math.sqrt(res.n), res.bound.value > claimed,
        p_lower=res.p_lower, q_upper=res.q_upper,
    )  # fmt: skip


_ESTIMATOR_CLASSES = {
    "linear": {"adversary": "linear"},
    "poly": {"adversary": "poly", "degree": 3},
    "mlp": {"adversary": "mlp", "width": 32, "depth": 2},
    "bounded-mlp": {"adversary": "mlp", "width": 32, "depth": 2, "bound": 2.0},
}


def _estimator_rows(key, xp, xq, claim: Claim, config: AuditConfig) -> tuple[list[Row], int]:
    from cbdp_jax._src.estimator import EstimatorConfig, estimate_from_samples

    if claim.kind == "capacity":
        classes, divergence, alphas = [claim.adversary], claim.divergence, [claim.alpha]
        # A bound on D^H of the claimed class itself: a bounded class's finite-sample bound; for an
        # unbounded class the asymptotic one (the finite-sample bound of B tanh(H / B) is on another
        # class), its assumption stated in the rows.
        guarantee = "class"
    else:
        classes = [c if c in _ESTIMATOR_CLASSES else "bounded-mlp" for c in config.classes]
        classes, divergence = list(dict.fromkeys(classes)), "renyi"
        alphas = sorted({a for a in (claim.alpha, 1.0 + (claim.alpha - 1.0) / 2) if a > 1.01})
        guarantee = "finite-sample"
    family = len(classes) * len(alphas) * 2
    est_config = EstimatorConfig(
        steps=config.estimator_steps, ensemble=2, batch_size=2048, guarantee=guarantee,
        family_size=family, confidence=config.confidence,
    )  # fmt: skip
    claimed = claim.value if claim.kind == "capacity" else claim.epsilon
    rows = []
    for i, alpha in enumerate(alphas):
        for j, (name, a, b) in enumerate((("P||Q", xp, xq), ("Q||P", xq, xp))):
            for c_i, cls in enumerate(classes):
                k = jax.random.fold_in(key, 100 * i + 10 * j + c_i)
                kwargs = (
                    architecture_kwargs(claim.architecture)
                    if claim.kind == "capacity"
                    else _ESTIMATOR_CLASSES[cls]
                )
                r = estimate_from_samples(
                    k, a, b, divergence=divergence, alpha=alpha, config=est_config, **kwargs
                )  # fmt: skip
                rows.append(_estimator_row(r, claim, name, alpha, claimed))
    return rows, family


def _estimator_row(r, claim: Claim, direction: str, alpha, claimed: float) -> Row:
    """One estimator result as a row; a capacity claim counts only a bound on its own class."""
    low, note = r.lower_bound, ""
    if not r.bound_reliable:
        low, note = -math.inf, f"bound refused: {r.refusal}"
    elif claim.kind == "capacity" and not r.bound_on_named_class:
        low, note = -math.inf, f"not counted: {r.bounds}"
    elif r.guarantee == "asymptotic":
        note = f"asymptotic bound; assumption: {r.assumption}"
    return Row(
        r.certified_class or r.adversary, direction, alpha if alpha else 1.0, claimed, r.estimate,
        low, r.std_error * math.sqrt(r.samples["test_p"]), low > claimed, r.guarantee, note,
    )  # fmt: skip


def _verdict(rows: list[Row], claim: Claim, family: int, config: AuditConfig, n_test: int,
             noun: str = "samples"):  # fmt: skip
    """(violation, text, samples needed, violation point, guarantee) of the certified rows."""
    level = f"{100 * config.confidence:g}%"
    excess = lambda r: r.lower_bound - r.claimed
    violating = [r for r in rows if r.violation]
    if violating:
        sure = [r for r in violating if r.guarantee != "asymptotic"]
        row = max(sure or violating, key=excess)
        grid = "alpha" if claim.kind in ("renyi", "capacity") else "epsilon"
        point = ViolationPoint(
            grid, row.grid, row.lower_bound, row.claimed, row.critic, row.direction, row.guarantee
        )
        text = (
            f"violation certified at {level}: {point.describe(noun)} ({row.critic} {row.direction})"
        )
        if row.guarantee == "asymptotic":
            text += f"; this rests on an asymptotic bound ({row.note})"
        return True, text, math.nan, point, row.guarantee
    best = max(rows, key=excess)
    # a violation of size v needs E_P h >= v, so the terms' spread is at least about sqrt(v)
    spread = max(best.std, math.sqrt(config.violation_size))
    needed = hs.samples_needed(config.violation_size, spread, config.confidence, family)
    if best.lower_bound > 0 and math.isfinite(best.lower_bound):  # as the table shows it
        strongest = f"{best.lower_bound:.4g} ({best.critic} {best.direction})"
    elif math.isfinite(best.lower_bound):
        strongest = "none (every certified lower bound is at or below 0)"
    else:
        strongest = "none (every bound refused or not on the claimed class)"
    guarantee = best.guarantee if math.isfinite(best.lower_bound) else "none"
    if guarantee == "asymptotic":
        strongest += ", an asymptotic bound"
    text = (
        f"no violation certified: the strongest certified bound is {strongest} against the claimed "
        f"{best.claimed:.4g}. What was shown: none of the {len(rows)} bounds of this audit exceeds "
        f"the claim at {100 * config.confidence:g}% (family-wise); this does not prove the claim (a "
        f"worse pair or a stronger critic may exist). Sensitivity: with {n_test} held-out samples "
        f"per side, a violation of about {_detectable(spread, n_test, config.confidence, family):.3g}"
        " above the claim would be certified about half the time"
    )
    return False, text, needed, None, guarantee


def _detectable(spread: float, n: int, confidence: float, family: int) -> float:
    """The violation whose expected bound just clears the claim: z * spread / sqrt(n) (even odds)."""
    from cbdp_jax._src.statistics.bounds import family_confidence, z_quantile

    z = z_quantile(family_confidence(confidence, family))
    return z * spread / math.sqrt(max(n, 1))


def audit(
    key: jax.Array,
    mechanism: AuditMechanism | str | Callable,
    claim: Claim | str,
    *,
    pair: tuple[Any, Any] | None = None,
    space: DatasetSpace | None = None,
    candidates: Iterable | None = None,
    config: AuditConfig = AuditConfig(),
    progress: Callable | None = None,
) -> AuditResult:
    """Audits ``claim`` for ``mechanism``: screens pairs, certifies the best on fresh samples.

    Args:
      key: A typed PRNG key; split into a screening key and a certification key (never reused).
      mechanism: An :class:`AuditMechanism`, ``'file.py:function'`` / ``'module:function'``, or a
        callable ``(key_or_rng, dataset, n) -> n outputs``.
      claim: A :class:`Claim` or its text (:func:`parse_claim`).
      pair: A given neighbouring pair ``(D, D')``; no search then.
      space: A :class:`DatasetSpace` to search when ``pair`` is None.
      candidates: Candidate pairs (e.g. the user's generator), screened with the space's.
      config: Budgets and levels.
      progress: Called with a :class:`~cbdp_jax._src.sharded_runs.Progress` counting the
        certification samples of D and D' (``total`` = 2 ``config.samples``): at 0 once the pair is
        chosen, then after each side's draw (a :class:`cbdp_jax._src.progress.Progress` bar takes it).

    Returns:
      An :class:`AuditResult`; ``violation`` is True only when a certified bound exceeds the claim.

    """
    check_key(key)
    start = time.perf_counter()
    mech = mechanism if isinstance(mechanism, AuditMechanism) else load_mechanism(mechanism)
    claim = claim if isinstance(claim, Claim) else parse_claim(claim)
    _check_memory(mech, pair, space, config)
    k_screen, k_cert, k_fit = jax.random.split(key, 3)
    screened: list[dict] = []
    if pair is None:
        eps = claim.epsilon if math.isfinite(claim.epsilon) else 1.0
        pair, screened = search_pair(
            k_screen, mech, math.exp(eps), config, space=space, candidates=candidates
        )
    d, d2 = (np.asarray(x) for x in pair)
    groups = _chosen_groups(mech, config)  # checked before any sample is drawn
    kp, kq = jax.random.split(k_cert)
    tell = _progress_teller(progress, 2 * config.samples)
    tell(0)
    xp = mech.sample(kp, d, config.samples)
    tell(config.samples)
    xq = mech.sample(kq, d2, config.samples)
    tell(2 * config.samples)
    # a run it could not check is never a pass: NaN or inf outputs refuse the audit
    refuse_non_finite(mech.name, xp, "D")
    refuse_non_finite(mech.name, xq, "D'")
    if claim.kind in ("pure", "approx"):
        rows, family = _hockey_rows(k_fit, xp, xq, claim, config, groups)
        grid_name = "epsilon"
    else:
        if groups:  # the estimator sees the first group (a mechanism's own score)
            xp, xq = groups[0].features(xp), groups[0].features(xq)
        rows, family = _estimator_rows(k_fit, xp, xq, claim, config)
        grid_name = "alpha"
    n_test = config.samples - int(config.samples * config.train_fraction)
    noun = getattr(mech, "sample_noun", "samples")
    violation, text, needed, point, guarantee = _verdict(rows, claim, family, config, n_test, noun)
    claimed = {"kind": claim.kind, "epsilon": claim.epsilon, "delta": claim.delta}
    if claim.kind == "capacity":
        claimed |= {"architecture": claim.architecture, "default": claim.architecture_default}
        default = " (the default architecture of class " + claim.adversary + ")"
        text = (
            f"capacity claim on {claim.architecture}"
            f"{default if claim.architecture_default else ''}: {text}"
        )
    if claim.source is not None:
        claimed["source"] = claim.source._asdict()
        text = (
            f"claim {claim.text} = ({claim.epsilon:.4g}, {claim.delta:g})-DP by the accountant "
            f"({claim.source.accountant}). {text}"
        )
    empirical = None
    if grid_name == "epsilon":
        empirical = empirical_epsilon(rows, claim.delta, config.confidence)
        text += (
            f". Empirical epsilon at delta = {claim.delta:g}: every eps below "
            f"{empirical.epsilon:.4g} is refuted (GDP: every mu below {empirical.gdp_mu:.4g})"
        )
    return AuditResult(
        mech.name, claim.text, violation, text, (d.tolist(), d2.tolist()), tuple(rows), family,
        config.confidence, tuple(screened), config.samples, finite_or(needed),
        config.violation_size, time.perf_counter() - start, grid_name, empirical,
        {k: finite_or(v) if isinstance(v, float) else v for k, v in claimed.items()}, point,
        guarantee,
    )  # fmt: skip


def _check_memory(mech, pair, space, config: AuditConfig) -> None:
    """The samples of one pair must fit in memory (one line naming the bytes, before any draw)."""
    from cbdp_jax._src import sizes

    dataset = pair[0] if pair is not None else np.zeros(space.shape) if space is not None else None
    # a training mechanism knows its width without tracing (tracing would trace the whole training)
    known = dataset is not None or hasattr(mech, "problem")
    dim = mech.output_dim(dataset) if known else 1
    noun = getattr(mech, "sample_noun", "samples")
    advice = ""
    if hasattr(mech, "problem") and dim > 1:  # a training's release: the score alone is one value
        advice = (
            f"use fewer {noun}, or audit the score alone (feature_groups=('score',); the command "
            "line's --critics score), which records one value a run"
        )
    sizes.check_memory_for_audit(config.samples, config.screen_samples, dim, noun, advice)


def _chosen_groups(mech, config: AuditConfig) -> tuple:
    """The mechanism's feature groups the config names (all of them by default; none: no groups)."""
    groups = tuple(getattr(mech, "feature_groups", ()) or ())
    if config.feature_groups is None or not groups:
        return groups
    known = {g.name: g for g in groups}
    for name in config.feature_groups:
        check_choice("feature_groups", name, tuple(known))
    return tuple(known[name] for name in config.feature_groups)


def _progress_teller(progress: Callable | None, total: int) -> Callable[[int], None]:
    """``tell(done)``: reports ``done`` of ``total`` samples to ``progress`` (nothing when None)."""
    from cbdp_jax._src.sharded_runs import Progress

    start = time.perf_counter()

    def tell(done: int) -> None:
        if progress is None:
            return
        seconds = time.perf_counter() - start
        eta = seconds * (total - done) / done if done else math.nan
        progress(Progress(done, total, seconds, eta))

    return tell
