"""Auditing a mechanism's privacy claim from samples (public API; theory in docs/theory/auditing.md).

Examples:
  >>> import jax
  >>> from cbdp_jax import audit
  >>> claim = audit.parse_claim("approx:1:1e-5")
  >>> claim.epsilon, claim.delta
  (1.0, 1e-05)
  >>> # (eps, delta) allows what the (eps, delta) randomized response reaches at eps' < eps:
  >>> round(claim.claimed_delta(0.5), 4)  # delta + (1 - delta) (e^eps - e^eps') / (1 + e^eps)
  0.2877

"""

from cbdp_jax._src.mechanism_auditor.audit import audit as audit
from cbdp_jax._src.mechanism_auditor.claims import CLAIM_KINDS as CLAIM_KINDS
from cbdp_jax._src.mechanism_auditor.claims import DEFAULT_ARCHITECTURES as DEFAULT_ARCHITECTURES
from cbdp_jax._src.mechanism_auditor.claims import Claim as Claim
from cbdp_jax._src.mechanism_auditor.claims import parse_architecture as parse_architecture
from cbdp_jax._src.mechanism_auditor.claims import parse_claim as parse_claim
from cbdp_jax._src.mechanism_auditor.config import AuditConfig as AuditConfig
from cbdp_jax._src.mechanism_auditor.epsilon import EmpiricalEpsilon as EmpiricalEpsilon
from cbdp_jax._src.mechanism_auditor.epsilon import empirical_epsilon as empirical_epsilon
from cbdp_jax._src.mechanism_auditor.epsilon import gdp_delta as gdp_delta
from cbdp_jax._src.mechanism_auditor.loading import AuditMechanism as AuditMechanism
from cbdp_jax._src.mechanism_auditor.loading import AuditRefusedError as AuditRefusedError
from cbdp_jax._src.mechanism_auditor.loading import load_mechanism as load_mechanism
from cbdp_jax._src.mechanism_auditor.loading import load_samples as load_samples
from cbdp_jax._src.mechanism_auditor.loading import parse_dataset as parse_dataset
from cbdp_jax._src.mechanism_auditor.pairs import RELATIONS as RELATIONS
from cbdp_jax._src.mechanism_auditor.pairs import DatasetSpace as DatasetSpace
from cbdp_jax._src.mechanism_auditor.pairs import gradient_pair as gradient_pair
from cbdp_jax._src.mechanism_auditor.pairs import screen_score as screen_score
from cbdp_jax._src.mechanism_auditor.pairs import search_pair as search_pair
from cbdp_jax._src.mechanism_auditor.report import write_report as write_report
from cbdp_jax._src.mechanism_auditor.results import AuditResult as AuditResult
from cbdp_jax._src.mechanism_auditor.results import BlindSpot as BlindSpot
from cbdp_jax._src.mechanism_auditor.results import Defect as Defect
from cbdp_jax._src.mechanism_auditor.results import Row as Row
from cbdp_jax._src.mechanism_auditor.results import ViolationPoint as ViolationPoint

__all__ = [
    "CLAIM_KINDS",
    "DEFAULT_ARCHITECTURES",
    "RELATIONS",
    "AuditConfig",
    "AuditMechanism",
    "AuditRefusedError",
    "AuditResult",
    "BlindSpot",
    "Claim",
    "DatasetSpace",
    "Defect",
    "EmpiricalEpsilon",
    "Row",
    "ViolationPoint",
    "audit",
    "empirical_epsilon",
    "gdp_delta",
    "gradient_pair",
    "load_mechanism",
    "load_samples",
    "parse_architecture",
    "parse_claim",
    "parse_dataset",
    "screen_score",
    "search_pair",
    "write_report",
]
