"""`cbdp reproduce`: units of work that resume, stale units, worker processes, findings vs failures.

A fake unit-based experiment (pure Python, six units that square numbers) exercises the machinery in
milliseconds: a failure mid-run (standing in for a kill) resumes with only the missing units, a unit
stored with another configuration or by another package version is recomputed and reported as stale,
two worker processes give the same outputs as one process, and ``reproduce`` keeps a software failure
(exit status 1) apart from a paper claim that does not hold (a finding, exit status 0). One real, fast
experiment (fig1b, whose two "eventually decreasing" claims are findings) runs through the ``cbdp``
command to check what a user sees: the estimate before the start, per-unit progress, the summary.
"""

from __future__ import annotations

import importlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

import cbdp_jax._src.infra.checkpoint as checkpoint
from cbdp_jax.experiments import EXPERIMENTS, _reproduce
from cbdp_jax.experiments._units import run_experiment, unit_store

FAKE = '''
"""A fake unit-based experiment: each unit squares a number; finish writes fake_units.json."""
import os
import sys

from cbdp_jax.experiments._common import check, paper_claim, save_outputs
from cbdp_jax.experiments._units import Unit, run_experiment

NAME = "fake_units"
FAIL_AT = None  # a unit index whose compute raises (a kill stands in for it)
SOFTWARE_OK = True  # False: the software check fails
SHIFT = {}  # unit index -> another configuration
CALLS = []


def plan(quick):
    return [Unit(id=f"u{i}", config={"x": i, "shift": SHIFT.get(i, 0)}, kind="unit") for i in range(6)]


def compute(config):
    CALLS.append(config["x"])
    if FAIL_AT is not None and config["x"] == FAIL_AT:
        raise RuntimeError("killed (injected)")
    return {"x": config["x"], "square": config["x"] ** 2 + config["shift"], "pid": os.getpid()}


def finish(out_dir, results, *, quick, seconds=0.0):
    rows = [{"x": r["x"], "square": r["square"]} for r in results.values()]
    checks = [
        check("squares are squares", SOFTWARE_OK and all(r["square"] == r["x"] ** 2 for r in rows)),
        paper_claim("a printed claim that does not hold", False, "measured 1 vs printed 2"),
    ]
    return save_outputs(out_dir, NAME, rows=rows, summary={"checks": checks})


def run(out_dir, *, quick=False):
    return run_experiment(sys.modules[__name__], out_dir, quick=quick)
'''


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The fake experiment as an importable top-level module (worker processes import it by name)."""
    folder = tmp_path / "mods"
    folder.mkdir()
    (folder / "fake_units.py").write_text(FAKE)
    monkeypatch.syspath_prepend(str(folder))
    sys.modules.pop("fake_units", None)
    module = importlib.import_module("fake_units")
    yield module
    sys.modules.pop("fake_units", None)


def _strip_seconds(path: Path) -> dict:
    data = json.loads(path.read_text())
    data.pop("seconds", None)
    if isinstance(data.get("result"), dict):
        data["result"].pop("pid", None)
    return data


def test_units_resume_after_a_failure_and_compute_only_the_missing_ones(fake, tmp_path):
    out = tmp_path / "out"
    fake.FAIL_AT = 3
    with pytest.raises(RuntimeError, match="injected"):
        run_experiment(fake, out)
    assert fake.CALLS == [0, 1, 2, 3]
    store = unit_store(out, "fake_units", False)
    assert [store.done(f"u{i}", {"x": i, "shift": 0}) for i in range(6)] == [True] * 3 + [False] * 3
    fake.FAIL_AT, fake.CALLS[:] = None, []
    summary = run_experiment(fake, out)
    assert fake.CALLS == [3, 4, 5]  # finished units are not recomputed
    assert (summary["units"], summary["units_reused"], summary["units_stale"]) == (6, 3, 0)
    rows = json.loads((out / "fake_units.json").read_text())["rows"]
    assert [r["square"] for r in rows] == [0, 1, 4, 9, 16, 25]
    fake.CALLS[:] = []
    assert run_experiment(fake, out)["units_reused"] == 6 and fake.CALLS == []


def test_a_unit_stored_with_another_configuration_or_version_is_stale_and_recomputed(
    fake, tmp_path, monkeypatch
):
    out = tmp_path / "out"
    run_experiment(fake, out)
    fake.CALLS[:] = []
    events = []
    fake.SHIFT[2] = 1  # unit u2 now has another configuration
    summary = run_experiment(fake, out, on_event=events.append)
    assert fake.CALLS == [2] and summary["units_stale"] == 1
    stale = [e.report for e in events if e.report.status == "stale"]
    assert [r.unit_id for r in stale] == ["u2"] and "another configuration" in stale[0].reason
    # an upgrade: every unit was stored by another version, so every unit is recomputed and says so
    monkeypatch.setattr(checkpoint, "package_version", lambda: "99.0")
    fake.CALLS[:], events[:] = [], []
    summary = run_experiment(fake, out, on_event=events.append)
    assert sorted(fake.CALLS) == list(range(6)) and summary["units_stale"] == 6
    assert all("stored by cbdp_jax 0.1.0, this is 99.0" in e.report.reason for e in events)


def test_two_worker_processes_give_the_outputs_of_one_process(fake, tmp_path):
    import os

    one, two = tmp_path / "one", tmp_path / "two"
    run_experiment(fake, one)
    summary = run_experiment(fake, two, processes=2)
    assert summary["units_reused"] == 0
    assert (one / "fake_units.json").exists() and (two / "fake_units.csv").exists()
    assert (one / "fake_units.csv").read_bytes() == (two / "fake_units.csv").read_bytes()
    s1, s2 = unit_store(one, "fake_units", False), unit_store(two, "fake_units", False)
    files = sorted(p.name for p in s1.folder.glob("*.json"))
    assert files == sorted(p.name for p in s2.folder.glob("*.json")) and len(files) == 6
    for name in files:
        assert _strip_seconds(s1.folder / name) == _strip_seconds(s2.folder / name)
    # the units really ran in other processes (each wrote its own checkpoint)
    pids = {s2.load(f"u{i}")["pid"] for i in range(6)}
    assert os.getpid() not in pids


@pytest.fixture
def registered(fake, monkeypatch):
    """The fake experiment registered with `cbdp reproduce`."""
    monkeypatch.setitem(EXPERIMENTS, "fake_units", ("fake_units", "a fake experiment"))
    real_load = _reproduce.load
    monkeypatch.setattr(_reproduce, "load", lambda n: fake if n == "fake_units" else real_load(n))
    monkeypatch.setattr(_reproduce, "available", lambda: [*EXPERIMENTS])
    return fake


def test_reproduce_reports_a_paper_finding_without_failing(registered, tmp_path):
    stream = io.StringIO()
    outcome = _reproduce.reproduce("fake_units", tmp_path, stream=stream)
    text = stream.getvalue()
    assert outcome.ok and not outcome.failures and len(outcome.findings) == 1
    assert (outcome.computed, outcome.reused, outcome.stale) == (6, 0, 0)
    assert "6 units of work, 0 done earlier, 6 to run" in text
    assert "Estimated run time: about" in text
    assert "[fake_units 6/6] computed u5" in text and "left" in text
    assert "FINDING, paper's claim does not hold here: a printed claim" in text
    assert "measured 1 vs printed 2" in text and "FAILS" not in text
    assert "exit status 0" in text
    again = io.StringIO()
    outcome = _reproduce.reproduce("fake_units", tmp_path, stream=again)
    assert (outcome.computed, outcome.reused) == (0, 6)
    assert "(done earlier, skipped)" in again.getvalue()


def test_reproduce_fails_on_a_software_failure(registered, tmp_path):
    registered.SOFTWARE_OK = False  # negative control: the same run with a failing software check
    stream = io.StringIO()
    outcome = _reproduce.reproduce("fake_units", tmp_path, stream=stream)
    assert not outcome.ok and len(outcome.failures) == 1 and len(outcome.findings) == 1
    assert "[fake_units] FAILS: squares are squares" in stream.getvalue()
    assert "exit status 1" in stream.getvalue()


def test_reproduce_resumes_inside_an_experiment(registered, tmp_path):
    registered.FAIL_AT = 4
    stream = io.StringIO()
    outcome = _reproduce.reproduce("fake_units", tmp_path, stream=stream)
    assert not outcome.ok and outcome.errors and outcome.computed == 4
    registered.FAIL_AT, registered.CALLS[:] = None, []
    stream = io.StringIO()
    outcome = _reproduce.reproduce("fake_units", tmp_path, stream=stream)
    assert outcome.ok and registered.CALLS == [4, 5]
    assert (outcome.computed, outcome.reused) == (2, 4)
    assert "2 of 6 units to run" in stream.getvalue()
    assert "4 of 6 units done earlier (reused, not recomputed)" in stream.getvalue()


def test_cbdp_reproduce_prints_estimate_progress_and_findings_and_exits_0(tmp_path):
    cli = [sys.executable, "-m", "cbdp_jax.cli", "reproduce", "fig1b", "--quick", "--out"]
    proc = subprocess.run([*cli, str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert out.index("Estimated run time") < out.index("[fig1b 1/1] computed fig1b")
    assert out.count("FINDING, paper's claim does not hold here") == 2
    assert "FAILS" not in out
    assert (
        "paper's claims: 1 hold, 2 do not hold here" in out
    )  # lin decreases; poly_2, poly_3 do not
    assert "units: 1 computed in this run (0 of them stale), 0 reused" in out
