"""What a verdict says: where a violation is certified, the kind of bound it rests on, and which
architecture a capacity claim was audited on (docs/theory/auditing.md, section 2)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbdp_jax import InvalidParameterError
from cbdp_jax import audit as au
from cbdp_jax._src.mechanism_auditor import certify as audit_certify
from cbdp_jax._src.mechanism_auditor import verdict as audit_verdict


def _gauss(key, d, n):
    return jnp.sum(d) + jax.random.normal(key, (n,))


CHEAP = au.AuditConfig(
    samples=20_000, classes=("halfspace",), eps_grid=(0.5, 1.0), screen_samples=100
)


def test_a_certified_violation_names_its_point():
    # N(0, 1) against N(1, 1) is mu = 1 GDP: its delta(0.5) = 0.24 against approx:0.5:1e-5's 1e-5
    # (at the grid's other point, eps' = 0.25, the claim allows 1e-5 + e^0.5 - e^0.25 = 0.365, above
    # the true 0.31), so the violation is certified at eps 0.5, and at most the true curve.
    res = au.audit(jax.random.key(0), _gauss, "approx:0.5:1e-5", pair=([0.0], [1.0]), config=CHEAP)
    assert res.violation
    p = res.violation_point
    assert p.grid == "epsilon" and p.at == 0.5 and p.guarantee == "finite-sample"
    assert p.certified > p.claimed
    # the certified point is below the true curve (mu = 1), the claim's above what it allows
    assert p.certified <= au.gdp_delta(1.0, p.at)
    assert f"at eps {p.at:.4g} the samples certify delta >= {p.certified:.4g}" in res.verdict
    record = res.to_dict()
    assert record["violation_point"]["certified"] == pytest.approx(p.certified)
    assert record["guarantee"] == "finite-sample" and record["blind_spots"] == []
    # negative control: a true claim has no point
    ok = au.audit(jax.random.key(1), _gauss, "approx:5:1e-5", pair=([0.0], [1.0]), config=CHEAP)
    assert (
        not ok.violation and ok.violation_point is None and ok.to_dict()["violation_point"] is None
    )


@pytest.mark.parametrize(
    "text, family, arch, default",
    [
        ("capacity:mlp:kl:0.5", "mlp", "mlp(32x2)", True),
        ("capacity:mlp(64x3):kl:0.5", "mlp", "mlp(64x3)", False),
        ("capacity:bounded-mlp(16x1):kl:0.5", "bounded-mlp", "bounded-mlp(16x1)", False),
        ("capacity:poly:renyi:2:0.5", "poly", "poly(3)", True),
        ("capacity:poly(5):kl:0.5", "poly", "poly(5)", False),
        ("capacity:linear:kl:0.5", "linear", "linear", False),
    ],
)
def test_capacity_claims_name_their_architecture(text, family, arch, default):
    claim = au.parse_claim(text)
    assert (claim.adversary, claim.architecture, claim.architecture_default) == (
        family,
        arch,
        default,
    )


@pytest.mark.parametrize(
    "text, needle",
    [
        ("capacity:mlp(64):kl:0.5", "mlp and bounded-mlp take (WIDTHxDEPTH)"),
        ("capacity:linear(3):kl:0.5", "linear takes none"),
        ("capacity:mlp(0x3):kl:0.5", "every size >= 1"),
        ("capacity:cnn(3x3):kl:0.5", "claim class"),
        ("capacity:mlp(64x3:kl:0.5", "must be linear, poly or poly(K)"),
    ],
)
def test_a_malformed_architecture_is_refused_in_one_line(text, needle):
    with pytest.raises(InvalidParameterError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        au.parse_claim(text)


def test_the_audited_architecture_is_the_claims(monkeypatch):
    # The estimator is called with the claim's width and depth (a stand-in records the call: the
    # wiring, not the training, is what this checks).
    seen = []

    class Fake:
        lower_bound, bound_reliable, refusal, bound_on_named_class = 0.1, True, None, True
        guarantee, assumption, certified_class, adversary = "asymptotic", "CLT", "mlp", "mlp"
        estimate, std_error, samples, bounds = 0.1, 0.01, {"test_p": 100}, ""

    def fake(key, a, b, **kw):
        seen.append({k: kw[k] for k in ("adversary", "width", "depth") if k in kw})
        return Fake()

    import cbdp_jax._src.estimator.estimate as est

    monkeypatch.setattr(est, "estimate_from_samples", fake)
    x = np.zeros((200, 1))
    claim = au.parse_claim("capacity:mlp(64x3):kl:0.05")
    rows, _ = audit_certify._estimator_rows(jax.random.key(0), x, x, claim, au.AuditConfig())
    assert seen and all(s == {"adversary": "mlp", "width": 64, "depth": 3} for s in seen)
    verdict = audit_verdict._verdict(rows, claim, 2, au.AuditConfig(), 100)
    assert (
        verdict[0] and verdict[4] == "asymptotic" and "rests on an asymptotic bound" in verdict[1]
    )


def test_a_capacity_verdict_states_the_default_architecture_and_its_asymptotic_bound():
    # sum(d) + Laplace(0.5) on (0, 1): D^lin_KL = 0.7549, far above 0.2; the unbounded linear class
    # is certified with the asymptotic bound, which the result and the verdict say.
    def laplace_sum(key, d, n):
        return jnp.sum(d) + 0.5 * jax.random.laplace(key, (n,))

    config = au.AuditConfig(samples=40_000, estimator_steps=300)
    res = au.audit(jax.random.key(7), laplace_sum, "capacity:linear:kl:0.2", pair=([0.0], [1.0]),
                   config=config)  # fmt: skip
    assert res.violation and res.guarantee == "asymptotic", res.verdict
    assert res.verdict.startswith("capacity claim on linear: violation certified")
    assert "rests on an asymptotic bound" in res.verdict
    assert res.claimed["architecture"] == "linear" and not math.isnan(res.violation_point.at)
