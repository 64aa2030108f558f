"""One-run auditing: epsilon lower bounds from canaries included at random in one training run.

Theory and the benchmark against jax_privacy in docs/theory/one_run.md.

Examples:
  >>> import numpy as np
  >>> from cbdp_jax import one_run
  >>> rng = np.random.default_rng(0)
  >>> included = rng.random(1000) < 0.5  # each canary in the run with probability 1/2
  >>> scores = rng.normal(size=1000) + 4.0 * included  # a 4-GDP run's canary scores
  >>> bound = one_run.one_run_audit(scores, included, delta=1e-5, level=0.95, method="fdp")
  >>> bound.epsilon > 1.0, bound.family_size
  (True, 7)
  >>> gauss = one_run.one_run_audit(scores, included, method="gaussian-scores")
  >>> gauss.epsilon > bound.epsilon  # the scores' Gaussian shape, assumed, is worth a lot
  True

"""

from cbdp_jax._src.mechanism_auditor.one_run import METHODS as METHODS
from cbdp_jax._src.mechanism_auditor.one_run import OneRunBound as OneRunBound
from cbdp_jax._src.mechanism_auditor.one_run import count_correct as count_correct
from cbdp_jax._src.mechanism_auditor.one_run import dp_false_rate as dp_false_rate
from cbdp_jax._src.mechanism_auditor.one_run import family_weights as family_weights
from cbdp_jax._src.mechanism_auditor.one_run import fdp_epsilon as fdp_epsilon
from cbdp_jax._src.mechanism_auditor.one_run import fdp_gdp_mu as fdp_gdp_mu
from cbdp_jax._src.mechanism_auditor.one_run import fdp_refutes as fdp_refutes
from cbdp_jax._src.mechanism_auditor.one_run import gdp_epsilon as gdp_epsilon
from cbdp_jax._src.mechanism_auditor.one_run import gdp_false_rate as gdp_false_rate
from cbdp_jax._src.mechanism_auditor.one_run import guess_candidates as guess_candidates
from cbdp_jax._src.mechanism_auditor.one_run import one_run_audit as one_run_audit
from cbdp_jax._src.mechanism_auditor.one_run import steinke_epsilon as steinke_epsilon
from cbdp_jax._src.mechanism_auditor.one_run import steinke_p_value as steinke_p_value
from cbdp_jax._src.mechanism_auditor.one_run_scores import GaussianScoresFit as GaussianScoresFit
from cbdp_jax._src.mechanism_auditor.one_run_scores import (
    gaussian_scores_fit as gaussian_scores_fit,
)

__all__ = [
    "METHODS",
    "GaussianScoresFit",
    "OneRunBound",
    "count_correct",
    "dp_false_rate",
    "family_weights",
    "fdp_epsilon",
    "fdp_gdp_mu",
    "fdp_refutes",
    "gdp_epsilon",
    "gaussian_scores_fit",
    "gdp_false_rate",
    "guess_candidates",
    "one_run_audit",
    "steinke_epsilon",
    "steinke_p_value",
]
