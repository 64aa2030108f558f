"""f-divergences, their Fenchel conjugates and variational objectives.

For a convex f with f(1) = 0 the f-divergence has the variational (dual) form

    D_f(P, Q) = sup_h  E_P[h(x)] - E_Q[f*(h(x))],                         (docs/theory/divergences.md)

and restricting h to a class H gives the restricted divergence D_f^H <= D_f. This module provides, for
each divergence, f, its conjugate f* (returning +inf outside the conjugate's domain), and the objective
as a pure JAX function of an adversary's outputs on P-samples and Q-samples. It also provides the tighter,
scale-free forms of docs/theory/objectives.md (Donsker-Varadhan for KL; the scale-optimised Renyi form) and the
closed-form optimal constant / scale that turns a direction trained with them back into a member of the
plain f-form, which is what held-out evaluation must use.

References:
  Chaudhuri, Imola, Machanavajjhala, "Capacity Bounded Differential Privacy", NeurIPS 2019, eq. (1)-(3),
  Lemma 1 (KL with translation-invariant H) and Lemma 3 (the alpha-divergence conjugate).

"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from cbdp_jax._src.infra.validation import InvalidParameterError, check_alpha, check_choice

DIVERGENCE_NAMES = ("kl", "renyi", "alpha", "tv", "hellinger", "chi2", "js")
CONVENTIONS = ("abs", "nonneg")


@dataclasses.dataclass(frozen=True)
class Divergence:
    """One f-divergence: a static, hashable value (usable as a ``jax.jit`` static argument).

    The functions are methods; the order may be fixed here (``alpha``) or passed, possibly traced, to
    :meth:`conjugate` (one compiled program serves a grid of orders). Build one with
    :func:`get_divergence` or the constructors ``Divergence.kl()``, ``Divergence.renyi(alpha)``, ...

    Attributes:
      name: One of ``DIVERGENCE_NAMES``. ``'renyi'`` is the alpha-divergence reported on the Renyi scale.
      alpha: The order for ``'alpha'`` and ``'renyi'``, else None.
      convention: ``'abs'`` (the paper's: f extended to t < 0 by |t|, f* symmetric) or ``'nonneg'``
        (f on t >= 0, f*(s) = C_a max(s, 0)^A + const) for the alpha family; ``'abs'`` otherwise.

    References:
      docs/theory/divergences.md (the table of f and f*, the conventions, the Renyi map).

    """

    name: str
    alpha: float | None = None
    convention: str = "abs"

    def __post_init__(self):
        check_choice("divergence", self.name, DIVERGENCE_NAMES)
        check_choice("convention", self.convention, CONVENTIONS)
        if self.name in ("renyi", "alpha"):
            object.__setattr__(self, "alpha", check_alpha(self.alpha))
        elif self.alpha is not None:
            raise InvalidParameterError(
                f"alpha={self.alpha!r} is invalid: must be None for divergence {self.name!r} (only "
                "'renyi' and 'alpha' have an order)"
            )
        elif self.convention != "abs":
            object.__setattr__(self, "convention", "abs")

    @classmethod
    def kl(cls) -> Divergence:
        """The Kullback-Leibler divergence."""
        return cls("kl")

    @classmethod
    def renyi(cls, alpha: float, convention: str = "abs") -> Divergence:
        """The Renyi divergence of order ``alpha`` > 1 (through the alpha-divergence, paper eq. (3))."""
        return cls("renyi", alpha, convention)

    @classmethod
    def alpha_divergence(cls, alpha: float, convention: str = "abs") -> Divergence:
        """The alpha-divergence of order ``alpha`` > 1 (the paper's f)."""
        return cls("alpha", alpha, convention)

    def f(self, t: jax.Array) -> jax.Array:
        """The convex generator of the divergence, elementwise in t."""
        if self.name in ("renyi", "alpha"):
            a = self.alpha
            return (jnp.abs(t) ** a - 1.0) / (a * a - a)
        return _TABLE[self.name][0](t)

    def conjugate(self, s: ArrayLike, alpha: ArrayLike | None = None) -> jax.Array:
        """f*(s), elementwise; ``+inf`` outside the conjugate's domain.

        ``alpha`` overrides the stored order (an array, possibly traced); ignored by divergences
        without one.
        """
        if self.name in ("renyi", "alpha"):
            return alpha_conjugate(s, self.alpha if alpha is None else alpha, self.convention)
        return _TABLE[self.name][1](jnp.asarray(s))

    @property
    def conjugate_sup(self) -> float:
        """f*(s) is finite for s below this level (``inf`` if everywhere finite).

        For total variation the domain is the closed interval |s| <= 1/2.
        """
        if self.name in ("renyi", "alpha"):
            return math.inf
        return _TABLE[self.name][2]

    def conjugate_inf(self, alpha: ArrayLike | None = None):
        """inf_s f*(s), the level the conjugate never goes below (an array for a traced ``alpha``).

        0 for KL (exp(s - 1) as s -> -inf), 1/(alpha^2 - alpha) for the alpha family (at s = 0, either
        convention), -1/2 for TV, -1 for the squared Hellinger distance (s -> -inf) and chi^2 (s = -2),
        -log 2 for JS (s -> -inf). The tail check centres f*(h) here: the deviations f*(h) - inf f* of a
        power conjugate are then exactly C |h|^A, whose tail index Hill reads without the constant
        hiding it (docs/theory/bounds.md, "The check").
        """
        if self.name in ("renyi", "alpha"):
            a = self.alpha if alpha is None else alpha
            return 1.0 / (a * a - a)
        return _CONJUGATE_INF[self.name]

    def to_reported(self, value):
        """Maps a value of D_f to the reported scale: the Renyi map for ``'renyi'``, else identity.

        Increasing, so it maps lower bounds to lower bounds.
        """
        return renyi_from_alpha(value, self.alpha) if self.name == "renyi" else value

    def from_reported(self, value):
        """The inverse of :meth:`to_reported`."""
        return alpha_from_renyi(value, self.alpha) if self.name == "renyi" else value

    @property
    def label(self) -> str:
        """A short human-readable label, e.g. ``'Renyi(alpha=4)'``."""
        if self.name == "renyi":
            return f"Renyi(alpha={self.alpha:g})"
        if self.name == "alpha":
            return f"alpha-div(alpha={self.alpha:g})"
        return {"kl": "KL", "tv": "TV", "hellinger": "Hellinger^2", "chi2": "chi^2", "js": "JS"}[
            self.name
        ]


# --------------------------------------------------------------------------------------------------
# Generators and conjugates (docs/theory/divergences.md table)
# --------------------------------------------------------------------------------------------------


def _kl_f(t: jax.Array) -> jax.Array:
    return jax.scipy.special.xlogy(t, t)


def _kl_conjugate(s: jax.Array) -> jax.Array:
    return jnp.exp(s - 1.0)


def alpha_exponent(alpha: float) -> float:
    """A = alpha / (alpha - 1), the exponent of the alpha-divergence conjugate (in (1, inf))."""
    return alpha / (alpha - 1.0)


def alpha_conjugate_constant(alpha: float) -> float:
    """C_a = (alpha - 1)^A / alpha, with A = alpha / (alpha - 1) (paper Lemma 3; docs/theory/divergences.md)."""
    return math.exp(_log_alpha_conjugate_constant(alpha))


def _log_alpha_conjugate_constant(alpha):
    """The log of C_a: double precision for a Python float, elementwise for an array (traced orders)."""
    return alpha_exponent(alpha) * _log(alpha - 1.0) - _log(alpha)


def _log(x):
    """The log of a Python number in double precision (constants), of an array elementwise (traced)."""
    return math.log(x) if isinstance(x, (int, float)) else jnp.log(x)


def alpha_conjugate(s: ArrayLike, alpha: ArrayLike, convention: str = "abs") -> jax.Array:
    """f*(s) = C_a |s|^A + 1/(a^2 - a) of the alpha-divergence, A = a/(a-1), C_a = (a-1)^A / a.

    Paper Lemma 3 (docs/theory/divergences.md); with ``convention='nonneg'`` |s| becomes max(s, 0). ``alpha`` is
    a Python float (its constants are then formed in double precision) or an array, possibly traced, so
    that one compiled program serves a grid of orders. The product is formed as exp(log C_a + A log|s|):
    C_a alone underflows float32 for alpha near 1 (1e-202 at alpha = 1.01) while |s|^A overflows.
    """
    s = jnp.asarray(s)
    if not jnp.issubdtype(s.dtype, jnp.inexact):
        s = s.astype(jnp.result_type(float))
    big_a = alpha_exponent(alpha)
    log_c_a = _log_alpha_conjugate_constant(alpha)
    base = jnp.abs(s) if convention == "abs" else jnp.maximum(s, 0.0)
    positive = base > 0
    safe = jnp.where(positive, base, 1.0)
    power = jnp.where(positive, jnp.exp(log_c_a + big_a * jnp.log(safe)), 0.0)
    return (power + 1.0 / (alpha * alpha - alpha)).astype(s.dtype)


def renyi_from_alpha(value: ArrayLike, alpha: float) -> jax.Array:
    """Maps an alpha-divergence value to the Renyi scale: log(1 + alpha(alpha-1) D) / (alpha - 1).

    Paper eq. (3). Increasing in D; returns -inf where 1 + alpha(alpha-1) D <= 0 (a value so low that it
    certifies nothing) and +inf for D = +inf.
    """
    value = jnp.asarray(value)
    arg = alpha * (alpha - 1.0) * value
    safe = jnp.where(arg > -1.0, arg, 0.0)
    return jnp.where(arg > -1.0, jnp.log1p(safe) / (alpha - 1.0), -jnp.inf)


def alpha_from_renyi(value: ArrayLike, alpha: float) -> jax.Array:
    """The inverse of :func:`renyi_from_alpha`: expm1((alpha - 1) R) / (alpha (alpha - 1))."""
    return jnp.expm1((alpha - 1.0) * jnp.asarray(value)) / (alpha * (alpha - 1.0))


def _tv_f(t: jax.Array) -> jax.Array:
    return 0.5 * jnp.abs(t - 1.0)


def _tv_conjugate(s: jax.Array) -> jax.Array:
    return jnp.where(jnp.abs(s) <= 0.5, s, jnp.inf)


def _hellinger_f(t: jax.Array) -> jax.Array:
    return (jnp.sqrt(t) - 1.0) ** 2


def _hellinger_conjugate(s: jax.Array) -> jax.Array:
    ok = s < 1.0
    safe = jnp.where(ok, s, 0.0)
    return jnp.where(ok, safe / (1.0 - safe), jnp.inf)


def _chi2_f(t: jax.Array) -> jax.Array:
    return (t - 1.0) ** 2


def _chi2_conjugate(s: jax.Array) -> jax.Array:
    return s + 0.25 * s * s


def _js_f(t: jax.Array) -> jax.Array:
    return jax.scipy.special.xlogy(t, t) - jax.scipy.special.xlogy(1.0 + t, 0.5 * (1.0 + t))


def _js_conjugate(s: jax.Array) -> jax.Array:
    ok = s < math.log(2.0)
    safe = jnp.where(ok, s, 0.0)
    # -log(2 - e^s) = -log(2) - log1p(-e^s / 2), stable as s -> -inf.
    return jnp.where(ok, -math.log(2.0) - jnp.log1p(-0.5 * jnp.exp(safe)), jnp.inf)


def get_divergence(name: str, *, alpha: float | None = None, convention: str = "abs") -> Divergence:
    """Builds a :class:`Divergence` by name.

    Args:
      name: One of ``'kl'``, ``'renyi'``, ``'alpha'``, ``'tv'``, ``'hellinger'``, ``'chi2'``, ``'js'``.
      alpha: The order, required for ``'renyi'`` and ``'alpha'`` (a number > 1).
      convention: For the alpha family, ``'abs'`` (the paper's default) or ``'nonneg'``.

    Returns:
      The divergence.

    Raises:
      InvalidParameterError: For an unknown name or convention, or alpha <= 1 where alpha is needed.

    Examples:
      >>> import jax.numpy as jnp
      >>> div = get_divergence("kl")
      >>> float(div.conjugate(jnp.array(1.0)))
      1.0

    """
    return Divergence(name, alpha, convention)


_CONJUGATE_INF = {"kl": 0.0, "tv": -0.5, "hellinger": -1.0, "chi2": -1.0, "js": -math.log(2.0)}

_TABLE = {
    "kl": (_kl_f, _kl_conjugate, math.inf),
    "tv": (_tv_f, _tv_conjugate, 0.5),
    "hellinger": (_hellinger_f, _hellinger_conjugate, 1.0),
    "chi2": (_chi2_f, _chi2_conjugate, math.inf),
    "js": (_js_f, _js_conjugate, math.log(2.0)),
}


# --------------------------------------------------------------------------------------------------
# Objectives as functions of adversary outputs
# --------------------------------------------------------------------------------------------------


def masked_count(x: jax.Array, mask: jax.Array | None):
    """The number of entries of ``x`` ``[n]`` where ``mask`` holds (``n``, a Python int, for no mask)."""
    if mask is None:
        return x.shape[0]
    return jnp.sum(mask).astype(x.dtype)


def masked_mean(x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """``mean(x)`` over the entries where ``mask`` holds (all for None: exactly ``jnp.mean``).

    Padding rows (``mask`` False) add exact zeros to the sum, so one compiled program gives the same
    value for every padded length of a sample (the programs of the estimator pad their samples to
    buckets of rows).
    """
    if mask is None:
        return jnp.mean(x)
    return jnp.sum(jnp.where(mask, x, 0.0)) / masked_count(x, mask)


def masked_var(x: jax.Array, mask: jax.Array | None = None, ddof: int = 0) -> jax.Array:
    """``var(x, ddof=ddof)`` over the entries where ``mask`` holds (None: exactly ``jnp.var``)."""
    if mask is None:
        return jnp.var(x, ddof=ddof)
    centred = jnp.where(mask, x - masked_mean(x, mask), 0.0)
    return jnp.sum(centred * centred) / (masked_count(x, mask) - ddof)


def masked_max(x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """``max(x)`` over the entries where ``mask`` holds (-inf for none)."""
    return jnp.max(x) if mask is None else jnp.max(jnp.where(mask, x, -jnp.inf))


def masked_min(x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """``min(x)`` over the entries where ``mask`` holds (+inf for none)."""
    return jnp.min(x) if mask is None else jnp.min(jnp.where(mask, x, jnp.inf))


def masked_all(x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """``all(x)`` over the entries where ``mask`` holds."""
    return jnp.all(x) if mask is None else jnp.all(x | ~mask)


def masked_log_mean_exp(x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """:func:`log_mean_exp` of a sample over the entries where ``mask`` holds (not differentiated)."""
    if mask is None:
        return log_mean_exp(x)
    shift = masked_max(x, mask)
    shift = jnp.where(jnp.isfinite(shift), shift, 0.0)
    total = jnp.sum(jnp.where(mask, jnp.exp(x - shift), 0.0))
    return jnp.log(total) + shift - jnp.log(masked_count(x, mask))


def variational_objective(div: Divergence, h_p: ArrayLike, h_q: ArrayLike) -> jax.Array:
    """The plain f-form  mean(h(P-samples)) - mean(f*(h(Q-samples))).

    With independent samples this is an unbiased estimate of E_P[h] - E_Q[f*(h)] for a fixed h, and
    hence (in expectation) a lower bound on D_f^H for any h in H. It is -inf if some h_q lies outside
    the conjugate's domain.

    Args:
      div: The divergence.
      h_p: Adversary outputs on samples of P, shape ``[n]``.
      h_q: Adversary outputs on samples of Q, shape ``[m]``.

    Returns:
      A scalar on the f-divergence scale (apply ``div.to_reported`` for Renyi).

    """
    return jnp.mean(jnp.asarray(h_p)) - jnp.mean(div.conjugate(jnp.asarray(h_q)))


def log_mean_exp(x: ArrayLike, axis: int | None = None) -> jax.Array:
    """log(mean(exp(x))) computed with a max shift (no overflow in float32).

    Differentiable: the gradient is the softmax of ``x``, computed from the forward pass's ``exp`` (one
    exponential pass per evaluation, where autodiff of ``logsumexp`` takes two; this is the inner loop
    of every Donsker-Varadhan training step). Infinities behave as in ``jax.scipy.special.logsumexp``.
    """
    return _log_mean_exp(jnp.asarray(x), axis)


def _log_mean_exp_parts(x: jax.Array, axis: int | None):
    """The log mean exp over ``axis`` and the pieces its derivative reuses (shifted exps and their sum)."""
    shift = jnp.max(x, axis=axis, keepdims=True)
    shift = jax.lax.stop_gradient(jnp.where(jnp.isfinite(shift), shift, 0.0))
    weights = jnp.exp(x - shift)
    total = jnp.sum(weights, axis=axis)
    n = x.size if axis is None else x.shape[axis]
    out = jnp.log(total) + jnp.squeeze(shift, axis) - math.log(n)
    return out, weights, total


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _log_mean_exp(x: jax.Array, axis: int | None) -> jax.Array:
    return _log_mean_exp_parts(x, axis)[0]


@_log_mean_exp.defjvp
def _log_mean_exp_jvp(axis, primals, tangents):
    (x,), (dx,) = primals, tangents
    out, weights, total = _log_mean_exp_parts(x, axis)
    return out, jnp.sum(weights * dx, axis=axis) / total


def donsker_varadhan(h_p: ArrayLike, h_q: ArrayLike, masks=None) -> jax.Array:
    """The Donsker-Varadhan form  mean(h_p) - log mean(exp(h_q))  (docs/theory/objectives.md; paper Lemma 1).

    Equals the KL f-form at the optimal constant shift, so for translation-invariant H its supremum is
    KL^H. The log of a sample mean is biased upward; use it to train, not to report. ``masks``: the
    rows of ``(h_p, h_q)`` that are samples (padded samples; None: all).
    """
    if masks is None:
        return jnp.mean(jnp.asarray(h_p)) - log_mean_exp(h_q)
    return masked_mean(h_p, masks[0]) - masked_log_mean_exp(h_q, masks[1])


def kl_optimal_shift(h_q: ArrayLike, mask=None) -> jax.Array:
    """The constant c maximising the KL f-form of h + c: c = 1 - log E_Q[exp h]."""
    return 1.0 - masked_log_mean_exp(jnp.asarray(h_q), mask)


def _log_mean_abs_pow(h: jax.Array, power: float, convention: str, mask=None) -> jax.Array:
    base = jnp.abs(h) if convention == "abs" else jnp.maximum(h, 0.0)
    # log mean base^power via logsumexp of power * log(base); base == 0 contributes exp(-inf) = 0.
    safe = jnp.where(base > 0, base, 1.0)
    logs = jnp.where(base > 0, power * jnp.log(safe), -jnp.inf)
    return masked_log_mean_exp(logs, mask)


def renyi_scale_free(
    h_p: ArrayLike, h_q: ArrayLike, alpha: float, convention: str = "abs"
) -> jax.Array:
    """The scale-optimised Renyi form  A log mean(h_p) - log mean(|h_q|^A),  A = alpha / (alpha - 1).

    For a cone H, its supremum over h in H with E_P[h] > 0 is the restricted Renyi divergence
    (docs/theory/objectives.md). Returns -inf when mean(h_p) <= 0. Biased upward as a sample estimate: use it to
    train, then evaluate the f-form at the scale from :func:`alpha_optimal_scale`.

    Args:
      h_p: Outputs on P-samples, ``[n]``.
      h_q: Outputs on Q-samples, ``[m]``.
      alpha: The order, > 1.
      convention: ``'abs'`` or ``'nonneg'``.

    Returns:
      A scalar on the Renyi scale.

    """
    big_a = alpha_exponent(alpha)
    mean_p = jnp.mean(jnp.asarray(h_p))
    safe = jnp.where(mean_p > 0, mean_p, 1.0)
    log_m = _log_mean_abs_pow(jnp.asarray(h_q), big_a, convention)
    return jnp.where(mean_p > 0, big_a * jnp.log(safe) - log_m, -jnp.inf)


def alpha_optimal_scale(
    h_p: ArrayLike, h_q: ArrayLike, alpha: ArrayLike, convention: str = "abs", masks=None
) -> jax.Array:
    """The scale t > 0 maximising the alpha-divergence f-form of t * h (``alpha`` may be traced).

    Setting the derivative of t E_P[h] - C_a t^A E_Q[|h|^A] to zero gives
    t* = (E_P[h] / E_Q[|h|^A])^(alpha - 1) / (alpha - 1); at t* the f-form equals the scale-free form
    mapped back by :func:`alpha_from_renyi`. Computed in log space. Returns 0 if mean(h_p) <= 0.
    ``masks``: the rows of ``(h_p, h_q)`` that are samples (None: all).
    """
    mask_p, mask_q = (None, None) if masks is None else masks
    mean_p = masked_mean(jnp.asarray(h_p), mask_p)
    safe = jnp.where(mean_p > 0, mean_p, 1.0)
    log_m = _log_mean_abs_pow(jnp.asarray(h_q), alpha_exponent(alpha), convention, mask_q)
    log_t = (alpha - 1.0) * (jnp.log(safe) - log_m) - _log(alpha - 1.0)
    return jnp.where(mean_p > 0, jnp.exp(log_t), 0.0).astype(mean_p.dtype)
