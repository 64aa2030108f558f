"""Adversary classes as Flax NNX modules.

An adversary is a function h: R^d -> R from a class H; the restricted divergence D_f^H takes the supremum
of the variational objective over H (docs/theory/divergences.md). Each class here is an NNX module mapping a batch
``[n, d]`` to outputs ``[n]``, built from a frozen, hashable :class:`AdversarySpec` that also records the
structural facts the estimator uses to pick a tighter objective (docs/theory/objectives.md):

- ``translation_invariant``: h in H implies h + c in H (a free output bias). Then KL^H is the supremum of
  the Donsker-Varadhan form.
- ``is_cone``: h in H implies t h in H for t > 0 (a linear last layer, bias included). Then the Renyi
  divergence has the scale-free form.
- ``linear_in_params``: h = theta . phi(x) with a fixed feature map phi, so the problem is concave in
  theta and the exact solver (:mod:`cbdp_jax.exact`) computes the true restricted value.

Inputs are standardised coordinatewise with a fixed (non-trainable) location and scale computed from the
training samples. This is an affine reparametrisation of x, under which every class here is closed, so it
changes the optimisation, not the class.

References:
  Chaudhuri, Imola, Machanavajjhala, "Capacity Bounded Differential Privacy", NeurIPS 2019, section 3
  (function classes: linear, polynomial, ReLU combinations, RKHS balls).

"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    check_choice,
    check_int_at_least,
    check_positive,
)

ADVERSARY_NAMES = ("linear", "poly", "relu2", "mlp", "rff")

# The options (fields of AdversarySpec besides ``name``) that apply to each class. Giving any other is an
# error: a silently ignored option would make a result's record claim a setting that was not used.
ADVERSARY_OPTIONS: dict[str, tuple[str, ...]] = {
    "linear": ("feature_map", "bound"),
    "poly": ("degree", "bound"),
    "relu2": ("width", "bound"),
    "mlp": ("width", "depth", "bound"),
    "rff": ("features", "bandwidth", "bound"),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClassProperties:
    """Structural facts about a class H that the training forms and the bounds rely on.

    Attributes:
      cone: h in H implies t h in H for every t > 0 (a linear last layer). Enables the scale-free
        Renyi form and the fitted scale.
      translation_invariant: h in H implies h + c in H (a free output bias). Enables the
        Donsker-Varadhan form for KL and the fitted constant.
      contains_constants: Constants are in H, so D^H >= 0 and a bound may be clamped at 0.
      bound: Every h in H has values in [-bound, bound], or None. A bounded class gets finite-sample
        bounds with no assumption (docs/theory/bounds.md).

    """

    cone: bool = False
    translation_invariant: bool = False
    contains_constants: bool = False
    bound: float | None = None

    def __post_init__(self):
        if self.bound is not None:
            object.__setattr__(self, "bound", check_positive("bound", self.bound))


class CustomAdversary:
    """A user's class: any ``flax.nnx.Module`` mapping ``[n, d] -> [n]``, with declared properties.

    Use it wherever a built-in :class:`AdversarySpec` goes (estimate, estimate_from_samples, sweeps,
    the core trainer). The module is built by ``factory(rngs)`` (a fresh module per ensemble member or
    seed); if it has :class:`Standardizer` variables named ``loc`` and ``scale`` they receive the
    input standardisation, otherwise inputs are passed as they are. Declarations the library can check
    on probe inputs are checked when it is first trained (:func:`cbdp_jax._src.estimator.core.check_properties`):
    a bound the outputs exceed, or a "cone" whose outputs do not scale with the parameters.

    Args:
      factory: ``rngs -> nnx.Module``.
      properties: The class's :class:`ClassProperties`.
      name: A label for results.

    Examples:
      >>> from flax import nnx
      >>> import jax.numpy as jnp
      >>> class Quadratic(nnx.Module):
      ...     def __init__(self, rngs):
      ...         self.w = nnx.Param(jnp.zeros(3))
      ...     def __call__(self, x):
      ...         return self.w[0] + self.w[1] * x[:, 0] + self.w[2] * x[:, 0] ** 2
      >>> custom = CustomAdversary(Quadratic, ClassProperties(cone=True, translation_invariant=True,
      ...                          contains_constants=True), name="quadratic")
      >>> custom.label
      'quadratic'

    """

    def __init__(self, factory: Callable, properties: ClassProperties, *, name: str = "custom"):
        if not callable(factory):
            raise InvalidParameterError(
                f"factory={factory!r} is invalid: must be a callable rngs -> nnx.Module"
            )
        if not isinstance(properties, ClassProperties):
            raise InvalidParameterError(
                f"properties={properties!r} is invalid: must be a ClassProperties"
            )
        self.factory, self.properties, self.name = factory, properties, name

    @property
    def label(self) -> str:
        """The class's name in results."""
        return self.name

    @property
    def bound(self) -> float | None:
        """The declared output bound, or None."""
        return self.properties.bound

    @property
    def is_cone(self) -> bool:
        """Declared: t h in H for t > 0."""
        return self.properties.cone

    @property
    def translation_invariant(self) -> bool:
        """Declared: h + c in H."""
        return self.properties.translation_invariant

    @property
    def contains_constants(self) -> bool:
        """Declared: constants in H."""
        return self.properties.contains_constants

    @property
    def linear_in_params(self) -> bool:
        """Never assumed for a custom class (the exact layer does not take one)."""
        return False

    def build(self, key: jax.Array, dim: int, *, loc=None, scale=None, dtype=jnp.float32):
        """A fresh module with parameters from ``key`` and the input standardisation, if it has one."""
        module = self.factory(nnx.Rngs(params=key))
        if loc is not None:
            for path, var in nnx.iter_graph(module):
                if isinstance(var, Standardizer) and path and path[-1] in ("loc", "scale"):
                    var.value = jnp.asarray(loc if path[-1] == "loc" else scale, dtype)
        return module

    def to_dict(self) -> dict:
        """The class as JSON-ready fields."""
        return {"name": self.name, "custom": True, **dataclasses.asdict(self.properties)}


class Standardizer(nnx.Variable):
    """A fixed, non-trainable variable (location or scale of the input standardisation)."""


class FixedFeatures(nnx.Variable):
    """Fixed random features (frequencies and phases of random Fourier features): not trained."""


class _Adversary(nnx.Module):
    """Shared input standardisation: z = (x - loc) / scale, coordinatewise."""

    def _init_standardizer(self, dim: int, loc: jax.Array | None, scale: jax.Array | None, dtype):
        loc = jnp.zeros(dim, dtype) if loc is None else jnp.asarray(loc, dtype)
        scale = jnp.ones(dim, dtype) if scale is None else jnp.asarray(scale, dtype)
        self.loc = Standardizer(loc)
        self.scale = Standardizer(scale)

    def standardize(self, x: jax.Array) -> jax.Array:
        return (x - self.loc[...]) / self.scale[...]


class LinearAdversary(_Adversary):
    """h(x) = w . phi(z) + b, z the standardised input, phi a fixed feature map (identity by default)."""

    def __init__(
        self,
        dim: int,
        *,
        rngs: nnx.Rngs,
        feature_map: Callable[[jax.Array], jax.Array] | None = None,
        loc=None,
        scale=None,
        dtype=jnp.float32,
    ):
        self._init_standardizer(dim, loc, scale, dtype)
        self.feature_map = feature_map
        n_features = dim if feature_map is None else _feature_count(feature_map, dim, dtype)
        self.head = nnx.Linear(n_features, 1, rngs=rngs, param_dtype=dtype, dtype=dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        z = self.standardize(x)
        if self.feature_map is not None:
            z = self.feature_map(z)
        return self.head(z)[:, 0]


def _feature_count(feature_map, dim, dtype) -> int:
    shape = jax.eval_shape(feature_map, jax.ShapeDtypeStruct((2, dim), dtype)).shape
    if len(shape) != 2 or shape[0] != 2:
        raise InvalidParameterError(
            f"feature_map must map [n, {dim}] to [n, m]; it returned shape {shape} for n = 2"
        )
    return int(shape[1])


class PolynomialAdversary(_Adversary):
    """h(x) = b + sum_i sum_{j=1..k} w_ij z_i^j: a degree-k polynomial in each standardised coordinate.

    In one dimension this is the full poly_k class of the paper; in d dimensions it is the additive
    (no cross terms) polynomial class.
    """

    def __init__(
        self, dim: int, degree: int, *, rngs: nnx.Rngs, loc=None, scale=None, dtype=jnp.float32
    ):
        self._init_standardizer(dim, loc, scale, dtype)
        self.degree = degree
        self.head = nnx.Linear(dim * degree, 1, rngs=rngs, param_dtype=dtype, dtype=dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        z = self.standardize(x)
        powers = jnp.concatenate([z**j for j in range(1, self.degree + 1)], axis=-1)
        return self.head(powers)[:, 0]


class MLPAdversary(_Adversary):
    """A ReLU network with ``depth`` hidden layers of ``width`` units and a linear output layer.

    ``depth = 1`` is the paper's class of linear combinations of ReLUs (a two-layer network).
    """

    def __init__(
        self,
        dim: int,
        width: int,
        depth: int,
        *,
        rngs: nnx.Rngs,
        loc=None,
        scale=None,
        dtype=jnp.float32,
    ):
        self._init_standardizer(dim, loc, scale, dtype)
        sizes = [dim] + [width] * depth
        self.hidden = nnx.List(
            [
                nnx.Linear(a, b, rngs=rngs, param_dtype=dtype, dtype=dtype)
                for a, b in zip(sizes[:-1], sizes[1:], strict=True)
            ]
        )
        self.head = nnx.Linear(width, 1, rngs=rngs, param_dtype=dtype, dtype=dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        z = self.standardize(x)
        for layer in self.hidden:
            z = jax.nn.relu(layer(z))
        return self.head(z)[:, 0]


class RandomFeaturesAdversary(_Adversary):
    """Random Fourier features: h(x) = b + w . sqrt(2/F) cos(W z + c), W, c fixed, (w, b) trained.

    With W ~ N(0, I / bandwidth^2) and c ~ U[0, 2 pi) the features approximate the Gaussian kernel of that
    bandwidth (Rahimi and Recht 2007), so a norm ball of w approximates an RKHS ball (a kernel adversary).
    """

    def __init__(
        self,
        dim: int,
        features: int,
        bandwidth: float,
        *,
        rngs: nnx.Rngs,
        loc=None,
        scale=None,
        dtype=jnp.float32,
    ):
        self._init_standardizer(dim, loc, scale, dtype)
        key_w, key_c = jax.random.split(rngs.params())
        self.freqs = FixedFeatures(jax.random.normal(key_w, (dim, features), dtype) / bandwidth)
        self.phases = FixedFeatures(jax.random.uniform(key_c, (features,), dtype, 0.0, 2 * math.pi))
        self.head = nnx.Linear(features, 1, rngs=rngs, param_dtype=dtype, dtype=dtype)
        self.norm = math.sqrt(2.0 / features)

    def __call__(self, x: jax.Array) -> jax.Array:
        z = self.standardize(x)
        phi = self.norm * jnp.cos(z @ self.freqs[...] + self.phases[...])
        return self.head(phi)[:, 0]


class BoundedAdversary(nnx.Module):
    """B * tanh(g(x)): outputs in (-B, B).

    For IPM-type quantities and for divergences whose f* has a bounded domain (TV, Hellinger, JS).
    """

    def __init__(self, inner: nnx.Module, bound: float):
        self.inner = inner
        self.bound = bound

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.bound * jnp.tanh(self.inner(x))


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdversarySpec:
    """A hashable description of an adversary class (usable as a static jit argument).

    Attributes:
      name: ``'linear'``, ``'poly'``, ``'relu2'`` (two-layer ReLU network), ``'mlp'`` or ``'rff'``.
      degree: Polynomial degree for ``'poly'`` (>= 1).
      width: Hidden width for ``'relu2'`` and ``'mlp'``.
      depth: Number of hidden layers for ``'mlp'`` (``'relu2'`` is depth 1).
      features: Number of random features for ``'rff'``.
      bandwidth: Kernel bandwidth of ``'rff'`` in standardised units.
      bound: If set, wraps the class as ``bound * tanh(h)`` (outputs in (-bound, bound)).
      feature_map: For ``'linear'``, an optional fixed map ``[n, d] -> [n, m]`` of standardised inputs.

    """

    name: str
    degree: int = 3
    width: int = 64
    depth: int = 2
    features: int = 256
    bandwidth: float = 1.0
    bound: float | None = None
    feature_map: Callable[[jax.Array], jax.Array] | None = None

    def __post_init__(self):
        check_choice("adversary", self.name, ADVERSARY_NAMES)
        defaults = {f.name: f.default for f in dataclasses.fields(self) if f.name != "name"}
        for option, default in defaults.items():
            value = getattr(self, option)
            if value is not default and value != default:
                check_option_applies(self.name, option, value)
        check_int_at_least("degree", self.degree, 1)
        check_int_at_least("width", self.width, 1)
        check_int_at_least("depth", self.depth, 1)
        check_int_at_least("features", self.features, 1)
        check_positive("bandwidth", self.bandwidth)
        if self.bound is not None:
            check_positive("bound", self.bound)

    @property
    def translation_invariant(self) -> bool:
        """H in H implies h + c in H for every constant c (true unless the output is bounded)."""
        return self.bound is None

    @property
    def is_cone(self) -> bool:
        """H in H implies t h in H for t > 0 (every unbounded class here ends in a linear layer)."""
        return self.bound is None

    @property
    def linear_in_params(self) -> bool:
        """H = theta . phi(x) for a fixed phi: the variational problem is concave in theta."""
        return self.name in ("linear", "poly", "rff") and self.bound is None

    @property
    def contains_constants(self) -> bool:
        """Constants are in H, so D^H >= 0 (every class here has an output bias)."""
        return True

    def to_dict(self) -> dict:
        """The name and the options that apply to this class, JSON-ready (a feature map by its ``repr``).

        Options that do not apply to the class (a width for a linear class) are left out, so a record
        never shows a setting that was not used; ``make_adversary(**spec.to_dict())`` rebuilds the
        spec when it has no feature map.
        """
        d = {"name": self.name}
        for option in ADVERSARY_OPTIONS[self.name]:
            d[option] = getattr(self, option)
        if "feature_map" in d:
            d["feature_map"] = None if self.feature_map is None else repr(self.feature_map)
        return d

    @property
    def label(self) -> str:
        """A short name such as ``'poly_3'`` or ``'mlp(64x2)'``."""
        base = {
            "linear": "linear" if self.feature_map is None else "linear(phi)",
            "poly": f"poly_{self.degree}",
            "relu2": f"relu2(w={self.width})",
            "mlp": f"mlp({self.width}x{self.depth})",
            "rff": f"rff(F={self.features})",
        }[self.name]
        return base if self.bound is None else f"{self.bound:g}*tanh({base})"

    def build(
        self, key: jax.Array, dim: int, *, loc=None, scale=None, dtype=jnp.float32
    ) -> nnx.Module:
        """Instantiates the module for inputs of dimension ``dim`` with parameters drawn from ``key``."""
        rngs = nnx.Rngs(params=key)
        common = {"rngs": rngs, "loc": loc, "scale": scale, "dtype": dtype}
        if self.name == "linear":
            module = LinearAdversary(dim, feature_map=self.feature_map, **common)
        elif self.name == "poly":
            module = PolynomialAdversary(dim, self.degree, **common)
        elif self.name == "relu2":
            module = MLPAdversary(dim, self.width, 1, **common)
        elif self.name == "mlp":
            module = MLPAdversary(dim, self.width, self.depth, **common)
        else:
            module = RandomFeaturesAdversary(dim, self.features, self.bandwidth, **common)
        return module if self.bound is None else BoundedAdversary(module, self.bound)


def check_option_applies(name: str, option: str, value) -> None:
    """Raises unless ``option`` is an option of adversary class ``name`` (see ``ADVERSARY_OPTIONS``).

    Raises:
      InvalidParameterError: Naming the option, its value, the class, the options the class takes and
        the classes the option applies to.

    """
    takes = ADVERSARY_OPTIONS[name]
    if option in takes:
        return
    users = [n for n, opts in ADVERSARY_OPTIONS.items() if option in opts]
    where = (
        f"{option} applies to adversary " + ", ".join(repr(u) for u in users)
        if users
        else f"{option!r} is not an option of any adversary class"
    )
    raise InvalidParameterError(
        f"{option}={value!r} is invalid for adversary {name!r}: it takes "
        + ", ".join(takes)
        + f" ({where})"
    )


def make_adversary(name: str, **options) -> AdversarySpec:
    """Builds an :class:`AdversarySpec` by name; options are the spec's fields (degree, width, ...).

    An option given as None counts as not given. Options that apply to each class: ``linear``:
    feature_map, bound; ``poly``: degree, bound; ``relu2``: width, bound; ``mlp``: width, depth,
    bound; ``rff``: features, bandwidth, bound.

    Raises:
      InvalidParameterError: For an unknown name, an out-of-range option, or an option that does not
        apply to the class (``width`` for ``'linear'``, ``degree`` for ``'mlp'``, a misspelling).

    Examples:
      >>> make_adversary("poly", degree=3).label
      'poly_3'

    """
    check_choice("adversary", name, ADVERSARY_NAMES)
    given = {k: v for k, v in options.items() if v is not None}
    for option, value in given.items():
        check_option_applies(name, option, value)
    return AdversarySpec(name=name, **given)


def options_for(name: str, options: dict) -> dict:
    """The subset of shared ``options`` (None values dropped) that applies to class ``name``."""
    takes = ADVERSARY_OPTIONS.get(name, ())
    return {k: v for k, v in options.items() if v is not None and k in takes}
