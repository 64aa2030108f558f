"""Mechanisms with known privacy flaws and their correct twins (public API).

``cbdp audit --suite`` audits them all; ``benchmarks/audit_suite.py`` repeats the audits.
"""

from cbdp_jax._src.mechanism_auditor.suite import MEAN_V2_PAIR as MEAN_V2_PAIR
from cbdp_jax._src.mechanism_auditor.suite import SUITE as SUITE
from cbdp_jax._src.mechanism_auditor.suite import SuiteCase as SuiteCase
from cbdp_jax._src.mechanism_auditor.suite import ThirdPartyCase as ThirdPartyCase
from cbdp_jax._src.mechanism_auditor.suite import as_arrays as as_arrays
from cbdp_jax._src.mechanism_auditor.suite import diffprivlib_cases as diffprivlib_cases
from cbdp_jax._src.mechanism_auditor.suite import noisy_count_mean as noisy_count_mean
from cbdp_jax._src.mechanism_auditor.suite import suite_case as suite_case

__all__ = [
    "MEAN_V2_PAIR",
    "SUITE",
    "SuiteCase",
    "ThirdPartyCase",
    "as_arrays",
    "diffprivlib_cases",
    "noisy_count_mean",
    "suite_case",
]
