"""The calibration and adaptive-composition experiments in quick mode: outputs written, claims hold.

The calibration experiment's claims are checked against independent recomputation in
tests/test_calibration.py; here the experiment must run end to end, write its PNG / CSV / JSON, keep every
round trip within 1e-6, and produce the DP-SGD table. The adaptive-composition run (a few minutes of
training even in quick mode) is marked slow; its provable check (KL, additive class, 'remove' direction:
the joint value cannot exceed the sum) must hold.
"""

import json

import pytest

from cbdp_jax.experiments import EXPERIMENTS, load


def _run(name, tmp_path):
    summary = load(name).run(tmp_path, quick=True)
    for ext in ("png", "csv", "json"):
        assert (tmp_path / f"{name}.{ext}").stat().st_size > 0
    payload = json.loads((tmp_path / f"{name}.json").read_text())
    assert payload["checks"] == summary["checks"]
    failed = [(c["claim"], c["detail"]) for c in summary["checks"] if not c["holds"]]
    assert not failed, failed
    return summary, payload


def test_both_are_registered_for_reproduce():
    assert "calibration" in EXPERIMENTS and "adaptive_composition" in EXPERIMENTS


def test_calibration_quick(tmp_path):
    summary, payload = _run("calibration", tmp_path)
    table = summary["dp_sgd_table"]
    assert len(table) == 1 and table[0]["q"] == 0.01 and table[0]["T"] == 100
    row = table[0]
    # A restricted adversary never needs more noise; a linear one sees only the mean shift q T, so its
    # KL requirement is sigma = q sqrt(T / (2 * 0.5)) exactly (docs/theory/subsampled_gaussian.md).
    assert row["kl_linear_sigma"] == pytest.approx(0.01 * 10.0, rel=1e-9)
    assert row["kl_linear_sigma"] <= row["kl_quadratic_sigma"] <= row["kl_unrestricted_sigma"]
    assert max(r["round_trip_error"] for r in payload["rows"]) <= 1e-6


@pytest.mark.slow
def test_adaptive_composition_quick(tmp_path):
    summary, payload = _run("adaptive_composition", tmp_path)
    assert summary["finding"] and payload["rows"]
    for r in payload["rows"]:
        assert r["joint_se"] > 0 and r["sum_of_steps"] > 0
