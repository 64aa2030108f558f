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


@pytest.mark.slow
@pytest.mark.ci
def test_adaptive_composition_is_checkpointed_per_estimate(tmp_path):
    # Full mode: 36 estimates of 3,000 steps on 400k samples each (about half an hour on 2 cores), one
    # unit per estimate, so a resume loses at most one estimate. The ids are unique, the key folds
    # follow the order the experiment ran its estimates in before the split (1..36, so its numbers did
    # not change), and each (direction, divergence) has its one-step reference unit.
    from cbdp_jax.experiments import adaptive_composition as ac
    from cbdp_jax.experiments._units import has_units

    assert has_units(ac)
    units = ac.plan(quick=False)
    assert len(units) == 36 and len({u.id for u in units}) == 36
    assert [u.config["fold"] for u in units] == list(range(1, 37))
    steps_one = [u for u in units if u.config["steps"] == 1]
    assert len(steps_one) == 4 and all(u.config["adversary"] == "mlp" for u in steps_one)
    # quick: the stored units are reused by a second run (nothing recomputed) ...
    first = ac.run(tmp_path, quick=True)
    stamps = {p.name: p.stat().st_mtime_ns for p in (tmp_path / ".units").rglob("*.json")}
    ac.run(tmp_path, quick=True)
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / ".units").rglob("*.json")} == stamps
    # ... and a unit deleted is recomputed from its key to the same result: the finding of a resumed
    # run equals the fresh one because the units are deterministic, not because it was read back.
    victim = sorted((tmp_path / ".units").rglob("*.json"))[0]
    stored = json.loads(victim.read_text())
    victim.unlink()
    third = ac.run(tmp_path, quick=True)
    recomputed = json.loads(victim.read_text())
    for unit in (stored, recomputed):  # wall times are the only fields that may differ
        unit.pop("seconds")
        unit["result"].pop("seconds")
    assert recomputed == stored
    assert first["finding"] == third["finding"]


def test_adaptive_composition_row_of_a_failed_estimate_has_no_nan():
    # The full run's Renyi-2 MLP estimates came out -inf with an infinite SE (training failed; the
    # bound was refused); their z was -inf / inf = NaN. Now: None, and the finding names them.
    import math
    from types import SimpleNamespace

    from cbdp_jax.experiments import adaptive_composition as ac

    def res(estimate, se):
        return SimpleNamespace(
            estimate=estimate, std_error=se, lower_bound=0.0, divergence="KL", warnings=()
        )

    failed = ac._row(res(-math.inf, math.inf), "remove", "mlp", 2, True, 1.0, 0.1)
    ok = ac._row(res(1.5, 0.1), "remove", "mlp", 2, False, 1.0, 0.1)
    assert failed["z"] is None and ok["z"] == pytest.approx(0.5 / math.hypot(0.1, 0.1))
    finding = ac._finding([failed, ok])
    assert "1 rows without a comparison" in finding and "T=2 adaptive" in finding
    assert "nan" not in finding.lower()
