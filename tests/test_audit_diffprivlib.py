"""A real third-party implementation as a black box: IBM diffprivlib at its stated guarantees.

diffprivlib is a declared test dependency: a broken install fails this module, it never skips. Each
mechanism is audited on its tight pair at its claim (no violation may be certified; the audits of a
true claim run at family-wise level 0.999, so a false flag has probability <= 0.1% per audit) and at
the claim with epsilon halved (false; the certified bound must exceed it). The halved Gaussian claim's violation is small (E_{e^0.5} - 1e-5 = 0.0041), so it runs with
200000 samples per side (about 20 s).
"""

from __future__ import annotations

import dataclasses

import diffprivlib  # noqa: F401 - a declared test dependency: a broken install fails, never skips
import jax
import pytest

from cbdp_jax import audit as au
from cbdp_jax.audit_suite import diffprivlib_cases

CONFIG = au.AuditConfig(samples=20_000, classes=("halfspace", "histogram"), eps_grid=(1.0,))
# True claims are audited at 0.999: "no violation" is then not one 95% draw.
TRUE_CLAIM = dataclasses.replace(CONFIG, confidence=0.999)
CASES = {c.name: c for c in diffprivlib_cases()}


def _audit(case, claim, config=CONFIG):
    mech = au.load_mechanism(case.fn, case.name)
    return au.audit(jax.random.key(0), mech, claim, pair=case.pair, config=config)


@pytest.mark.parametrize(
    "name", ["diffprivlib.Laplace", "diffprivlib.Geometric", "diffprivlib.Exponential"]
)
def test_diffprivlib_pure_mechanisms_hold_their_claim_and_halving_it_is_flagged(name):
    case = CASES[name]
    assert not _audit(case, case.claim, TRUE_CLAIM).violation
    assert _audit(case, case.understated).violation


def test_diffprivlib_gaussian_holds_its_claim():
    case = CASES["diffprivlib.GaussianAnalytic"]
    result = _audit(case, case.claim, TRUE_CLAIM)
    assert not result.violation
    assert result.strongest().lower_bound < 1e-5 + 0.01


def test_diffprivlib_gaussian_halved_claim_is_flagged():
    case = CASES["diffprivlib.GaussianAnalytic"]
    config = au.AuditConfig(samples=200_000, classes=("halfspace",), eps_grid=(1.0,))
    assert _audit(case, case.understated, config).violation
