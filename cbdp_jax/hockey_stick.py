"""The hockey-stick divergence E_gamma: closed forms, bounded critics, finite-sample certificates."""

from cbdp_jax._src.mechanism_auditor.hockey_stick import CRITICS as CRITICS
from cbdp_jax._src.mechanism_auditor.hockey_stick import Critic as Critic
from cbdp_jax._src.mechanism_auditor.hockey_stick import HockeyStickBound as HockeyStickBound
from cbdp_jax._src.mechanism_auditor.hockey_stick import certify as certify
from cbdp_jax._src.mechanism_auditor.hockey_stick import fit_critic as fit_critic
from cbdp_jax._src.mechanism_auditor.hockey_stick import (
    gaussian_hockey_stick as gaussian_hockey_stick,
)
from cbdp_jax._src.mechanism_auditor.hockey_stick import gaussian_sigma_for as gaussian_sigma_for
from cbdp_jax._src.mechanism_auditor.hockey_stick import (
    laplace_hockey_stick as laplace_hockey_stick,
)
from cbdp_jax._src.mechanism_auditor.hockey_stick import (
    laplace_linear_hockey_stick as laplace_linear_hockey_stick,
)
from cbdp_jax._src.mechanism_auditor.hockey_stick import samples_needed as samples_needed

__all__ = [
    "CRITICS",
    "Critic",
    "HockeyStickBound",
    "certify",
    "fit_critic",
    "gaussian_hockey_stick",
    "gaussian_sigma_for",
    "laplace_hockey_stick",
    "laplace_linear_hockey_stick",
    "samples_needed",
]
