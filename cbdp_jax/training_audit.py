"""Auditing DP training as it is really run: many trainings in one compiled program (public API).

Theory in docs/theory/training_audit.md.

Examples:
  >>> import jax
  >>> from cbdp_jax import training_audit as ta
  >>> sampler = ta.BatchSampler(kind="poisson", rate=0.25)
  >>> sampler.masks(jax.random.key(0), 8, 3).shape
  (3, 8)
  >>> ta.BatchSampler(kind="shuffle", batch_size=2).masks(jax.random.key(0), 8, 4).sum(0).tolist()
  [1, 1, 1, 1, 1, 1, 1, 1]

"""

from cbdp_jax._src.batch_sampling import SAMPLERS as SAMPLERS
from cbdp_jax._src.batch_sampling import BatchSampler as BatchSampler
from cbdp_jax._src.shuffle_lower_bound import shuffle_lower_delta as shuffle_lower_delta
from cbdp_jax._src.shuffle_lower_bound import shuffle_lower_epsilon as shuffle_lower_epsilon
from cbdp_jax._src.training_audit import BUGS as BUGS
from cbdp_jax._src.training_audit import THREATS as THREATS
from cbdp_jax._src.training_audit import Canary as Canary
from cbdp_jax._src.training_audit import DpSgdState as DpSgdState
from cbdp_jax._src.training_audit import Prepared as Prepared
from cbdp_jax._src.training_audit import RunOutput as RunOutput
from cbdp_jax._src.training_audit import TrainingProblem as TrainingProblem
from cbdp_jax._src.training_audit import audit_training as audit_training
from cbdp_jax._src.training_audit import default_claim as default_claim
from cbdp_jax._src.training_audit import dp_sgd as dp_sgd
from cbdp_jax._src.training_audit import make_run as make_run
from cbdp_jax._src.training_audit import prepare as prepare
from cbdp_jax._src.training_audit import training_audit_config as training_audit_config
from cbdp_jax._src.training_audit import training_mechanism as training_mechanism
from cbdp_jax._src.training_audit import training_runs as training_runs
from cbdp_jax._src.training_setups import DATASETS as DATASETS
from cbdp_jax._src.training_setups import MLP as MLP
from cbdp_jax._src.training_setups import MODELS as MODELS
from cbdp_jax._src.training_setups import SingleWeight as SingleWeight
from cbdp_jax._src.training_setups import build_problem as build_problem
from cbdp_jax._src.training_setups import input_canary as input_canary
from cbdp_jax._src.training_setups import load_data as load_data
from cbdp_jax._src.training_setups import make_model as make_model
from cbdp_jax._src.training_setups import worst_case_problem as worst_case_problem

__all__ = [
    "BUGS",
    "DATASETS",
    "MLP",
    "MODELS",
    "SAMPLERS",
    "THREATS",
    "BatchSampler",
    "Canary",
    "DpSgdState",
    "Prepared",
    "RunOutput",
    "SingleWeight",
    "TrainingProblem",
    "audit_training",
    "build_problem",
    "default_claim",
    "dp_sgd",
    "input_canary",
    "load_data",
    "make_model",
    "make_run",
    "prepare",
    "shuffle_lower_delta",
    "shuffle_lower_epsilon",
    "training_audit_config",
    "training_mechanism",
    "training_runs",
    "worst_case_problem",
]
