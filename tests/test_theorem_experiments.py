"""The theorem experiments (Thms 1-7, capacity curve, On-Average KL) in quick mode.

Each experiment writes a PNG, a CSV and a JSON file and returns a summary whose ``checks`` state one
claim each, with the numbers behind it; in quick mode every claim must hold (the counter-examples --
non-linear post-processing, Renyi non-convexity -- are stated as "the violation exceeds the confidence
margin", so they hold too). The capacity sweep and the convexity experiment must resume from their
per-unit checkpoints (per class; per lambda).
"""

import csv
import json
import math

import pytest

from cbdp_jax.experiments import load

THEOREM_EXPERIMENTS = (
    "post_processing",
    "convexity",
    "composition",
    "pinsker_generalization",
    "capacity_curve",
    "on_average_kl",
)
# 20-40 s each on 2 cores: all run with -m slow, and CI runs them on every landing (marker ci,
# .ci/run); the default run stays within its five minutes (docs/guide/testing.md).


def _marked(names):
    return [pytest.param(n, marks=(pytest.mark.slow, pytest.mark.ci), id=n) for n in names]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """Runs each quick experiment once per module, on first use."""
    cache = {}

    def get(name):
        if name not in cache:
            folder = tmp_path_factory.mktemp(name)
            cache[name] = (folder, load(name).run(folder, quick=True))
        return cache[name]

    return get


@pytest.mark.parametrize("name", _marked(THEOREM_EXPERIMENTS))
def test_quick_run_writes_outputs_and_every_claim_holds(outputs, name):
    folder, summary = outputs(name)
    for ext in ("png", "csv", "json"):
        path = folder / f"{name}.{ext}"
        assert path.exists() and path.stat().st_size > 0, path
    assert (folder / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    payload = json.loads((folder / f"{name}.json").read_text())
    assert payload["experiment"] == name
    assert payload["checks"] == summary["checks"]
    with open(folder / f"{name}.csv", newline="") as fh:
        assert len(list(csv.DictReader(fh))) == len(payload["rows"]) > 0
    checks = summary["checks"]
    assert checks
    failed = [(c["claim"], c["detail"]) for c in checks if not c["holds"]]
    assert not failed, failed


def _rows(folder, name):
    rows = json.loads((folder / f"{name}.json").read_text())["rows"]
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # wall time aside


@pytest.mark.parametrize("name", _marked(["capacity_curve", "convexity"]))
def test_experiment_resumes_from_its_unit_checkpoints(outputs, name):
    folder, first = outputs(name)
    units = sorted((folder / ".units" / f"{name}-quick").glob("*.json"))
    assert len(units) == first["units"] > 0
    rows_before = _rows(folder, name)
    # A killed run: two units missing. The rerun recomputes only those (same keys, same samples), the
    # rest come from disk, and the output equals the uninterrupted run's.
    for path in units[:2]:
        path.unlink()
    second = load(name).run(folder, quick=True)
    assert second["units_reused"] == first["units"] - 2
    assert _rows(folder, name) == rows_before
    # A complete store: nothing is recomputed and the output is identical.
    third = load(name).run(folder, quick=True)
    assert third["units_reused"] == first["units"]
    assert _rows(folder, name) == rows_before


def test_pinsker_reads_a_stored_unit_with_a_refused_ipm_bound():
    """Regression (full `cbdp reproduce all`): a unit whose IPM lower bound is -inf is stored as the
    string '-inf'; finishing must read it back as a number, not compare a string with a float."""
    import json

    from cbdp_jax._src.infra.io import to_json
    from cbdp_jax.experiments import pinsker_generalization as pg
    from cbdp_jax.experiments._common import StoredEstimate

    kl_h = StoredEstimate(
        estimate=0.1,
        lower_bound=0.05,
        std_error=0.01,
        bound_reliable=True,
        divergence="KL",
        adversary="mlp",
        warnings=(),
        seconds=1.0,
    ).to_dict()
    ipm = {
        "estimate": 0.2,
        "std_error": 0.01,
        "lower_bound": -math.inf,
        "family_size": 9,
        "train_value": 0.2,
    }
    label = pg._setting_label("laplace", 1.0)
    stored = json.loads(to_json({label: {"ipm": ipm, "kl_h": kl_h}}))
    assert stored[label]["ipm"]["lower_bound"] == "-inf"  # what a unit file holds
    row, checks = pg._pinsker_setting("laplace", 1.0, stored, "mlp")
    assert row["ipm_lower_bound"] == -math.inf
    assert all(isinstance(c, dict) for c in checks)
    # Negative control: the stored value itself cannot be compared with a float.
    with pytest.raises(TypeError):
        _ = stored[label]["ipm"]["lower_bound"] <= 1.0
