"""The statistics behind every reported bound (public API; theory in docs/theory/bounds.md).

A bound from samples is a one-sided lower confidence bound on v(h) = E_P[h] - E_Q[f*(h)] for one fixed
critic h evaluated on held-out samples; it bounds D^H for every class H containing h, hence the
unrestricted D. Each :class:`Bound` says whether it is ``'finite-sample'`` (no assumption beyond
bounded terms and independence: :func:`betting_lower_bound`, :func:`berry_esseen_lower_bound`) or
``'asymptotic'`` (the CLT, :func:`clt_lower_bound`, valid only with finite variances, which
:func:`tail_index` checks).

Examples:
  >>> import numpy as np
  >>> from cbdp_jax import statistics
  >>> x = np.random.default_rng(0).beta(2.0, 5.0, 10_000)
  >>> low = statistics.betting_lower_bound(x, 0.0, 1.0, 0.95)
  >>> bool(low < x.mean() < 2 / 7 + 0.01)
  True
  >>> v = statistics.f_from_renyi(0.813689, 4.0)  # Laplace eps = 1, alpha = 4, paper eq. (3)
  >>> round(v, 4), round(statistics.renyi_from_f(v, 4.0), 6)
  (0.8738, 0.813689)

"""

from cbdp_jax._src.statistics.berry_esseen import BerryEsseen as BerryEsseen
from cbdp_jax._src.statistics.berry_esseen import PairMoments as PairMoments
from cbdp_jax._src.statistics.berry_esseen import lower_bound as berry_esseen_lower_bound
from cbdp_jax._src.statistics.berry_esseen import moments_of_sample as moments_of_sample
from cbdp_jax._src.statistics.berry_esseen import pair_moments as pair_moments
from cbdp_jax._src.statistics.betting import SequenceState as SequenceState
from cbdp_jax._src.statistics.betting import lower_bound as betting_lower_bound
from cbdp_jax._src.statistics.betting import lower_bounds as betting_lower_bounds
from cbdp_jax._src.statistics.betting import sequence_init as sequence_init
from cbdp_jax._src.statistics.betting import sequence_update as sequence_update
from cbdp_jax._src.statistics.bounds import GUARANTEES as GUARANTEES
from cbdp_jax._src.statistics.bounds import Bound as Bound
from cbdp_jax._src.statistics.bounds import certifiable_max as certifiable_max
from cbdp_jax._src.statistics.bounds import clt_lower_bound as clt_lower_bound
from cbdp_jax._src.statistics.bounds import f_from_renyi as f_from_renyi
from cbdp_jax._src.statistics.bounds import family_confidence as family_confidence
from cbdp_jax._src.statistics.bounds import finite_sample_lower_bound as finite_sample_lower_bound
from cbdp_jax._src.statistics.bounds import renyi_from_f as renyi_from_f
from cbdp_jax._src.statistics.bounds import z_quantile as z_quantile
from cbdp_jax._src.statistics.held_out import HeldOut as HeldOut
from cbdp_jax._src.statistics.held_out import TailCheck as TailCheck
from cbdp_jax._src.statistics.held_out import certify as certify
from cbdp_jax._src.statistics.held_out import tail_check as tail_check
from cbdp_jax._src.statistics.moments import Moments as Moments
from cbdp_jax._src.statistics.moments import merge as merge_moments
from cbdp_jax._src.statistics.moments import of as moments_of
from cbdp_jax._src.statistics.tails import TailIndex as TailIndex
from cbdp_jax._src.statistics.tails import TailSketch as TailSketch
from cbdp_jax._src.statistics.tails import hill as tail_index
from cbdp_jax._src.statistics.tails import sketch as tail_sketch

__all__ = [
    "GUARANTEES",
    "BerryEsseen",
    "Bound",
    "HeldOut",
    "Moments",
    "PairMoments",
    "SequenceState",
    "TailCheck",
    "TailIndex",
    "TailSketch",
    "berry_esseen_lower_bound",
    "betting_lower_bound",
    "betting_lower_bounds",
    "certifiable_max",
    "certify",
    "clt_lower_bound",
    "f_from_renyi",
    "family_confidence",
    "finite_sample_lower_bound",
    "merge_moments",
    "moments_of",
    "moments_of_sample",
    "pair_moments",
    "renyi_from_f",
    "sequence_init",
    "sequence_update",
    "tail_check",
    "tail_index",
    "tail_sketch",
    "z_quantile",
]
