"""The theorem experiments (Thms 1-7, capacity curve, On-Average KL) in quick mode.

Each experiment writes a PNG, a CSV and a JSON file and returns a summary whose ``checks`` state one
claim each, with the numbers behind it; in quick mode every claim must hold (the counter-examples --
non-linear post-processing, Renyi non-convexity -- are stated as "the violation exceeds the confidence
margin", so they hold too). The capacity sweep and the convexity experiment must resume from their
per-unit checkpoints (per class; per lambda).
"""

import csv
import json

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


@pytest.mark.parametrize("name", THEOREM_EXPERIMENTS)
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


@pytest.mark.parametrize("name", ["capacity_curve", "convexity"])
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
