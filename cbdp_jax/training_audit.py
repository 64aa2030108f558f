"""Auditing DP training as it is really run: many trainings in one compiled program (public API).

Theory in docs/theory/training_audit.md; worst-case initial parameters, the adversary-class curve,
ghost clipping and runs over devices and hosts in docs/theory/tight_training_audits.md.

Examples:
  >>> import jax
  >>> from cbdp_jax import training_audit as ta
  >>> sampler = ta.BatchSampler(kind="poisson", rate=0.25)
  >>> sampler.masks(jax.random.key(0), 8, 3).shape
  (3, 8)
  >>> ta.BatchSampler(kind="shuffle", batch_size=2).masks(jax.random.key(0), 8, 4).sum(0).tolist()
  [1, 1, 1, 1, 1, 1, 1, 1]

"""

from cbdp_jax._src.infra.run_blocks import RunBlocks as RunBlocks
from cbdp_jax._src.infra.sharded_runs import Progress as Progress
from cbdp_jax._src.infra.sharded_runs import sharded_runs as sharded_runs
from cbdp_jax._src.mechanism_auditor.loading import AuditRefusedError as AuditRefusedError
from cbdp_jax._src.mechanism_auditor.results import BlindSpot as BlindSpot
from cbdp_jax._src.mechanism_auditor.results import Defect as Defect
from cbdp_jax._src.privacy.accounting import RELATIONS as RELATIONS
from cbdp_jax._src.privacy.accounting import dpsgd_noise as dpsgd_noise
from cbdp_jax._src.training_auditor.audit_training import TrainingMechanism as TrainingMechanism
from cbdp_jax._src.training_auditor.audit_training import audit_training as audit_training
from cbdp_jax._src.training_auditor.audit_training import default_claim as default_claim
from cbdp_jax._src.training_auditor.audit_training import (
    training_audit_config as training_audit_config,
)
from cbdp_jax._src.training_auditor.audit_training import training_mechanism as training_mechanism
from cbdp_jax._src.training_auditor.batch_sampling import SAMPLERS as SAMPLERS
from cbdp_jax._src.training_auditor.batch_sampling import BatchSampler as BatchSampler
from cbdp_jax._src.training_auditor.class_curve import ADVERSARIES as ADVERSARIES
from cbdp_jax._src.training_auditor.class_curve import ClassCurve as ClassCurve
from cbdp_jax._src.training_auditor.class_curve import CurvePoint as CurvePoint
from cbdp_jax._src.training_auditor.class_curve import class_curve as class_curve
from cbdp_jax._src.training_auditor.class_curve import curve_runs as curve_runs
from cbdp_jax._src.training_auditor.crafted_init import INITS as INITS
from cbdp_jax._src.training_auditor.crafted_init import Start as Start
from cbdp_jax._src.training_auditor.crafted_init import StartReport as StartReport
from cbdp_jax._src.training_auditor.crafted_init import Training as Training
from cbdp_jax._src.training_auditor.crafted_init import crafted_problem as crafted_problem
from cbdp_jax._src.training_auditor.crafted_init import crafted_start as crafted_start
from cbdp_jax._src.training_auditor.dp_steps import BUGS as BUGS
from cbdp_jax._src.training_auditor.dp_steps import DpSgdState as DpSgdState
from cbdp_jax._src.training_auditor.dp_steps import dp_sgd as dp_sgd
from cbdp_jax._src.training_auditor.models import CNN as CNN
from cbdp_jax._src.training_auditor.one_run.audit import (
    OneRunTrainingResult as OneRunTrainingResult,
)
from cbdp_jax._src.training_auditor.one_run.audit import one_run_repeats as one_run_repeats
from cbdp_jax._src.training_auditor.one_run.audit import one_run_training as one_run_training
from cbdp_jax._src.training_auditor.one_run.critics import CRITICS as ONE_RUN_CRITICS
from cbdp_jax._src.training_auditor.ops import Prepared as Prepared
from cbdp_jax._src.training_auditor.prepare import prepare as prepare
from cbdp_jax._src.training_auditor.problem import DEFAULT_CANARY_NORM as DEFAULT_CANARY_NORM
from cbdp_jax._src.training_auditor.problem import THREATS as THREATS
from cbdp_jax._src.training_auditor.problem import Canary as Canary
from cbdp_jax._src.training_auditor.problem import TrainingProblem as TrainingProblem
from cbdp_jax._src.training_auditor.problem import cross_entropy as cross_entropy
from cbdp_jax._src.training_auditor.problem import load_problem as load_problem
from cbdp_jax._src.training_auditor.runs import RunOutput as RunOutput
from cbdp_jax._src.training_auditor.runs import make_run as make_run
from cbdp_jax._src.training_auditor.runs import many_runs as many_runs
from cbdp_jax._src.training_auditor.runs import training_runs as training_runs
from cbdp_jax._src.training_auditor.setups import DATASETS as DATASETS
from cbdp_jax._src.training_auditor.setups import MLP as MLP
from cbdp_jax._src.training_auditor.setups import MODELS as MODELS
from cbdp_jax._src.training_auditor.setups import SingleWeight as SingleWeight
from cbdp_jax._src.training_auditor.setups import build_problem as build_problem
from cbdp_jax._src.training_auditor.setups import input_canary as input_canary
from cbdp_jax._src.training_auditor.setups import load_data as load_data
from cbdp_jax._src.training_auditor.setups import make_model as make_model
from cbdp_jax._src.training_auditor.setups import worst_case_problem as worst_case_problem
from cbdp_jax._src.training_auditor.shuffle_lower_bound import (
    shuffle_lower_delta as shuffle_lower_delta,
)
from cbdp_jax._src.training_auditor.shuffle_lower_bound import (
    shuffle_lower_epsilon as shuffle_lower_epsilon,
)

__all__ = [
    "ADVERSARIES",
    "BUGS",
    "CNN",
    "DATASETS",
    "DEFAULT_CANARY_NORM",
    "INITS",
    "MLP",
    "MODELS",
    "OneRunTrainingResult",
    "RELATIONS",
    "SAMPLERS",
    "THREATS",
    "AuditRefusedError",
    "BatchSampler",
    "BlindSpot",
    "Canary",
    "ClassCurve",
    "CurvePoint",
    "Defect",
    "DpSgdState",
    "Prepared",
    "Progress",
    "RunBlocks",
    "RunOutput",
    "SingleWeight",
    "Start",
    "StartReport",
    "Training",
    "TrainingMechanism",
    "TrainingProblem",
    "audit_training",
    "build_problem",
    "class_curve",
    "crafted_problem",
    "crafted_start",
    "cross_entropy",
    "curve_runs",
    "default_claim",
    "dp_sgd",
    "dpsgd_noise",
    "input_canary",
    "load_data",
    "load_problem",
    "make_model",
    "make_run",
    "ONE_RUN_CRITICS",
    "one_run_repeats",
    "one_run_training",
    "many_runs",
    "prepare",
    "sharded_runs",
    "shuffle_lower_delta",
    "shuffle_lower_epsilon",
    "training_audit_config",
    "training_mechanism",
    "training_runs",
    "worst_case_problem",
]
