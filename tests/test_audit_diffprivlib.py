"""A real third-party implementation as a black box: IBM diffprivlib at its stated guarantees.

Skipped only where the ``audit`` extra (diffprivlib) is not installed. Each mechanism is audited on
its tight pair at its claim (no violation may be certified: a false flag has probability <= 5% per
audit, and the keys are fixed) and at the claim with epsilon halved (false; the certified bound must
exceed it). The halved Gaussian claim's violation is small (E_{e^0.5} - 1e-5 = 0.0041), so it runs with
200000 samples per side (about 20 s).
"""

from __future__ import annotations

import jax
import pytest

pytest.importorskip("diffprivlib")

from cbdp_jax import audit as au  # noqa: E402
from cbdp_jax.audit_suite import diffprivlib_cases  # noqa: E402

CONFIG = au.AuditConfig(samples=20_000, classes=("halfspace", "histogram"), eps_grid=(1.0,))
CASES = {c.name: c for c in diffprivlib_cases()}


def _audit(case, claim, config=CONFIG):
    mech = au.load_mechanism(case.fn, case.name)
    return au.audit(jax.random.key(0), mech, claim, pair=case.pair, config=config)


@pytest.mark.parametrize(
    "name", ["diffprivlib.Laplace", "diffprivlib.Geometric", "diffprivlib.Exponential"]
)
def test_diffprivlib_pure_mechanisms_hold_their_claim_and_halving_it_is_flagged(name):
    case = CASES[name]
    assert not _audit(case, case.claim).violation
    assert _audit(case, case.understated).violation


def test_diffprivlib_gaussian_holds_its_claim():
    case = CASES["diffprivlib.GaussianAnalytic"]
    result = _audit(case, case.claim)
    assert not result.violation
    assert result.strongest().lower_bound < 1e-5 + 0.01


def test_diffprivlib_gaussian_halved_claim_is_flagged():
    case = CASES["diffprivlib.GaussianAnalytic"]
    config = au.AuditConfig(samples=200_000, classes=("halfspace",), eps_grid=(1.0,))
    assert _audit(case, case.understated, config).violation
