"""Adversary classes as Flax NNX modules (public API)."""

from cbdp_jax._src.estimator.adversaries import ADVERSARY_NAMES as ADVERSARY_NAMES
from cbdp_jax._src.estimator.adversaries import AdversarySpec as AdversarySpec
from cbdp_jax._src.estimator.adversaries import BoundedAdversary as BoundedAdversary
from cbdp_jax._src.estimator.adversaries import ClassProperties as ClassProperties
from cbdp_jax._src.estimator.adversaries import CustomAdversary as CustomAdversary
from cbdp_jax._src.estimator.adversaries import LinearAdversary as LinearAdversary
from cbdp_jax._src.estimator.adversaries import MLPAdversary as MLPAdversary
from cbdp_jax._src.estimator.adversaries import PolynomialAdversary as PolynomialAdversary
from cbdp_jax._src.estimator.adversaries import RandomFeaturesAdversary as RandomFeaturesAdversary
from cbdp_jax._src.estimator.adversaries import make_adversary as make_adversary

__all__ = [
    "ADVERSARY_NAMES",
    "AdversarySpec",
    "BoundedAdversary",
    "ClassProperties",
    "CustomAdversary",
    "LinearAdversary",
    "MLPAdversary",
    "PolynomialAdversary",
    "RandomFeaturesAdversary",
    "make_adversary",
]
