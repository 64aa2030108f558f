"""Randomized mechanisms as frozen value objects with pure JAX samplers and exact log densities.

A mechanism M maps a dataset D to a random output in R^d (docs/theory/capacity_bounded_dp.md). Each mechanism here is a
frozen, hashable dataclass (so it can be a static argument of ``jax.jit``) whose docstring states its
exact output law and sensitivity, with

* ``dim``: the output dimension d;
* ``sample(key, dataset, n, *, dtype=None)``: ``n`` i.i.d. draws of M(D), shape ``[n, d]``; pure JAX, so
  it works under ``jax.jit``, ``jax.vmap`` and ``lax.scan`` with a traced key (``n`` is a static int);
* ``log_density(dataset, x)``: log of the density of M(D) at each row of ``x [n, d]`` where it is known
  (Lebesgue density; counting density for :class:`RandomizedResponse`), else ``NotImplementedError``.

Samples come out in float32 unless ``dtype`` asks otherwise; ``dtype=jnp.float64`` needs
``jax_enable_x64``. A privacy question is asked about a :class:`NeighbouringPair` (M, D, D'), and
:func:`canonical_pair` builds the paper's standard pair for each built-in mechanism (docs/theory/mechanisms.md):

=========================  ==========================  ==============================================
mechanism                  D                           D'
=========================  ==========================  ==============================================
Laplace, Gaussian          zeros(d)                    v (the sensitivity vector)
SubsampledGaussian         records [v] ('remove')      no records (shape [0, d]); swapped for 'add'
NonPrivateRelease          zeros(d)                    v (default all ones)
RandomizedResponse         category 0                  category 1
MatrixMechanism            count vector zeros(m)       e_0 (one record of type 0 added)
Mixture, PostProcessed     the component's D           the component's D'
JointRelease               tuple of components' D      tuple of components' D' (all components change)
=========================  ==========================  ==============================================

References:
  Chaudhuri, Imola, Machanavajjhala, "Capacity Bounded Differential Privacy", NeurIPS 2019, section 4
  (Thm 1 post-processing, Thm 2 convexity, Thms 3-4 composition) and section 5 (Laplace, Gaussian and
  matrix mechanisms, Lemma 2 non-private release, Thm 5).

"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from cbdp_jax._src import keys
from cbdp_jax._src.programs import persistent_jit
from cbdp_jax._src.validation import (
    InvalidParameterError,
    _fail,
    check_choice,
    check_in_range,
    check_int_at_least,
    check_positive,
    check_vector,
)

MECHANISM_NAMES = (
    "laplace",
    "gaussian",
    "randomized_response",
    "nonprivate",
    "subsampled_gaussian",
)

Dataset = Any  # a pytree of arrays or Python numbers; its meaning is stated by each mechanism
DTypeLike = Any


# --------------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------------


def _resolve_dtype(dtype: DTypeLike | None) -> np.dtype:
    """The floating dtype of the samples: float32 by default; float64 only with ``jax_enable_x64``."""
    if dtype is None:
        return np.dtype(np.float32)
    try:
        dt = np.dtype(dtype)
    except TypeError:
        _fail("dtype", dtype, "must be a floating dtype such as jnp.float32 or jnp.float64")
    if not jnp.issubdtype(dt, jnp.floating):
        _fail("dtype", dtype, "must be a floating dtype such as jnp.float32 or jnp.float64")
    if jax.dtypes.canonicalize_dtype(dt) != dt:
        _fail(
            "dtype",
            dtype,
            f"{dt} is not available",
            "enable it with jax.config.update('jax_enable_x64', True) or jax.enable_x64(True)",
        )
    return dt


def _check_n(n: Any) -> int:
    if isinstance(n, jax.core.Tracer):
        _fail("n", "<traced value>", "must be a static Python int >= 1 (it fixes the output shape)")
    return check_int_at_least("n", n, 1)


def _check_key(key: Any) -> None:
    if isinstance(key, (int, np.integer, float)):
        _fail("key", key, "must be a JAX PRNG key", "make one with jax.random.key(seed)")


def _as_float_tuple(name: str, value: Any, *, length: int | None = None) -> tuple[float, ...]:
    return tuple(float(v) for v in check_vector(name, value, length=length, positive=True))


def _as_matrix(name: str, value: Any) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        _fail(name, value, "must be a 2-D matrix of real numbers")
    if arr.ndim != 2 or arr.size == 0:
        _fail(name, f"<array of shape {arr.shape}>", "must be a non-empty 2-D matrix")
    if not np.all(np.isfinite(arr)):
        _fail(name, f"<array of shape {arr.shape}>", "every entry must be finite")
    return arr


def _matrix_tuple(arr: np.ndarray) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(float(v) for v in row) for row in arr)


def _answer_vector(
    dataset: Dataset, query: Callable | None, dim: int, dtype: np.dtype
) -> jax.Array:
    """The query answer ``[dim]`` (the dataset itself when ``query`` is None), cast to ``dtype``."""
    answer = dataset if query is None else query(dataset)
    try:
        answer = jnp.asarray(answer)
    except TypeError as exc:
        name = "dataset" if query is None else "query"
        raise InvalidParameterError(
            f"{name} must give a numeric query answer of shape ({dim},): {exc}"
        ) from exc
    if answer.ndim == 0 and dim == 1:
        answer = answer.reshape(1)
    if answer.shape != (dim,):
        name = "dataset" if query is None else "query(dataset)"
        _fail(
            name,
            f"<array of shape {answer.shape}>",
            f"the query answer must have shape ({dim},), one entry per sensitivity coordinate",
        )
    return answer.astype(dtype)


def _check_points(mechanism: Mechanism, x: ArrayLike) -> jax.Array:
    """Returns ``x`` as a floating ``[n, dim]`` array or raises naming ``x``."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.result_type(float))
    if x.ndim != 2 or x.shape[1] != mechanism.dim:
        _fail(
            "x",
            f"<array of shape {x.shape}>",
            f"must have shape [n, {mechanism.dim}] (points of R^d)",
        )
    return x


def _no_density(mechanism: Mechanism, why: str) -> NotImplementedError:
    return NotImplementedError(f"{mechanism.label} has no log_density: {why}")


def _fmt(values: tuple[float, ...]) -> str:
    return "(" + ", ".join(f"{v:g}" for v in values) + ")"


def _fmt_param(value: Any) -> str:
    """A noise parameter in a label: ``1`` for a float, the array or ``'traced'`` otherwise."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, jax.core.Tracer):
        return "traced"
    return np.array2string(np.asarray(value), precision=4, separator=", ")


def _check_scale(name: str, value: Any) -> Any:
    """A noise parameter, validated where it is concrete and passed through where it is traced.

    A Python or 0-d number becomes a float (finite, > 0). An array (a batch of parameters, e.g. for
    ``jax.vmap``) keeps its type and must be finite and > 0 everywhere. A tracer (the parameter inside a
    user's ``jit`` / ``vmap`` / ``grad``) cannot be checked and is kept as is.
    """
    if isinstance(value, jax.core.Tracer):
        return value
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return check_positive(name, value)  # raises, naming the parameter
    if arr.ndim == 0:
        return check_positive(name, float(arr))
    if not np.all(np.isfinite(arr) & (arr > 0)):
        _fail(name, value, "must be finite and > 0 in every entry")
    return value


def _is_array_tree(dataset: Dataset) -> bool:
    leaves = jax.tree_util.tree_leaves(dataset)
    return all(isinstance(x, (jax.Array, np.ndarray, np.generic, int, float, bool)) for x in leaves)


def _is_hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


@persistent_jit(static_argnames=("mechanism", "n", "dtype"))
def _compiled_sample(
    key: jax.Array, dataset: Dataset, *, mechanism: Mechanism, n: int, dtype: np.dtype
) -> jax.Array:
    return mechanism._sample(key, dataset, n, dtype)


# --------------------------------------------------------------------------------------------------
# The base class
# --------------------------------------------------------------------------------------------------


class Mechanism(abc.ABC):
    """A randomized mechanism D -> R^dim (the base of every mechanism in this module).

    Subclasses are frozen, keyword-only dataclasses: hashable value objects whose docstring states the
    exact output law. They implement ``dim`` (a field or a property), ``_sample`` and, where the law has a
    density, ``log_density``.

    Attributes:
      dim: The output dimension d; :meth:`sample` returns ``[n, d]``.
      family: A short name of the noise family (``'laplace'``, ``'gaussian'``, ...); ``'generic'`` here.

    """

    dim: int
    family: ClassVar[str] = "generic"

    @property
    def label(self) -> str:
        """A short human-readable description, e.g. ``'Laplace(eps=1, v=(1))'``."""
        return type(self).__name__

    def sample(
        self, key: jax.Array, dataset: Dataset, n: int, *, dtype: DTypeLike | None = None
    ) -> jax.Array:
        """Draws ``n`` independent outputs of the mechanism run on ``dataset``.

        Pure JAX: the same key gives bit-identical samples, and the call may sit inside ``jax.jit`` or
        ``lax.scan`` with a traced key and dataset (``n`` and ``dtype`` must be static), giving the same
        bits as an eager call. The sampler is compiled once per mechanism value, ``n`` and ``dtype``.

        Args:
          key: A JAX PRNG key (``jax.random.key(seed)``); it is split inside, never stored.
          dataset: The input; its form is stated by each mechanism.
          n: The number of samples, a static Python int >= 1.
          dtype: The floating dtype of the samples; None means float32. float64 needs
            ``jax_enable_x64``.

        Returns:
          The samples, shape ``[n, dim]``, in ``dtype``.

        Raises:
          InvalidParameterError: For a bad ``n``, ``dtype``, ``key`` or a dataset of the wrong shape.

        """
        _check_key(key)
        n = _check_n(n)
        dt = _resolve_dtype(dtype)
        self._check_dataset(dataset)
        # One jax.jit around _sample (the mechanism, n and dtype static) makes eager calls bit-identical
        # to calls inside the caller's jax.jit / lax.scan: XLA rounds fused arithmetic differently from
        # op-by-op execution. Each distinct mechanism value compiles once per (n, dtype).
        if _is_array_tree(dataset) and _is_hashable(self):
            return _compiled_sample(key, dataset, mechanism=self, n=n, dtype=dt)
        return self._sample(key, dataset, n, dt)

    def _check_dataset(self, dataset: Dataset) -> None:
        """Checks that need concrete values, run before tracing (shape checks happen in ``_sample``)."""
        del dataset

    @abc.abstractmethod
    def _sample(self, key: jax.Array, dataset: Dataset, n: int, dtype: np.dtype) -> jax.Array:
        """Draws ``[n, dim]`` samples in ``dtype`` (arguments already validated)."""

    def log_density(self, dataset: Dataset, x: ArrayLike) -> jax.Array:
        """The log density of the output law at each row of ``x``.

        Args:
          dataset: The input, as for :meth:`sample`.
          x: Points, shape ``[n, dim]``.

        Returns:
          ``[n]`` log densities (``-inf`` outside the support).

        Raises:
          NotImplementedError: If the law has no density (a point mass) or it is not implemented.

        """
        raise _no_density(self, "the output law has no known density")


# --------------------------------------------------------------------------------------------------
# Additive noise mechanisms
# --------------------------------------------------------------------------------------------------


class _AdditiveNoise(Mechanism):
    """f(D) + noise_scale * Z with Z i.i.d. standard noise per coordinate (Laplace and Gaussian).

    Subclasses are dataclasses with fields ``sensitivity`` and ``query`` and one positive scale
    parameter; they name it in ``_validate`` and provide ``noise_scale`` and ``_standard_noise``.
    """

    def _validate(self, scale_param: str) -> None:
        object.__setattr__(self, scale_param, _check_scale(scale_param, getattr(self, scale_param)))
        object.__setattr__(self, "sensitivity", _as_float_tuple("sensitivity", self.sensitivity))
        if self.query is not None and not callable(self.query):
            _fail("query", self.query, "must be None or a callable dataset -> [dim] answer")

    @property
    def dim(self) -> int:
        """The output dimension, ``len(sensitivity)``."""
        return len(self.sensitivity)

    def _standard_noise(self, key: jax.Array, shape: tuple[int, int], dtype: np.dtype) -> jax.Array:
        raise NotImplementedError

    def _sample(self, key: jax.Array, dataset: Dataset, n: int, dtype: np.dtype) -> jax.Array:
        centre = _answer_vector(dataset, self.query, self.dim, dtype)
        return centre[None, :] + self.noise_scale * self._standard_noise(key, (n, self.dim), dtype)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LaplaceMechanism(_AdditiveNoise):
    """The Laplace mechanism: the query answer plus i.i.d. Laplace noise on each coordinate.

    M(D) = f(D) + Z, Z_i i.i.d. Lap(0, b) with b = 1/epsilon, so the output density is

        p(x) = prod_i (epsilon / 2) exp(-epsilon |x_i - f(D)_i|).

    ``sensitivity`` is the vector v of per-coordinate global sensitivities, |f(D)_i - f(D')_i| <= v_i; it
    fixes ``dim = len(v)`` and the canonical neighbouring pair f(D) = 0, f(D') = v (paper section 5;
    docs/theory/mechanisms.md). With ||v||_1 <= 1 the mechanism is epsilon-DP.

    Attributes:
      epsilon: The privacy parameter, finite and > 0; the noise scale is ``1 / epsilon``.
      sensitivity: The sensitivity vector v, entries finite and >= 0 (a scalar means ``(v,)``).
      query: Optional callable ``dataset -> [dim]`` answer, written with ``jnp`` (it runs under
        ``jax.jit``; the dataset is then a pytree of arrays). When None (the default) the dataset passed
        to :meth:`sample` *is* the query answer f(D), shape ``[dim]`` (a scalar is accepted when
        dim = 1).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> mech = LaplaceMechanism(epsilon=1.0, sensitivity=(1.0, 2.0))
      >>> mech.sample(jax.random.key(0), jnp.zeros(2), 5).shape
      (5, 2)
      >>> mech.noise_scale, mech.family
      (1.0, 'laplace')

    References:
      Chaudhuri et al. (2019), section 5 "Laplace Mechanism" and Table 1.

    """

    epsilon: float
    sensitivity: tuple[float, ...] = (1.0,)
    query: Callable[[Dataset], ArrayLike] | None = None

    family: ClassVar[str] = "laplace"

    def __post_init__(self) -> None:
        self._validate("epsilon")

    @property
    def noise_scale(self) -> float:
        """The Laplace scale b = 1 / epsilon of each noise coordinate."""
        return 1.0 / self.epsilon

    @property
    def label(self) -> str:
        """E.g. ``'Laplace(eps=1, v=(1))'``."""
        return f"Laplace(eps={_fmt_param(self.epsilon)}, v={_fmt(self.sensitivity)})"

    def _standard_noise(self, key: jax.Array, shape: tuple[int, int], dtype: np.dtype) -> jax.Array:
        return jax.random.laplace(key, shape, dtype=dtype)

    def log_density(self, dataset: Dataset, x: ArrayLike) -> jax.Array:
        """sum_i log(epsilon / 2) - epsilon |x_i - f(D)_i|, shape ``[n]``; see the class docstring."""
        x = _check_points(self, x)
        centre = _answer_vector(dataset, self.query, self.dim, x.dtype)
        eps = self.epsilon
        return jnp.sum(jnp.log(eps / 2.0) - eps * jnp.abs(x - centre[None, :]), axis=1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GaussianMechanism(_AdditiveNoise):
    """The Gaussian mechanism: the query answer plus N(0, sigma^2 I) noise.

    M(D) = f(D) + Z, Z ~ N(0, sigma^2 I_d), so the output density is

        p(x) = prod_i (2 pi sigma^2)^(-1/2) exp(-(x_i - f(D)_i)^2 / (2 sigma^2)).

    ``sensitivity`` is the vector v of per-coordinate sensitivities; it fixes ``dim = len(v)`` and the
    canonical pair f(D) = 0, f(D') = v (paper section 5; docs/theory/mechanisms.md).

    Attributes:
      sigma: The noise standard deviation, finite and > 0.
      sensitivity: The sensitivity vector v, entries finite and >= 0.
      query: Optional callable ``dataset -> [dim]``; None means the dataset is the answer f(D) itself.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> mech = GaussianMechanism(sigma=2.0)
      >>> mech.sample(jax.random.key(0), 0.0, 3).shape
      (3, 1)

    References:
      Chaudhuri et al. (2019), section 5 "Gaussian Mechanism" and Table 1.

    """

    sigma: float
    sensitivity: tuple[float, ...] = (1.0,)
    query: Callable[[Dataset], ArrayLike] | None = None

    family: ClassVar[str] = "gaussian"

    def __post_init__(self) -> None:
        self._validate("sigma")

    @property
    def noise_scale(self) -> float:
        """The noise standard deviation sigma."""
        return self.sigma

    @property
    def label(self) -> str:
        """E.g. ``'Gaussian(sigma=1, v=(1))'``."""
        return f"Gaussian(sigma={_fmt_param(self.sigma)}, v={_fmt(self.sensitivity)})"

    def _standard_noise(self, key: jax.Array, shape: tuple[int, int], dtype: np.dtype) -> jax.Array:
        return jax.random.normal(key, shape, dtype=dtype)

    def log_density(self, dataset: Dataset, x: ArrayLike) -> jax.Array:
        """sum_i -log(2 pi sigma^2)/2 - (x_i - f(D)_i)^2 / (2 sigma^2), shape ``[n]``."""
        x = _check_points(self, x)
        centre = _answer_vector(dataset, self.query, self.dim, x.dtype)
        s = self.sigma
        z = (x - centre[None, :]) / s
        return jnp.sum(-0.5 * jnp.log(2.0 * math.pi * s * s) - 0.5 * z * z, axis=1)


_MAX_SUBSET_RECORDS = 12  # log_density enumerates the 2^m subsets of the records


def pair_uniforms(key: jax.Array, n: int, dim: int, dtype) -> jax.Array:
    """Uniforms on (-1, 1) for ``n`` samples of each side of a canonical pair, ``[2, n, dim]``.

    ``jax.random.laplace`` and ``jax.random.normal`` transform exactly these uniforms, so
    :func:`canonical_pair_from_uniforms` gives their noise for the same key, and one draw serves a batch
    that mixes the two families (the sweep's members share a program across families this way).
    """
    dt = jnp.dtype(dtype)
    lo = np.nextafter(np.array(-1.0, dt), np.array(0.0, dt))
    return jax.random.uniform(key, (2, n, dim), dt, lo, 1.0)


def canonical_pair_from_uniforms(
    u: jax.Array, *, family: str, noise_scale, sensitivity, gaussian=None
) -> jax.Array:
    """Samples of P = M(0) and Q = M(v) of an additive-noise mechanism, ``[2, n, d]``, from uniforms.

    Laplace noise is sign(u) log(1 - |u|) (scale 1), Gaussian noise sqrt(2) erfinv(u); both are scaled by
    ``noise_scale`` (1 / epsilon or sigma) and Q is shifted by the sensitivity vector v. Traceable in
    every argument but ``family``.

    Args:
      u: Uniforms from :func:`pair_uniforms`, ``[2, n, d]``.
      family: ``'laplace'``, ``'gaussian'``, or ``'mixed'`` (then ``gaussian`` picks per call).
      noise_scale: The noise scale, a scalar (traced or concrete).
      sensitivity: The shift v, ``[d]``.
      gaussian: For ``family='mixed'``: a boolean scalar, True for Gaussian noise.

    Returns:
      ``[2, n, d]``: index 0 samples P, index 1 samples Q.

    """
    dt = u.dtype
    laplace = lambda: jnp.sign(u) * jnp.log1p(-jnp.abs(u))  # noqa: E731
    normal = lambda: np.sqrt(2.0).astype(dt) * jax.lax.erf_inv(u)  # noqa: E731
    if family == "laplace":
        noise = laplace()
    elif family == "gaussian":
        noise = normal()
    else:
        noise = jnp.where(gaussian, normal(), laplace())
    v = jnp.asarray(sensitivity).astype(dt)
    centres = jnp.stack([jnp.zeros_like(v), v])
    return centres[:, None, :] + jnp.asarray(noise_scale).astype(dt) * noise


# The noise parameter is a pytree leaf (an array under jit / vmap / grad); the sensitivity fixes the
# output dimension and the query is code, so both are static. ``jax.vmap`` over an array of epsilons or
# sigmas therefore runs one compiled program (README: "vmap over mechanism parameters").
jax.tree_util.register_dataclass(
    LaplaceMechanism, data_fields=["epsilon"], meta_fields=["sensitivity", "query"]
)
jax.tree_util.register_dataclass(
    GaussianMechanism, data_fields=["sigma"], meta_fields=["sensitivity", "query"]
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SubsampledGaussianMechanism(Mechanism):
    """One step of DP-SGD: a Poisson-sampled sum of the records' contributions plus Gaussian noise.

    The dataset is the array ``x [m, dim]`` of the m records' (clipped) contributions, m >= 0. Each
    record enters independently with probability q, and M(D) = sum_i B_i x_i + Z with B_i ~
    Bernoulli(q) i.i.d. and Z ~ N(0, sigma^2 I), so the output density is the 2^m-component mixture

        p(y) = sum_{S subset of [m]} q^|S| (1 - q)^(m - |S|) N(y; sum_{i in S} x_i, sigma^2 I).

    The canonical pair is one record with contribution v (``sensitivity``) against none. Direction
    ``'remove'`` (D' = D without the record): P = M([v]) = (1 - q) N(0, sigma^2 I) + q N(v, sigma^2 I)
    and Q = M([]) = N(0, sigma^2 I); ``'add'`` swaps them. With ||v||_2 = 1 (the clipping norm) sigma is
    DP-SGD's noise multiplier (docs/theory/subsampled_gaussian.md).

    Attributes:
      sigma: The noise standard deviation, finite and > 0.
      sampling_rate: The Poisson sampling rate q in (0, 1] (q = 1 is the plain Gaussian mechanism).
      sensitivity: The record's contribution v, entries finite and >= 0.
      direction: ``'remove'`` or ``'add'``: which of the two laws is P in :func:`canonical_pair`.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> mech = SubsampledGaussianMechanism(sigma=1.0, sampling_rate=0.01)
      >>> mech.sample(jax.random.key(0), jnp.ones((3, 1)), 4).shape
      (4, 1)

    References:
      Abadi et al., "Deep Learning with Differential Privacy", CCS 2016 (DP-SGD); Mironov, Talwar,
      Zhang, "Renyi Differential Privacy of the Sampled Gaussian Mechanism", 2019.

    """

    sigma: float
    sampling_rate: float
    sensitivity: tuple[float, ...] = (1.0,)
    direction: str = "remove"

    family: ClassVar[str] = "subsampled_gaussian"

    def __post_init__(self) -> None:
        object.__setattr__(self, "sigma", check_positive("sigma", self.sigma))
        rate = check_in_range("sampling_rate", self.sampling_rate, 0.0, 1.0, low_open=True)
        object.__setattr__(self, "sampling_rate", rate)
        object.__setattr__(self, "sensitivity", _as_float_tuple("sensitivity", self.sensitivity))
        check_choice("direction", self.direction, ("remove", "add"))

    @property
    def dim(self) -> int:
        """The output dimension, ``len(sensitivity)``."""
        return len(self.sensitivity)

    @property
    def noise_scale(self) -> float:
        """The noise standard deviation sigma."""
        return self.sigma

    @property
    def label(self) -> str:
        """E.g. ``'SubsampledGaussian(sigma=1, q=0.01, v=(1), remove)'``."""
        return (
            f"SubsampledGaussian(sigma={self.sigma:g}, q={self.sampling_rate:g}, "
            f"v={_fmt(self.sensitivity)}, {self.direction})"
        )

    def _records(self, dataset: Dataset, dtype: np.dtype) -> jax.Array:
        x = jnp.asarray(dataset)
        if not jnp.issubdtype(x.dtype, jnp.floating):
            x = x.astype(jnp.result_type(float))
        if x.ndim != 2 or x.shape[1] != self.dim:
            _fail(
                "dataset",
                f"<array of shape {x.shape}>",
                f"must be the records' contributions, shape [m, {self.dim}] (m >= 0)",
            )
        return x.astype(dtype)

    def _sample(self, key: jax.Array, dataset: Dataset, n: int, dtype: np.dtype) -> jax.Array:
        x = self._records(dataset, dtype)
        k_sel, k_noise = jax.random.split(key)
        chosen = jax.random.bernoulli(k_sel, self.sampling_rate, (n, x.shape[0])).astype(dtype)
        noise = jax.random.normal(k_noise, (n, self.dim), dtype=dtype)
        return chosen @ x + self.sigma * noise

    def log_density(self, dataset: Dataset, x: ArrayLike) -> jax.Array:
        """Log of the 2^m-component mixture density (class docstring), shape ``[n]``; m <= 12."""
        y = _check_points(self, x)
        recs = self._records(dataset, y.dtype)
        m = recs.shape[0]
        if m > _MAX_SUBSET_RECORDS:
            raise _no_density(self, f"the mixture has 2^{m} components (at most 2^12 supported)")
        subsets = np.array(
            [[(s >> i) & 1 for i in range(m)] for s in range(2**m)], dtype=np.float64
        ).reshape(2**m, m)
        sizes = subsets.sum(axis=1)
        q = self.sampling_rate
        log_out = math.log1p(-q) if q < 1.0 else -np.inf
        with np.errstate(invalid="ignore"):
            log_w = np.where(sizes > 0, sizes * math.log(q), 0.0)
            log_w = log_w + np.where(m - sizes > 0, (m - sizes) * log_out, 0.0)
        centres = jnp.asarray(subsets, dtype=y.dtype) @ recs  # [2^m, dim]
        s = self.sigma
        z = (y[:, None, :] - centres[None, :, :]) / s
        comp = jnp.sum(-0.5 * math.log(2.0 * math.pi * s * s) - 0.5 * z * z, axis=2)
        return jax.scipy.special.logsumexp(
            comp + jnp.asarray(log_w, dtype=y.dtype)[None, :], axis=1
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class NonPrivateRelease(Mechanism):
    """Releases the query answer exactly: the output law is the point mass at f(D).

    Two distinct point masses are infinitely far apart for any class containing linear functions (paper
    Lemma 2), so every estimator should report +inf here. There is no density.

    Attributes:
      dim: The output dimension; defaults to ``len(sensitivity)``, or 1 if neither is given.
      sensitivity: The change v of the answer between the canonical neighbours (default all ones):
        the canonical pair is f(D) = 0, f(D') = v, as for the Laplace and Gaussian mechanisms.
      query: Optional callable ``dataset -> [dim]``; None means the dataset is the answer itself.

    Examples:
      >>> import jax
      >>> NonPrivateRelease(dim=2).sample(jax.random.key(0), [1.0, 2.0], 2).tolist()
      [[1.0, 2.0], [1.0, 2.0]]

    References:
      Chaudhuri et al. (2019), section 5 and Lemma 2 (non-private release).

    """

    dim: int | None = None
    sensitivity: tuple[float, ...] | None = None
    query: Callable[[Dataset], ArrayLike] | None = None

    family: ClassVar[str] = "nonprivate"

    def __post_init__(self) -> None:
        dim = None if self.dim is None else check_int_at_least("dim", self.dim, 1)
        if self.sensitivity is None:
            dim = 1 if dim is None else dim
            sens = (1.0,) * dim
        else:
            sens = _as_float_tuple("sensitivity", self.sensitivity, length=dim)
            dim = len(sens)
        object.__setattr__(self, "dim", dim)
        object.__setattr__(self, "sensitivity", sens)
        if self.query is not None and not callable(self.query):
            _fail("query", self.query, "must be None or a callable dataset -> [dim] answer")

    @property
    def noise_scale(self) -> float:
        """0: no noise is added."""
        return 0.0

    @property
    def label(self) -> str:
        """E.g. ``'NonPrivate(d=1)'``."""
        return f"NonPrivate(d={self.dim})"

    def _sample(self, key: jax.Array, dataset: Dataset, n: int, dtype: np.dtype) -> jax.Array:
        del key
        centre = _answer_vector(dataset, self.query, self.dim, dtype)
        return jnp.broadcast_to(centre[None, :], (n, self.dim))

    def log_density(self, dataset: Dataset, x: ArrayLike) -> jax.Array:
        """Always raises: a point mass has no density."""
        raise _no_density(self, "the output is a point mass (Lebesgue density +inf / 0)")


# --------------------------------------------------------------------------------------------------
# Randomized response
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class RandomizedResponse(Mechanism):
    """k-ary randomized response, output one-hot.

    The dataset is one category c in {0, ..., k-1}. The mechanism reports c with probability
    p = e^epsilon / (e^epsilon + k - 1) and each of the k - 1 other categories with probability
    q = 1 / (e^epsilon + k - 1), as the one-hot vector in R^k. The log density is with respect to counting
    measure on the k one-hot vertices (``-inf`` elsewhere); it is epsilon-DP, p / q = e^epsilon. Canonical
    pair: c = 0 vs c = 1.

    Attributes:
      epsilon: The privacy parameter, finite and > 0.
      k: The number of categories, an integer >= 2 (also ``dim``).

    Examples:
      >>> import jax
      >>> rr = RandomizedResponse(epsilon=1.0, k=3)
      >>> rr.sample(jax.random.key(0), 2, 4).shape
      (4, 3)
      >>> round(rr.p_true, 6)
      0.576117

    """

    epsilon: float
    k: int = 2

    family: ClassVar[str] = "randomized_response"

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_positive("epsilon", self.epsilon))
        object.__setattr__(self, "k", check_int_at_least("k", self.k, 2))

    @property
    def dim(self) -> int:
        """The number of categories k (the output is one-hot)."""
        return self.k

    @property
    def log_p_true(self) -> float:
        """The log probability of the true category, log p = -log(1 + (k - 1) e^-epsilon)."""
        return -math.log1p((self.k - 1) * math.exp(-self.epsilon))

    @property
    def log_p_other(self) -> float:
        """The log probability of each other category, log q = log p - epsilon."""
        return self.log_p_true - self.epsilon

    @property
    def p_true(self) -> float:
        """The probability of the true category, p = e^epsilon / (e^epsilon + k - 1)."""
        return math.exp(self.log_p_true)

    @property
    def label(self) -> str:
        """E.g. ``'RR(eps=1, k=2)'``."""
        return f"RR(eps={self.epsilon:g}, k={self.k})"

    def _category(self, dataset: Dataset) -> jax.Array:
        c = jnp.asarray(dataset)
        if c.shape != () or not jnp.issubdtype(c.dtype, jnp.integer):
            _fail(
                "dataset",
                f"<{c.dtype} array of shape {c.shape}>",
                f"must be one integer category in [0, {self.k})",
            )
        if not isinstance(c, jax.core.Tracer):
            check_in_range("dataset", int(c), 0, self.k - 1)
        return c.astype(jnp.int32)

    def _check_dataset(self, dataset: Dataset) -> None:
        if not isinstance(dataset, jax.core.Tracer):
            self._category(dataset)

    def _sample(self, key: jax.Array, dataset: Dataset, n: int, dtype: np.dtype) -> jax.Array:
        true = self._category(dataset)
        k_keep, k_other = jax.random.split(key)
        keep = jax.random.bernoulli(k_keep, self.p_true, (n,))
        other = jax.random.randint(k_other, (n,), 0, self.k - 1)
        other = other + (other >= true).astype(
            other.dtype
        )  # uniform over the k - 1 other categories
        report = jnp.where(keep, true, other)
        return jax.nn.one_hot(report, self.k, dtype=dtype)

    def log_density(self, dataset: Dataset, x: ArrayLike) -> jax.Array:
        """Log p at the true one-hot vector, log q at the other vertices, -inf off the vertices."""
        x = _check_points(self, x)
        true = self._category(dataset)
        binary = jnp.all((x == 0) | (x == 1), axis=1)
        one_hot = binary & (jnp.sum(x, axis=1) == 1)
        hit = jnp.take(x, true, axis=1) == 1
        logp = jnp.where(hit, self.log_p_true, self.log_p_other).astype(x.dtype)
        return jnp.where(one_hot, logp, -jnp.inf)


# --------------------------------------------------------------------------------------------------
# Matrix mechanism
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class MatrixMechanism(Mechanism):
    """The matrix mechanism for a workload W with strategy A (paper section 5, Thm 5).

        M_A(W, x, epsilon) = W A^+ (A x + ||A||_1 Z),   Z_j i.i.d. Lap(0, 1/epsilon), j = 1..s,

    for a count vector x in R^m (dataset), workload W [d x m], strategy A [s x m] of rank m (so
    W A^+ A = W and the mean is W x), and ||A||_1 the largest column L1 norm of A (the L1 sensitivity of
    x -> A x when one record is added). Outputs are in R^d with covariance
    2 (||A||_1 / epsilon)^2 (W A^+)(W A^+)^T. It is epsilon-DP and, by post-processing the s-dimensional
    Laplace mechanism, (lin, Renyi) private with parameter <= log(1 + 2^(s(alpha-1)) epsilon^alpha) /
    (alpha - 1). Canonical pair: x = 0 vs x = e_0 (one record of type 0 added).

    A log density exists when W A^+ is square and invertible (then the output is an invertible linear
    image of the Laplace vector); otherwise the law lives on a subspace and ``log_density`` raises.

    Attributes:
      workload: W, shape ``[d, m]`` (stored as a tuple of row tuples).
      strategy: A, shape ``[s, m]`` with rank m (stored as a tuple of row tuples).
      epsilon: The privacy parameter, finite and > 0.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> mm = MatrixMechanism(workload=[[1, 1, 0], [0, 1, 1]],
      ...                      strategy=[[1, 1, 1], [1, 0, 0], [0, 1, 0], [0, 0, 1]], epsilon=1.0)
      >>> mm.dim, mm.noise_dim, mm.domain_size, mm.strategy_norm
      (2, 4, 3, 2.0)
      >>> mm.sample(jax.random.key(0), jnp.array([3.0, 1.0, 2.0]), 10).shape
      (10, 2)

    References:
      Chaudhuri et al. (2019), section 5 "Matrix Mechanism", Theorem 5; Li et al., "The matrix mechanism:
      optimizing linear counting queries under differential privacy", VLDB Journal 2015.

    """

    workload: tuple[tuple[float, ...], ...]
    strategy: tuple[tuple[float, ...], ...]
    epsilon: float

    family: ClassVar[str] = "matrix"

    def __post_init__(self) -> None:
        w = _as_matrix("workload", self.workload)
        a = _as_matrix("strategy", self.strategy)
        if a.shape[1] != w.shape[1]:
            _fail(
                "strategy",
                f"<matrix of shape {a.shape}>",
                f"must have as many columns as the workload ({w.shape[1]}): A is [s, m], W is [d, m]",
            )
        rank = int(np.linalg.matrix_rank(a))
        if rank != a.shape[1]:
            _fail(
                "strategy",
                f"<matrix of shape {a.shape}>",
                f"must have full column rank m = {a.shape[1]}, got rank {rank}",
                "then W A^+ A = W; add rows so that every count is identifiable",
            )
        object.__setattr__(self, "workload", _matrix_tuple(w))
        object.__setattr__(self, "strategy", _matrix_tuple(a))
        object.__setattr__(self, "epsilon", check_positive("epsilon", self.epsilon))

    @property
    def workload_matrix(self) -> np.ndarray:
        """W as a float64 array ``[d, m]``."""
        return np.asarray(self.workload, dtype=np.float64)

    @property
    def strategy_matrix(self) -> np.ndarray:
        """A as a float64 array ``[s, m]``."""
        return np.asarray(self.strategy, dtype=np.float64)

    @property
    def reconstruction(self) -> np.ndarray:
        """W A^+, shape ``[d, s]``: the linear map applied to the noisy strategy answers."""
        return self.workload_matrix @ np.linalg.pinv(self.strategy_matrix)

    @property
    def strategy_norm(self) -> float:
        """||A||_1, the largest column L1 norm of A."""
        return float(np.max(np.sum(np.abs(self.strategy_matrix), axis=0)))

    @property
    def noise_scale(self) -> float:
        """||A||_1 / epsilon, the Laplace scale of each of the s noise coordinates."""
        return self.strategy_norm / self.epsilon

    @property
    def dim(self) -> int:
        """d, the number of workload queries."""
        return len(self.workload)

    @property
    def noise_dim(self) -> int:
        """s, the number of strategy queries (noise coordinates)."""
        return len(self.strategy)

    @property
    def domain_size(self) -> int:
        """m, the length of the count vector."""
        return len(self.strategy[0])

    @property
    def label(self) -> str:
        """E.g. ``'Matrix(eps=1, d=2, s=4, m=3)'``."""
        return (
            f"Matrix(eps={self.epsilon:g}, d={self.dim}, s={self.noise_dim}, m={self.domain_size})"
        )

    def _counts(self, dataset: Dataset, dtype: np.dtype) -> jax.Array:
        x = jnp.asarray(dataset)
        if x.shape != (self.domain_size,):
            _fail(
                "dataset",
                f"<array of shape {x.shape}>",
                f"must be a count vector of shape ({self.domain_size},)",
            )
        return x.astype(dtype)

    def _sample(self, key: jax.Array, dataset: Dataset, n: int, dtype: np.dtype) -> jax.Array:
        x = self._counts(dataset, dtype)
        a = jnp.asarray(self.strategy_matrix, dtype=dtype)
        r = jnp.asarray(self.reconstruction, dtype=dtype)
        noise = self.noise_scale * jax.random.laplace(key, (n, self.noise_dim), dtype=dtype)
        return ((a @ x)[None, :] + noise) @ r.T

    def log_density(self, dataset: Dataset, x: ArrayLike) -> jax.Array:
        """Change of variables when R = W A^+ is square and invertible; raises otherwise.

        log p(y) = sum_j log Lap(z_j; 0, ||A||_1 / epsilon) - log |det R|, with z = R^-1 y - A x.
        """
        r = self.reconstruction
        if r.shape[0] != r.shape[1] or np.linalg.cond(r) > 1e12:
            raise _no_density(
                self,
                f"W A^+ has shape {r.shape} and is not invertible, so the output law lives on a "
                "subspace of R^d",
            )
        y = _check_points(self, x)
        counts = self._counts(dataset, y.dtype)
        r_inv = jnp.asarray(np.linalg.inv(r), dtype=y.dtype)
        a = jnp.asarray(self.strategy_matrix, dtype=y.dtype)
        z = y @ r_inv.T - (a @ counts)[None, :]
        b = self.noise_scale
        log_det = float(np.linalg.slogdet(r)[1])
        return jnp.sum(-math.log(2.0 * b) - jnp.abs(z) / b, axis=1) - log_det


# --------------------------------------------------------------------------------------------------
# Combinators: mixture, joint release, post-processing, black box
# --------------------------------------------------------------------------------------------------


def _check_mechanism(name: str, value: Any) -> None:
    if not isinstance(value, Mechanism):
        _fail(name, value, "must be a Mechanism (e.g. LaplaceMechanism(epsilon=1.0))")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mixture(Mechanism):
    """A coin-flip mixture: each sample comes from ``first`` w.p. ``weight``, else from ``second``.

    The output law is weight * first(D) + (1 - weight) * second(D), both components run on the same
    dataset; its density is the mixture of the components' densities. For any f-divergence and any class
    H, D_f^H of the mixture is at most weight * D_f^H(first) + (1 - weight) * D_f^H(second) (paper Thm 2,
    convexity; not for Renyi). Canonical pair: the components' (which must agree).

    Attributes:
      first: The mechanism chosen with probability ``weight``.
      second: The mechanism chosen otherwise; must have the same ``dim``.
      weight: The probability lambda in [0, 1] of running ``first``.

    Examples:
      >>> import jax
      >>> mix = Mixture(first=LaplaceMechanism(epsilon=1.0), second=GaussianMechanism(sigma=1.0),
      ...               weight=0.3)
      >>> mix.sample(jax.random.key(0), 0.0, 6).shape
      (6, 1)

    References:
      Chaudhuri et al. (2019), Theorem 2 (convexity).

    """

    first: Mechanism
    second: Mechanism
    weight: float

    family: ClassVar[str] = "mixture"

    def __post_init__(self) -> None:
        _check_mechanism("first", self.first)
        _check_mechanism("second", self.second)
        if self.first.dim != self.second.dim:
            _fail(
                "second",
                self.second.label,
                f"must have the same output dimension as first ({self.first.dim}), "
                f"got {self.second.dim}",
            )
        object.__setattr__(self, "weight", check_in_range("weight", self.weight, 0.0, 1.0))

    @property
    def dim(self) -> int:
        """The common output dimension of the two components."""
        return self.first.dim

    @property
    def label(self) -> str:
        """E.g. ``'Mixture(0.3 Laplace(...) + 0.7 Gaussian(...))'``."""
        w = self.weight
        return f"Mixture({w:g} {self.first.label} + {1 - w:g} {self.second.label})"

    def _check_dataset(self, dataset: Dataset) -> None:
        self.first._check_dataset(dataset)
        self.second._check_dataset(dataset)

    def _sample(self, key: jax.Array, dataset: Dataset, n: int, dtype: np.dtype) -> jax.Array:
        k_coin, k_first, k_second = jax.random.split(key, 3)
        a = self.first.sample(k_first, dataset, n, dtype=dtype)
        b = self.second.sample(k_second, dataset, n, dtype=dtype)
        coin = jax.random.bernoulli(k_coin, self.weight, (n,))
        return jnp.where(coin[:, None], a, b)

    def log_density(self, dataset: Dataset, x: ArrayLike) -> jax.Array:
        """logaddexp(log w + log p_first, log(1 - w) + log p_second); raises if a component has none."""
        x = _check_points(self, x)
        lp_first = self.first.log_density(dataset, x)
        lp_second = self.second.log_density(dataset, x)
        w = self.weight
        log_w = math.log(w) if w > 0 else -math.inf
        log_1mw = math.log1p(-w) if w < 1 else -math.inf
        return jnp.logaddexp(log_w + lp_first, log_1mw + lp_second)


@dataclasses.dataclass(frozen=True, kw_only=True)
class JointRelease(Mechanism):
    """The concatenated outputs of independent runs of several mechanisms (non-adaptive composition).

    The dataset is a tuple with one dataset per component, and the output is
    (M_1(D_1), ..., M_k(D_k)) in R^(d_1 + ... + d_k), components independent, so the log density is the
    sum of the components'. Two uses (docs/theory/capacity_bounded_dp.md):

    * sequential composition on the same data (paper Thm 4, eps_1 + eps_2 for H = {h_1 + h_2}): pass the
      same dataset for every component, ``(d, d)``;
    * parallel composition on disjoint data (paper Thm 3, max(eps_1, eps_2)): pass the disjoint parts,
      ``(d_1, d_2)``; a neighbouring dataset then changes only one part.

    Canonical pair: the tuple of the components' canonical datasets vs the tuple of their neighbours,
    i.e. every component changes (the sequential-composition pair).

    Attributes:
      mechanisms: The components, a non-empty tuple (a list is converted).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> lap, gau = LaplaceMechanism(epsilon=1.0), GaussianMechanism(sigma=1.0)
      >>> joint = JointRelease(mechanisms=(lap, gau))
      >>> d = jnp.zeros(1)
      >>> joint.sample(jax.random.key(0), (d, d), 4).shape  # sequential: same data twice
      (4, 2)
      >>> joint.sample(jax.random.key(0), (jnp.ones(1), d), 4).shape  # parallel: disjoint parts
      (4, 2)
      >>> joint.component_slices
      (slice(0, 1, None), slice(1, 2, None))

    References:
      Chaudhuri et al. (2019), Theorems 3 (parallel) and 4 (sequential composition).

    """

    mechanisms: tuple[Mechanism, ...]

    family: ClassVar[str] = "joint"

    def __post_init__(self) -> None:
        if isinstance(self.mechanisms, Mechanism) or not isinstance(self.mechanisms, (tuple, list)):
            _fail("mechanisms", self.mechanisms, "must be a non-empty tuple of Mechanism objects")
        mechs = tuple(self.mechanisms)
        if not mechs:
            _fail("mechanisms", mechs, "must be a non-empty tuple of Mechanism objects")
        for i, m in enumerate(mechs):
            _check_mechanism(f"mechanisms[{i}]", m)
        object.__setattr__(self, "mechanisms", mechs)

    @property
    def dim(self) -> int:
        """The sum of the components' dimensions."""
        return sum(m.dim for m in self.mechanisms)

    @property
    def component_slices(self) -> tuple[slice, ...]:
        """The column slice of each component's output in the concatenated ``[n, dim]`` samples."""
        out, start = [], 0
        for m in self.mechanisms:
            out.append(slice(start, start + m.dim))
            start += m.dim
        return tuple(out)

    def split(self, x: ArrayLike) -> tuple[jax.Array, ...]:
        """Splits ``[n, dim]`` samples into the components' ``[n, d_i]`` blocks (for h_1(x_1) + h_2(x_2))."""
        x = jnp.asarray(x)
        return tuple(x[..., s] for s in self.component_slices)

    @property
    def label(self) -> str:
        """E.g. ``'Joint(Laplace(...), Gaussian(...))'``."""
        return "Joint(" + ", ".join(m.label for m in self.mechanisms) + ")"

    def _datasets(self, dataset: Dataset) -> tuple:
        k = len(self.mechanisms)
        if not isinstance(dataset, (tuple, list)) or len(dataset) != k:
            got = f"a {type(dataset).__name__}"
            if isinstance(dataset, (tuple, list)):
                got += f" of length {len(dataset)}"
            _fail(
                "dataset",
                f"<{got}>",
                f"must be a tuple of {k} datasets, one per component (pass the same dataset "
                "twice for sequential composition)",
            )
        return tuple(dataset)

    def _check_dataset(self, dataset: Dataset) -> None:
        for m, d in zip(self.mechanisms, self._datasets(dataset), strict=True):
            m._check_dataset(d)

    def _sample(self, key: jax.Array, dataset: Dataset, n: int, dtype: np.dtype) -> jax.Array:
        datasets = self._datasets(dataset)
        keys = jax.random.split(key, len(self.mechanisms))
        parts = [
            m.sample(keys[i], d, n, dtype=dtype)
            for i, (m, d) in enumerate(zip(self.mechanisms, datasets, strict=True))
        ]
        return jnp.concatenate(parts, axis=1)

    def log_density(self, dataset: Dataset, x: ArrayLike) -> jax.Array:
        """The sum of the components' log densities on their slices; raises if one has none."""
        x = _check_points(self, x)
        datasets = self._datasets(dataset)
        total = jnp.zeros(x.shape[0], dtype=x.dtype)
        for m, d, s in zip(self.mechanisms, datasets, self.component_slices, strict=True):
            total = total + m.log_density(d, x[:, s])
        return total


@dataclasses.dataclass(frozen=True)
class _LinearMap:
    """y -> G y applied row-wise (``[n, d_in] -> [n, d_out]``); hashable by the value of G."""

    matrix: tuple[tuple[float, ...], ...]

    def __call__(self, y: jax.Array) -> jax.Array:
        return y @ jnp.asarray(self.matrix, dtype=y.dtype).T


@dataclasses.dataclass(frozen=True, kw_only=True)
class PostProcessed(Mechanism):
    """g(M(D)): a function applied to every output of a mechanism (paper Thm 1, post-processing).

    If i o g lies in H for every g in G and i in I, then g o M is (I, Gamma) private with the parameter of
    M (e.g. G, H, I all linear). The law is the push-forward of M(D) by g; ``log_density`` is not
    implemented. Canonical pair: the inner mechanism's.

    Attributes:
      mechanism: The inner mechanism M.
      fn: The post-processing g, applied row-wise: a jnp-traceable ``[n, mechanism.dim] -> [n, out_dim]``.
      out_dim: The output dimension of g.
      name: A label for g.

    Examples:
      >>> import jax
      >>> pp = PostProcessed(mechanism=LaplaceMechanism(epsilon=1.0), fn=lambda y: y**2, out_dim=1)
      >>> pp.sample(jax.random.key(0), 0.0, 3).shape
      (3, 1)

    References:
      Chaudhuri et al. (2019), Theorem 1 (post-processing).

    """

    mechanism: Mechanism
    fn: Callable[[jax.Array], jax.Array]
    out_dim: int
    name: str = "g"

    family: ClassVar[str] = "post_processed"

    def __post_init__(self) -> None:
        _check_mechanism("mechanism", self.mechanism)
        if not callable(self.fn):
            _fail("fn", self.fn, "must be a callable [n, d_in] -> [n, out_dim]")
        object.__setattr__(self, "out_dim", check_int_at_least("out_dim", self.out_dim, 1))

    @property
    def dim(self) -> int:
        """``out_dim``."""
        return self.out_dim

    @property
    def label(self) -> str:
        """E.g. ``'g(Laplace(...))'``."""
        return f"{self.name}({self.mechanism.label})"

    def _check_dataset(self, dataset: Dataset) -> None:
        self.mechanism._check_dataset(dataset)

    def _sample(self, key: jax.Array, dataset: Dataset, n: int, dtype: np.dtype) -> jax.Array:
        y = self.mechanism.sample(key, dataset, n, dtype=dtype)
        z = jnp.asarray(self.fn(y))
        if z.shape != (n, self.out_dim) or not jnp.issubdtype(z.dtype, jnp.floating):
            _fail(
                "fn",
                self.name,
                f"must map [n, {self.mechanism.dim}] to a floating [n, {self.out_dim}] array "
                f"= ({n}, {self.out_dim}); got a {z.dtype} array of shape {z.shape}",
            )
        return z.astype(dtype)

    def log_density(self, dataset: Dataset, x: ArrayLike) -> jax.Array:
        """Always raises: the push-forward density is not implemented."""
        raise _no_density(self, "the density of a post-processed output is not implemented")


def linear_post_processing(mechanism: Mechanism, matrix: ArrayLike) -> PostProcessed:
    """The linear post-processing y -> G y of a mechanism (paper Thm 1 with G linear).

    Args:
      mechanism: The inner mechanism, output dimension d_in.
      matrix: G, shape ``[d_out, d_in]``; each output row y becomes ``G @ y``.

    Returns:
      A :class:`PostProcessed` of dimension d_out, hashable by the value of G.

    Raises:
      InvalidParameterError: If G is not a finite 2-D matrix with ``mechanism.dim`` columns.

    Examples:
      >>> import jax
      >>> pp = linear_post_processing(LaplaceMechanism(epsilon=1.0, sensitivity=(1, 1)), [[1.0, -1.0]])
      >>> pp.dim, pp.sample(jax.random.key(0), [0.0, 0.0], 5).shape
      (1, (5, 1))

    """
    _check_mechanism("mechanism", mechanism)
    g = _as_matrix("matrix", matrix)
    if g.shape[1] != mechanism.dim:
        _fail(
            "matrix",
            f"<matrix of shape {g.shape}>",
            f"must have {mechanism.dim} columns (the mechanism's output dimension)",
        )
    return PostProcessed(
        mechanism=mechanism, fn=_LinearMap(_matrix_tuple(g)), out_dim=g.shape[0], name="linear"
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlackBox(Mechanism):
    """Any user sampler ``(key, dataset, n) -> [n, dim]`` treated as a mechanism with unknown law.

    The sampler must be pure JAX: :meth:`sample` traces it (under ``jax.jit``, with ``n`` static). Its
    output shape and dtype are checked with ``jax.eval_shape`` before it runs (this works with traced
    arguments too): a wrong shape or a non-floating dtype raises naming ``sampler``. The output is cast
    to the requested ``dtype``. There is no density and no canonical pair: build
    :class:`NeighbouringPair` yourself.

    Attributes:
      sampler: The sampler ``(key, dataset, n) -> [n, dim]`` floating array.
      dim: The output dimension.
      name: A label.

    Examples:
      >>> import jax
      >>> bb = BlackBox(sampler=lambda k, d, n: d + jax.random.normal(k, (n, 2)), dim=2)
      >>> bb.sample(jax.random.key(0), 1.0, 3).shape
      (3, 2)

    """

    sampler: Callable[[jax.Array, Dataset, int], jax.Array]
    dim: int
    name: str = "black-box"

    family: ClassVar[str] = "black_box"

    def __post_init__(self) -> None:
        if not callable(self.sampler):
            _fail("sampler", self.sampler, "must be a callable (key, dataset, n) -> [n, dim]")
        object.__setattr__(self, "dim", check_int_at_least("dim", self.dim, 1))

    @property
    def label(self) -> str:
        """The name."""
        return self.name

    def check(self, key: jax.Array, dataset: Dataset, n: int) -> jax.ShapeDtypeStruct:
        """Checks the sampler's output shape and dtype without running it (``jax.eval_shape``).

        Returns:
          The output's ``jax.ShapeDtypeStruct``.

        Raises:
          InvalidParameterError: Naming ``sampler``, with the expected and the actual shape / dtype.

        """
        n = _check_n(n)
        try:
            out = jax.eval_shape(lambda k: self.sampler(k, dataset, n), key)
        except InvalidParameterError:
            raise
        except Exception as exc:  # noqa: BLE001 - report any tracing failure against the sampler
            raise InvalidParameterError(
                f"sampler {self.name!r} failed when traced with (key, dataset, n={n}): {exc}"
            ) from exc
        expected = f"a floating array of shape ({n}, {self.dim})"
        if not isinstance(out, jax.ShapeDtypeStruct):
            _fail("sampler", self.name, f"must return {expected}; got {out!r}")
        if out.shape != (n, self.dim) or not jnp.issubdtype(out.dtype, jnp.floating):
            _fail(
                "sampler",
                self.name,
                f"must return {expected}; got a {out.dtype} array of shape {out.shape}",
            )
        return out

    def _sample(self, key: jax.Array, dataset: Dataset, n: int, dtype: np.dtype) -> jax.Array:
        self.check(key, dataset, n)
        return jnp.asarray(self.sampler(key, dataset, n)).astype(dtype)


# --------------------------------------------------------------------------------------------------
# Neighbouring pairs
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class NeighbouringPair:
    """A mechanism with two neighbouring datasets: P = law of M(D), Q = law of M(D').

    Construction checks (by tracing, without sampling) that the mechanism accepts both datasets.
    Compared and hashed by identity (datasets may be arrays); close over it rather than passing it
    through ``jax.jit`` as an argument.

    Attributes:
      mechanism: The mechanism M.
      dataset: D, whose output law is P.
      neighbour: D', whose output law is Q.

    Examples:
      >>> import jax
      >>> pair = canonical_pair(LaplaceMechanism(epsilon=1.0))
      >>> p, q = pair.sample(jax.random.key(0), 100)
      >>> p.shape, q.shape
      ((100, 1), (100, 1))
      >>> draw = pair.sampler(100)  # a jitted key -> (p, q)
      >>> bool((draw(jax.random.key(0))[0] == p).all())
      True

    """

    mechanism: Mechanism
    dataset: Dataset
    neighbour: Dataset

    def __post_init__(self) -> None:
        _check_mechanism("mechanism", self.mechanism)
        # Shapes only: the key is made inside the abstract trace, so no program runs.
        for d in (self.dataset, self.neighbour):
            jax.eval_shape(lambda d=d: self.mechanism.sample(jax.random.key(0), d, 1))

    @property
    def dim(self) -> int:
        """The mechanism's output dimension."""
        return self.mechanism.dim

    def sample(
        self, key: jax.Array, n: int, *, dtype: DTypeLike | None = None
    ) -> tuple[jax.Array, jax.Array]:
        """Independent draws from P and Q (the key is split in two).

        Args:
          key: A JAX PRNG key.
          n: Samples per side, a static int >= 1.
          dtype: As for :meth:`Mechanism.sample`.

        Returns:
          ``(p_samples, q_samples)``, each ``[n, dim]``.

        """
        _check_key(key)
        k_p, k_q = keys.split(key)
        p = self.mechanism.sample(k_p, self.dataset, n, dtype=dtype)
        q = self.mechanism.sample(k_q, self.neighbour, n, dtype=dtype)
        return p, q

    def sampler(
        self, n: int, *, dtype: DTypeLike | None = None
    ) -> Callable[[jax.Array], tuple[jax.Array, jax.Array]]:
        """A jitted ``key -> (p_samples, q_samples)`` with ``n`` and ``dtype`` fixed.

        Gives the same values as :meth:`sample`; use it inside training loops.
        """
        n = _check_n(n)
        _resolve_dtype(dtype)
        return jax.jit(lambda key: self.sample(key, n, dtype=dtype))

    def swapped(self) -> NeighbouringPair:
        """The pair in the other direction (P and Q exchanged), for divergences that are not symmetric."""
        return NeighbouringPair(self.mechanism, self.neighbour, self.dataset)


def _trees_equal(a: Any, b: Any) -> bool:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    if ta != tb:
        return False
    return all(
        np.shape(x) == np.shape(y) and np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(la, lb, strict=True)
    )


def _canonical_datasets(mechanism: Mechanism) -> tuple[Dataset, Dataset]:
    if isinstance(mechanism, SubsampledGaussianMechanism):
        one = np.asarray(mechanism.sensitivity, dtype=np.float64)[None, :]
        none = np.zeros((0, mechanism.dim))
        return (one, none) if mechanism.direction == "remove" else (none, one)
    if isinstance(mechanism, (LaplaceMechanism, GaussianMechanism, NonPrivateRelease)):
        if mechanism.query is not None:
            _fail(
                "mechanism",
                mechanism.label,
                "has a custom query, so it has no canonical pair",
                "build NeighbouringPair(mechanism, D, D_prime) with your neighbouring datasets",
            )
        return np.zeros(mechanism.dim), np.asarray(mechanism.sensitivity, dtype=np.float64)
    if isinstance(mechanism, RandomizedResponse):
        return 0, 1
    if isinstance(mechanism, MatrixMechanism):
        neighbour = np.zeros(mechanism.domain_size)
        neighbour[0] = 1.0
        return np.zeros(mechanism.domain_size), neighbour
    if isinstance(mechanism, PostProcessed):
        return _canonical_datasets(mechanism.mechanism)
    if isinstance(mechanism, Mixture):
        first = _canonical_datasets(mechanism.first)
        second = _canonical_datasets(mechanism.second)
        if not (_trees_equal(first[0], second[0]) and _trees_equal(first[1], second[1])):
            _fail(
                "mechanism",
                mechanism.label,
                "has components with different canonical pairs",
                "build NeighbouringPair(mechanism, D, D_prime) explicitly",
            )
        return first
    if isinstance(mechanism, JointRelease):
        pairs = [_canonical_datasets(m) for m in mechanism.mechanisms]
        return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
    _fail(
        "mechanism",
        mechanism.label,
        "has no canonical neighbouring pair",
        "build NeighbouringPair(mechanism, D, D_prime) explicitly",
    )
    raise AssertionError  # unreachable


def canonical_pair(mechanism: Mechanism) -> NeighbouringPair:
    """The paper's standard neighbouring pair for a built-in mechanism (docs/theory/mechanisms.md).

    Laplace / Gaussian / NonPrivateRelease: f(D) = zeros(d), f(D') = v (the sensitivity vector; all ones
    by default for NonPrivateRelease). RandomizedResponse: category 0 vs 1. MatrixMechanism: count
    vectors zeros(m) vs e_0. Mixture and PostProcessed: the components' pair (a Mixture's two components
    must agree). JointRelease: the tuples of the components' datasets, every component changing
    (sequential composition). Datasets are float64 numpy arrays (ints for randomized response).

    Args:
      mechanism: A built-in mechanism without a custom ``query``.

    Returns:
      The pair; ``pair.sample(key, n)`` draws from P and Q.

    Raises:
      InvalidParameterError: For a :class:`BlackBox`, a custom query, a Mixture with disagreeing
        components, or anything that is not a built-in mechanism.

    Examples:
      >>> pair = canonical_pair(LaplaceMechanism(epsilon=1.0, sensitivity=(1.0, 2.0)))
      >>> pair.dataset.tolist(), pair.neighbour.tolist()
      ([0.0, 0.0], [1.0, 2.0])

    """
    _check_mechanism("mechanism", mechanism)
    dataset, neighbour = _canonical_datasets(mechanism)
    return NeighbouringPair(mechanism, dataset, neighbour)


# --------------------------------------------------------------------------------------------------
# Factory
# --------------------------------------------------------------------------------------------------

_FACTORY_PARAMS = {
    "laplace": ("epsilon", "sensitivity"),
    "gaussian": ("sigma", "sensitivity"),
    "randomized_response": ("epsilon", "k"),
    "nonprivate": ("sensitivity", "dim"),
    "subsampled_gaussian": ("sigma", "sampling_rate", "sensitivity", "direction"),
}
_REQUIRED = {
    "laplace": ("epsilon",),
    "gaussian": ("sigma",),
    "randomized_response": ("epsilon",),
    "subsampled_gaussian": ("sigma", "sampling_rate"),
}


def make_mechanism(name: str, **params: Any) -> Mechanism:
    """Builds a mechanism by name (for the command line).

    Args:
      name: One of ``MECHANISM_NAMES``: ``'laplace'`` (epsilon, sensitivity), ``'gaussian'`` (sigma,
        sensitivity), ``'randomized_response'`` (epsilon, k), ``'nonprivate'`` (sensitivity, dim),
        ``'subsampled_gaussian'`` (sigma, sampling_rate, sensitivity, direction).
      **params: The parameters listed for the name. A parameter whose value is None counts as not
        given, so a CLI can pass every option it has.

    Returns:
      The mechanism.

    Raises:
      InvalidParameterError: For an unknown name (listing the valid ones), a parameter the mechanism
        does not take, a missing required parameter, or a value out of range.

    Examples:
      >>> make_mechanism("laplace", epsilon=0.5, sensitivity=[1, 1]).label
      'Laplace(eps=0.5, v=(1, 1))'
      >>> make_mechanism("gaussian", sigma=2.0, epsilon=None).label
      'Gaussian(sigma=2, v=(1))'

    """
    check_choice("mechanism", name, MECHANISM_NAMES)
    given = {k: v for k, v in params.items() if v is not None}
    allowed = _FACTORY_PARAMS[name]
    for key in given:
        if key not in allowed:
            _fail(
                key, given[key], f"is not a parameter of {name!r} (it takes: {', '.join(allowed)})"
            )
    for key in _REQUIRED.get(name, ()):
        if key not in given:
            _fail(key, None, f"must be given for mechanism {name!r}")
    if "sensitivity" in given:
        given["sensitivity"] = tuple(check_vector("sensitivity", given["sensitivity"]))
    cls = {
        "laplace": LaplaceMechanism,
        "gaussian": GaussianMechanism,
        "randomized_response": RandomizedResponse,
        "nonprivate": NonPrivateRelease,
        "subsampled_gaussian": SubsampledGaussianMechanism,
    }[name]
    return cls(**given)
