"""Faults mid-run: a sweep killed with SIGKILL resumes to the same outputs as an uninterrupted run.

The sweep is a multi-unit :class:`~cbdp_jax.checkpoint.UnitStore` run of the kind ``cbdp reproduce``
performs: a grid of exact restricted Renyi values (one unit each), then a CSV and a JSON of all rows,
written atomically. ``cbdp reproduce paper --quick`` killed and resumed, and a per-unit experiment
(``convexity``) killed mid-experiment, are exercised by two slow tests (a few minutes each).

Independent references: an uninterrupted run of the same sweep in another folder (outputs compared byte
for byte, JSON -- unit files included -- minus wall time and environment), and logs of which units each
process computed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import cbdp_jax._src.infra.io as cbdp_io
from cbdp_jax.checkpoint import UnitStore

VOLATILE = ("seconds", "runtime_s", "environment")  # wall time and where it ran
N_UNITS = 12

DRIVER = r'''
"""A resumable sweep: exact (poly_k, Renyi) values over a grid, one UnitStore unit per point."""
import os
import sys
import time
from pathlib import Path

out, log_path, pause, block_at = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])

if block_at:  # fault injection: the block_at-th fsync (= unit save) hangs so a SIGKILL lands mid-write
    _real_fsync, _count = os.fsync, [0]

    def _fsync(fd):
        _count[0] += 1
        if _count[0] == block_at:
            (log_path.parent / (log_path.name + ".blocked")).touch()
            time.sleep(600)
        _real_fsync(fd)

    os.fsync = _fsync

from cbdp_jax import analytic, exact
from cbdp_jax._src.infra.io import atomic_write_csv, atomic_write_json, environment_info
from cbdp_jax.checkpoint import UnitStore

GRID = [(eps, k, a) for eps in (0.5, 1.0) for k in (1, 2, 3) for a in (2.0, 4.0)]
UNITS = {f"laplace-eps={e:g}-poly{k}-renyi-alpha={a:g}": (e, k, a) for e, k, a in GRID}
log = open(log_path, "a", buffering=1)


def compute(uid):
    log.write(f"start {uid}\n")
    e, k, a = UNITS[uid]
    r = exact.restricted_divergence(exact.laplace_pair(e), "renyi", "poly", degree=k, alpha=a)
    time.sleep(pause)  # each unit lasts >= pause, so a kill right after a save lands in a compute
    return {"unit": uid, "epsilon": e, "degree": k, "alpha": a, "value": r.value,
            "converged": r.converged, "renyi_dp": analytic.laplace_renyi(a, e)}


def on_unit(uid, cached):
    log.write(f"{'cached' if cached else 'computed'} {uid}\n")


t0 = time.perf_counter()
rows = UnitStore(out / ".units" / "sweep").run(list(UNITS), compute, on_unit=on_unit)
atomic_write_csv(out / "sweep.csv", rows)
atomic_write_json(out / "sweep.json", {"rows": rows, "seconds": time.perf_counter() - t0,
                                       "environment": environment_info()})
log.write("done\n")
'''


def _strip(obj):
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _start(driver: Path, out: Path, log: Path, *, pause: float, block_at: int = 0):
    return subprocess.Popen(
        [sys.executable, str(driver), str(out), str(log), str(pause), str(block_at)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc, timeout=300):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]


def _wait_for(predicate, proc, timeout=240.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, "the sweep ended before the fault could be injected"
        assert time.monotonic() < deadline, "timed out waiting to inject the fault"
        time.sleep(0.02)


def _kill(proc):
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def _units(folder: Path) -> dict[str, str]:
    """unit id -> file name, for every complete unit file (asserting each id appears once)."""
    ids = [json.loads(p.read_text())["unit"] for p in sorted(folder.glob("*.json"))]
    assert len(ids) == len(set(ids)), "a unit is stored twice"
    return {json.loads(p.read_text())["unit"]: p.name for p in folder.glob("*.json")}


def _log(path: Path, kind: str) -> Counter:
    if not path.exists():
        return Counter()
    return Counter(
        line.split(" ", 1)[1]
        for line in path.read_text().splitlines()
        if line.startswith(kind + " ")
    )


def _assert_same_outputs(run: Path, ref: Path):
    assert (run / "sweep.csv").read_bytes() == (ref / "sweep.csv").read_bytes()
    a = json.loads((run / "sweep.json").read_text())
    b = json.loads((ref / "sweep.json").read_text())
    assert _strip(a) == _strip(b)
    assert len(a["rows"]) == N_UNITS
    ua, ub = run / ".units" / "sweep", ref / ".units" / "sweep"
    assert sorted(p.name for p in ua.glob("*.json")) == sorted(p.name for p in ub.glob("*.json"))
    for p in ua.glob("*.json"):
        # unit files match except the compute time stored with each
        assert _strip(json.loads(p.read_text())) == _strip(json.loads((ub / p.name).read_text()))


@pytest.fixture(scope="module")
def driver(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("driver") / "sweep_driver.py"
    path.write_text(DRIVER)
    return path


@pytest.fixture(scope="module")
def reference(driver, tmp_path_factory):
    """An uninterrupted run, started at once and waited for by the tests that compare with it."""
    base = tmp_path_factory.mktemp("reference")
    proc = _start(driver, base / "out", base / "run.log", pause=0.0)
    yield {"proc": proc, "out": base / "out"}
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def _reference_out(reference) -> Path:
    proc = reference["proc"]
    if proc.returncode is None:
        _finish(proc)
    assert proc.returncode == 0
    return reference["out"]


@pytest.mark.slow
@pytest.mark.ci
def test_sigkill_mid_sweep_then_resume_equals_uninterrupted_run(driver, reference, tmp_path):
    out = tmp_path / "out"
    units = out / ".units" / "sweep"
    victim = _start(driver, out, tmp_path / "first.log", pause=0.25)
    _wait_for(lambda: units.is_dir() and any(units.glob("*.json")), victim)
    _kill(victim)
    at_kill = _units(units)
    assert 1 <= len(at_kill) < N_UNITS  # the kill landed mid-sweep
    assert not (out / "sweep.csv").exists() and not (out / "sweep.json").exists()

    resumed = _start(driver, out, tmp_path / "second.log", pause=0.25)
    _finish(resumed)
    _assert_same_outputs(out, _reference_out(reference))
    assert not list(tmp_path.rglob("*.tmp")), "temporary files left behind"
    assert len(_units(units)) == N_UNITS

    # The restart reused every unit on disk and computed only the missing ones, once each.
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    assert set(_log(second, "cached")) == set(at_kill)
    assert set(_log(second, "computed")) == set(_units(units)) - set(at_kill)
    computed = _log(first, "computed") + _log(second, "computed")
    assert all(n == 1 for n in computed.values()), computed
    starts = _log(first, "start") + _log(second, "start")
    # only a unit in flight at the kill may have been started twice
    assert sum(starts.values()) <= N_UNITS + 1 and all(n <= 2 for n in starts.values())


@pytest.fixture(scope="module")
def killed_mid_write(driver, tmp_path_factory):
    """A sweep killed while the 3rd unit's temporary file is written (fsync hangs), then resumed."""
    base = tmp_path_factory.mktemp("midwrite")
    out, units = base / "out", base / "out" / ".units" / "sweep"
    victim = _start(driver, out, base / "first.log", pause=0.0, block_at=3)
    blocked = base / "first.log.blocked"
    _wait_for(blocked.exists, victim)
    _kill(victim)
    state = {
        "at_kill": _units(units),
        "tmp_at_kill": sorted(p.name for p in units.iterdir() if p.name.endswith(".tmp")),
    }
    resumed = _start(driver, out, base / "second.log", pause=0.0)
    _finish(resumed)
    state.update(base=base, out=out, units=units)
    return state


def test_sigkill_during_a_unit_write_leaves_no_partial_unit_and_resumes(
    killed_mid_write, reference
):
    s = killed_mid_write
    # Two units were complete; the third existed only as a temporary file (never as a partial unit).
    assert len(s["at_kill"]) == 2
    assert len(s["tmp_at_kill"]) == 1
    _assert_same_outputs(s["out"], _reference_out(reference))
    assert set(_log(s["base"] / "second.log", "computed")) == set(_units(s["units"])) - set(
        s["at_kill"]
    )


def test_sigkill_during_a_unit_write_leaves_no_tmp_file_after_resume(killed_mid_write):
    assert not list(killed_mid_write["out"].rglob("*.tmp"))


# --------------------------------------------------------------------------------------------------
# UnitStore in-process: exceptions and failing writes
# --------------------------------------------------------------------------------------------------

IDS = [f"u{i}" for i in range(5)]


def _value(uid: str) -> dict:
    i = int(uid[1:])
    return {
        "unit": uid,
        "value": i * i / 7.0,
        "nested": {"inf": float("inf"), "list": [i, i + 0.5]},
    }


def test_compute_raising_midway_keeps_earlier_units_and_restart_computes_only_the_rest(tmp_path):
    folder = tmp_path / "units"
    store = UnitStore(folder)
    calls: list[str] = []

    def flaky(uid):
        calls.append(uid)
        if uid == "u2":
            raise RuntimeError("boom (injected)")
        return _value(uid)

    with pytest.raises(RuntimeError, match="boom"):
        store.run(IDS, flaky)
    assert calls == ["u0", "u1", "u2"]
    assert [store.done(u) for u in IDS] == [True, True, False, False, False]
    # exactly the two completed units: nothing partial, no temporary file
    assert sorted(p.name for p in folder.iterdir()) == sorted(store.path(u).name for u in IDS[:2])

    calls2: list[str] = []

    def good(uid):
        calls2.append(uid)
        return _value(uid)

    results = UnitStore(folder).run(IDS, good)
    assert calls2 == ["u2", "u3", "u4"]
    # JSON round trip: floats exactly, +inf kept as the string 'inf' (strict JSON)
    expected = [
        dict(_value(u), nested={"inf": "inf", "list": _value(u)["nested"]["list"]}) for u in IDS
    ]
    assert results == expected
    # a third run computes nothing and returns the same
    assert UnitStore(folder).run(IDS, lambda u: pytest.fail(f"recomputed {u}")) == expected


def test_failure_inside_the_atomic_write_leaves_no_partial_or_tmp_file(tmp_path, monkeypatch):
    folder = tmp_path / "units"
    store = UnitStore(folder)
    real_replace = os.replace
    count = [0]

    def replace_failing_on_second(src, dst):
        count[0] += 1
        if count[0] == 2:
            raise OSError("disk full (injected)")
        return real_replace(src, dst)

    monkeypatch.setattr(cbdp_io.os, "replace", replace_failing_on_second)
    calls: list[str] = []
    with pytest.raises(OSError, match="injected"):
        store.run(IDS, lambda u: calls.append(u) or _value(u))
    monkeypatch.undo()
    assert calls == ["u0", "u1"]
    assert [p.name for p in folder.iterdir()] == [
        store.path("u0").name
    ]  # the temp file was removed
    calls.clear()
    UnitStore(folder).run(IDS, lambda u: calls.append(u) or _value(u))
    assert calls == ["u1", "u2", "u3", "u4"]


def test_unserialisable_result_stores_nothing(tmp_path):
    store = UnitStore(tmp_path / "units")
    with pytest.raises(TypeError):
        store.save("bad", {"x": object()})
    assert not store.done("bad")
    assert list((tmp_path / "units").iterdir()) == []


# --------------------------------------------------------------------------------------------------
# cbdp reproduce paper --quick, killed and resumed (needs the figure experiments)
# --------------------------------------------------------------------------------------------------


def _normalised_json(path: Path, root: Path):
    return _strip(json.loads(path.read_text().replace(str(root), "<OUT>")))


@pytest.mark.slow
def test_cbdp_reproduce_paper_quick_resumes_after_sigkill(tmp_path):
    from cbdp_jax.experiments import PAPER_FIGURES, available

    present = [n for n in PAPER_FIGURES if n in available()]
    if len(present) < 2:
        pytest.skip(f"needs >= 2 paper experiments installed, found {present}")
    cli = [sys.executable, "-m", "cbdp_jax.cli", "reproduce", "paper", "--quick", "--out"]
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    ref = subprocess.Popen([*cli, str(ref_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    victim = subprocess.Popen([*cli, str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    units = run_dir / ".units" / "reproduce-quick"
    _wait_for(lambda: units.is_dir() and any(units.glob("*.json")), victim, timeout=600)
    _kill(victim)
    at_kill = {json.loads(p.read_text())["unit"] for p in units.glob("*.json")}
    assert 1 <= len(at_kill) < len(present)
    resumed = subprocess.run([*cli, str(run_dir)], capture_output=True, text=True, timeout=1200)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for exp in at_kill:
        assert f"== {exp}:" in resumed.stdout and "(done earlier, skipped)" in resumed.stdout
    ref_out, ref_err = ref.communicate(timeout=1200)
    assert ref.returncode == 0, ref_err[-3000:]
    csvs = sorted(p.relative_to(ref_dir) for p in ref_dir.rglob("*.csv"))
    assert csvs and csvs == sorted(p.relative_to(run_dir) for p in run_dir.rglob("*.csv"))
    for rel in csvs:
        assert (run_dir / rel).read_bytes() == (ref_dir / rel).read_bytes(), rel
    jsons = sorted(p.relative_to(ref_dir) for p in ref_dir.rglob("*.json"))
    assert jsons == sorted(p.relative_to(run_dir) for p in run_dir.rglob("*.json"))
    for rel in jsons:
        assert _normalised_json(run_dir / rel, run_dir) == _normalised_json(ref_dir / rel, ref_dir)
    assert not list(tmp_path.rglob("*.tmp"))
    assert len(list(units.glob("*.json"))) == len(present)


@pytest.mark.slow
def test_cbdp_reproduce_convexity_killed_mid_experiment_resumes_per_unit(tmp_path):
    """SIGKILL inside the convexity experiment: the resumed run recomputes no finished lambda."""
    cli = [sys.executable, "-m", "cbdp_jax.cli", "reproduce", "convexity", "--quick", "--out"]
    out = tmp_path / "run"
    units = out / ".units" / "convexity-quick"
    victim = subprocess.Popen([*cli, str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for(lambda: units.is_dir() and len(list(units.glob("*.json"))) >= 3, victim, timeout=900)
    _kill(victim)
    at_kill = {json.loads(p.read_text())["unit"] for p in units.glob("*.json")}
    assert 3 <= len(at_kill) < 9  # the kill landed inside the experiment (9 units in quick mode)
    resumed = subprocess.run([*cli, str(out)], capture_output=True, text=True, timeout=1200)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    computed = [
        line.split(" computed ", 1)[1].split(" in ")[0]
        for line in resumed.stdout.splitlines()
        if line.startswith("[convexity ") and " computed " in line
    ]
    assert set(computed).isdisjoint(at_kill) and len(computed) == 9 - len(at_kill)
    assert f"{len(at_kill)} of 9 units done earlier (reused, not recomputed)" in resumed.stdout
    assert len(list(units.glob("*.json"))) == 9 and (out / "convexity.json").exists()
