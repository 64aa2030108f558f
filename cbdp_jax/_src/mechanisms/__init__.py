"""Randomized mechanisms as frozen value objects with pure JAX samplers and exact log densities.

One family per module: ``base`` (the interface and shared checks), ``additive`` (Laplace, Gaussian),
``subsampled`` (the Poisson-subsampled Gaussian), ``discrete`` (non-private release, randomized
response), ``matrix``, ``combinators`` (mixture, joint release, post-processing), ``black_box``,
``pairs`` (neighbouring pairs, canonical pairs) and ``factory`` (by name). This package re-exports them.

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

from cbdp_jax._src.mechanisms.additive import GaussianMechanism as GaussianMechanism
from cbdp_jax._src.mechanisms.additive import LaplaceMechanism as LaplaceMechanism
from cbdp_jax._src.mechanisms.base import MECHANISM_NAMES as MECHANISM_NAMES
from cbdp_jax._src.mechanisms.base import Dataset as Dataset
from cbdp_jax._src.mechanisms.base import Mechanism as Mechanism
from cbdp_jax._src.mechanisms.base import _answer_vector as _answer_vector
from cbdp_jax._src.mechanisms.black_box import BlackBox as BlackBox
from cbdp_jax._src.mechanisms.combinators import JointRelease as JointRelease
from cbdp_jax._src.mechanisms.combinators import Mixture as Mixture
from cbdp_jax._src.mechanisms.combinators import PostProcessed as PostProcessed
from cbdp_jax._src.mechanisms.combinators import linear_post_processing as linear_post_processing
from cbdp_jax._src.mechanisms.discrete import NonPrivateRelease as NonPrivateRelease
from cbdp_jax._src.mechanisms.discrete import RandomizedResponse as RandomizedResponse
from cbdp_jax._src.mechanisms.factory import make_mechanism as make_mechanism
from cbdp_jax._src.mechanisms.matrix import MatrixMechanism as MatrixMechanism
from cbdp_jax._src.mechanisms.pairs import NeighbouringPair as NeighbouringPair
from cbdp_jax._src.mechanisms.pairs import canonical_pair as canonical_pair
from cbdp_jax._src.mechanisms.subsampled import (
    SubsampledGaussianMechanism as SubsampledGaussianMechanism,
)
from cbdp_jax._src.mechanisms.subsampled import (
    canonical_pair_from_uniforms as canonical_pair_from_uniforms,
)
from cbdp_jax._src.mechanisms.subsampled import pair_uniforms as pair_uniforms

__all__ = [
    "BlackBox",
    "Dataset",
    "GaussianMechanism",
    "JointRelease",
    "LaplaceMechanism",
    "MECHANISM_NAMES",
    "MatrixMechanism",
    "Mechanism",
    "Mixture",
    "NeighbouringPair",
    "NonPrivateRelease",
    "PostProcessed",
    "RandomizedResponse",
    "SubsampledGaussianMechanism",
    "canonical_pair",
    "canonical_pair_from_uniforms",
    "linear_post_processing",
    "make_mechanism",
    "pair_uniforms",
]
