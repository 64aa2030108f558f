"""Randomized mechanisms, neighbouring pairs and a factory by name (public API)."""

from cbdp_jax._src.mechanisms import MECHANISM_NAMES as MECHANISM_NAMES
from cbdp_jax._src.mechanisms import BlackBox as BlackBox
from cbdp_jax._src.mechanisms import GaussianMechanism as GaussianMechanism
from cbdp_jax._src.mechanisms import JointRelease as JointRelease
from cbdp_jax._src.mechanisms import LaplaceMechanism as LaplaceMechanism
from cbdp_jax._src.mechanisms import MatrixMechanism as MatrixMechanism
from cbdp_jax._src.mechanisms import Mechanism as Mechanism
from cbdp_jax._src.mechanisms import Mixture as Mixture
from cbdp_jax._src.mechanisms import NeighbouringPair as NeighbouringPair
from cbdp_jax._src.mechanisms import NonPrivateRelease as NonPrivateRelease
from cbdp_jax._src.mechanisms import PostProcessed as PostProcessed
from cbdp_jax._src.mechanisms import RandomizedResponse as RandomizedResponse
from cbdp_jax._src.mechanisms import SubsampledGaussianMechanism as SubsampledGaussianMechanism
from cbdp_jax._src.mechanisms import canonical_pair as canonical_pair
from cbdp_jax._src.mechanisms import linear_post_processing as linear_post_processing
from cbdp_jax._src.mechanisms import make_mechanism as make_mechanism

__all__ = [
    "MECHANISM_NAMES",
    "BlackBox",
    "GaussianMechanism",
    "JointRelease",
    "LaplaceMechanism",
    "MatrixMechanism",
    "Mechanism",
    "Mixture",
    "NeighbouringPair",
    "NonPrivateRelease",
    "PostProcessed",
    "RandomizedResponse",
    "SubsampledGaussianMechanism",
    "canonical_pair",
    "linear_post_processing",
    "make_mechanism",
]
