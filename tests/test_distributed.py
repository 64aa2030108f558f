"""Multi-process sweeps: N local processes joined by jax.distributed (gloo), results, failures, resume.

Every test starts its processes through subprocesses with timeouts and checks that none is left running.
The default run has the 2-process x 2-device sweep against the 1-process x 4-device run, the launcher's
failure handling on tiny workers, and a killed sweep worker; the resume test is marked slow.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cbdp_jax._src.infra.launch import DistributedError, ProcessSpec, free_port, launch
from cbdp_jax._src.infra.validation import InvalidParameterError

ROOT = Path(__file__).resolve().parents[1]
GRID = [
    "--epsilon", "0.5,2", "--adversary", "linear", "--divergence", "renyi", "--alpha", "2,4",
    "--seeds", "2", "--steps", "50", "--eval-every", "25", "--batch-size", "256",
    "--val-samples", "1024", "--test-samples", "2000", "--eval-chunk", "1000",
]  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not running
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False


def _sweep(out: Path, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "cbdp_jax.cli", "sweep", *GRID, "--out", str(out), *extra]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout)


def _rows(out: Path) -> tuple[dict, np.ndarray]:
    record = json.loads((out / "sweep.json").read_text())
    keys = ("estimate", "lower_bound", "std_error", "val_objective")
    return record, np.array([[r[k] for k in keys] for r in record["rows"]], dtype=float)


@pytest.mark.slow
@pytest.mark.ci
def test_two_processes_of_two_devices_match_one_process(tmp_path):
    two = _sweep(tmp_path / "two", "--processes", "2", "--devices-per-process", "2")
    assert two.returncode == 0, two.stderr + two.stdout
    one = _sweep(tmp_path / "one", "--devices-per-process", "4")
    assert one.returncode == 0, one.stderr + one.stdout
    rec2, x2 = _rows(tmp_path / "two")
    rec1, x1 = _rows(tmp_path / "one")
    assert (rec2["processes"], rec2["devices"], rec2["written_by_process"]) == (2, 4, 0)
    assert (rec1["processes"], rec1["devices"]) == (1, 4)
    assert x2.shape == (8, 4) and np.all(np.isfinite(x2[:, 0]))
    for a, b in zip(x2[:, 0], x1[:, 0], strict=True):  # shown with pytest -s
        print(f"estimate 2 processes x 2 devices {a:.9f}   1 process x 4 devices {b:.9f}")
    print(f"max abs difference over estimate, bound, SE, validation: {np.max(np.abs(x2 - x1)):.2e}")
    np.testing.assert_allclose(x2, x1, rtol=1e-5, atol=1e-6)
    # Negative control: the rows differ across the grid, so equal tables are not a trivial match.
    assert np.ptp(x2[:, 0]) > 0.5
    # Process 0 wrote the results; the workers' logs and pids are the launcher's.
    files = {str(p.relative_to(tmp_path / "two")) for p in (tmp_path / "two").rglob("*")}
    assert {"sweep.json", ".launch/process-0.log", ".launch/process-1.log"} <= files
    assert len([f for f in files if f.startswith(".units/sweep/")]) == 2
    for pid in json.loads((tmp_path / "two" / ".launch" / "pids.json").read_text()):
        assert not _alive(pid)


def test_process_spec_errors_name_the_parameter():
    with pytest.raises(InvalidParameterError, match=r"process_id=2 is invalid: must be in 0 .. "):
        ProcessSpec("127.0.0.1:1234", 2, 2)
    with pytest.raises(InvalidParameterError, match="coordinator='localhost' is invalid"):
        ProcessSpec("localhost", 2, 0)
    with pytest.raises(InvalidParameterError, match="heartbeat_timeout=1 is invalid"):
        ProcessSpec("127.0.0.1:1234", 2, 0, heartbeat_timeout=1)
    assert free_port() != 0


_DIE_OR_HANG = (
    "import os, sys, time; i = int(os.environ['CBDP_PROCESS_ID']); print('up', i, flush=True);"
    "time.sleep(0.5); sys.exit(3) if i == 1 else time.sleep(600)"
)


def test_launcher_names_the_dead_process_and_stops_a_hanging_one(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(DistributedError) as info:
        launch(["-c", _DIE_OR_HANG], 2, log_dir=tmp_path, grace=2.0, timeout=60)
    message = str(info.value)
    assert "process 1 of 2" in message and "died: exit status 3" in message
    # Negative control for the sweep test below: a worker that does not end itself is stopped by the
    # launcher after the grace period, and the message says so.
    assert "process 0" in message and "stopped by the launcher" in message
    assert time.monotonic() - t0 < 30
    for pid in json.loads((tmp_path / "pids.json").read_text()):
        assert not _alive(pid)


def _wait_for(path: Path, text: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise AssertionError(f"launcher exited early: {proc.communicate()}")
        time.sleep(0.2)
    raise AssertionError(f"{text!r} did not appear in {path} within {timeout} s")


def _start_long_sweep(out: Path, epsilons: str, steps: int) -> subprocess.Popen:
    grid = list(GRID)
    grid[grid.index("--steps") + 1] = str(steps)
    grid[grid.index("--epsilon") + 1] = epsilons
    cmd = [sys.executable, "-m", "cbdp_jax.cli", "sweep", *grid, "--out", str(out),
           "--processes", "2", "--devices-per-process", "2", "--heartbeat-timeout", "4"]  # fmt: skip
    return subprocess.Popen(
        cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _kill_worker(out: Path, index: int) -> list[int]:
    pids = json.loads((out / ".launch" / "pids.json").read_text())
    os.kill(pids[index], signal.SIGKILL)
    return pids


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return proc.returncode, err


@pytest.mark.parametrize("victim", [1, pytest.param(0, marks=pytest.mark.slow)])
def test_killed_worker_ends_the_job_with_a_message_naming_it(tmp_path, victim):
    out = tmp_path / "killed"
    proc = _start_long_sweep(out, "0.5", steps=200_000)
    try:
        _wait_for(out / ".launch" / "process-1.log", "devices; 1 units", proc, timeout=120)
        time.sleep(1.0)
        pids = _kill_worker(out, victim)
        t_kill = time.monotonic()
        code, err = _finish(proc, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    took = time.monotonic() - t_kill
    assert code == 1, err
    other = 1 - victim
    assert f"process {victim} of 2 (pid {pids[victim]}) died: killed by SIGKILL" in err
    # The survivor ended by itself, not by the launcher: process 0 (the coordinator) once the
    # heartbeat timeout (4 s) passed, naming task 1; process 1 when it lost the coordinator.
    assert f"process {other} (pid {pids[other]}) ended by itself" in err, err
    assert f"reported dead: process {victim}" in err, err
    assert took < 4 + 20, took
    assert not (out / "sweep.json").exists()
    for pid in pids:
        assert not _alive(pid)


@pytest.mark.slow
def test_rerun_after_a_kill_resumes_and_matches_a_clean_run(tmp_path):
    out = tmp_path / "resumed"
    proc = _start_long_sweep(out, "0.5,2", steps=50)
    units = out / ".units" / "sweep"
    try:
        _wait_for(out / ".launch" / "process-0.log", "unit 1/2", proc, timeout=240)
        _kill_worker(out, 1)
        code, err = _finish(proc, timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    stored = len(list(units.glob("*.json")))
    assert code != 0 or stored == 2, err  # the kill may land after the last unit
    rerun = _sweep(out, "--processes", "2", "--devices-per-process", "2")
    assert rerun.returncode == 0, rerun.stderr + rerun.stdout
    record, x = _rows(out)
    assert record["units_reused"] >= 1 and record["units_reused"] == stored
    clean = _sweep(tmp_path / "clean", "--devices-per-process", "4")
    assert clean.returncode == 0, clean.stderr
    np.testing.assert_allclose(x, _rows(tmp_path / "clean")[1], rtol=1e-5, atol=1e-6)


_PARENT = (
    "import sys; from cbdp_jax._src.infra.launch import launch; "
    "launch(['-c', sys.argv[1]], 2, log_dir=sys.argv[2], timeout=120)"
)
_CHILD_WATCHED = (
    "from cbdp_jax._src.infra.launch import exit_with_launcher; exit_with_launcher(0.2); "
    "import time; time.sleep(120)"
)
_CHILD_UNWATCHED = "import time; time.sleep(120)"


def _orphans_after_killing_the_launcher(child: str, log_dir: Path, wait: float) -> list[int]:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, child, str(log_dir)], env=_env())
    try:
        deadline = time.monotonic() + 30
        while not (log_dir / "pids.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = json.loads((log_dir / "pids.json").read_text())
        time.sleep(1.5)  # the children are running (and have imported what they import)
    finally:
        parent.kill()
        parent.wait(timeout=30)
    deadline = time.monotonic() + wait  # the watchdog starts once the child's imports are done
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = [pid for pid in pids if _alive(pid)]
    for pid in alive:  # clean up the negative control's orphans
        os.kill(pid, signal.SIGKILL)
    return alive


def test_workers_end_when_the_launcher_is_killed(tmp_path):
    assert _orphans_after_killing_the_launcher(_CHILD_WATCHED, tmp_path / "watched", 20) == []
    # Negative control: a worker without the watchdog outlives its killed launcher.
    assert len(_orphans_after_killing_the_launcher(_CHILD_UNWATCHED, tmp_path / "bare", 3)) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--mechanism", "laplace", "--sigma", "1"],
            "sigma='1' is invalid for mechanism 'laplace'",
        ),
        (["--epsilon", "1,x"], "epsilon='1,x' is invalid: must be comma-separated numbers"),
        (["--adversary", "linear", "--width", "8"], "width=8 is invalid for adversary 'linear'"),
        (["--coordinator", "127.0.0.1:5"], "give all three or none"),
        (
            [
                "--coordinator",
                "h:5",
                "--num-processes",
                "2",
                "--process-id",
                "0",
                "--processes",
                "2",
            ],
            "processes=2 is invalid with --coordinator",
        ),  # fmt: skip
        (["--processes", "0"], "processes=0 is invalid"),
    ],
)
def test_sweep_command_errors_name_the_parameter(tmp_path, monkeypatch, capsys, args, message):
    from cbdp_jax import cli

    monkeypatch.setattr(sys, "argv", ["cbdp", "sweep", *args, "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit) as info:
        cli.main()
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert message in err and "Traceback" not in err


def test_launcher_and_job_modules_import_only_the_private_layer():
    import ast

    for name in ("infra/launch.py", "estimator/sweep_job.py"):
        tree = ast.parse((ROOT / "cbdp_jax" / "_src" / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cbdp_jax"):
                assert node.module.startswith("cbdp_jax._src"), (name, node.module)


@pytest.mark.slow
def test_one_process_per_host_with_coordinator_flags_and_no_shared_folder(tmp_path):
    port = free_port()
    flags = ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2"]
    procs = []
    try:
        for i in range(2):  # as on two hosts: each its own --out folder
            cmd = [sys.executable, "-m", "cbdp_jax.cli", "sweep", *GRID, "--out",
                   str(tmp_path / f"host{i}"), *flags, "--process-id", str(i),
                   "--devices-per-process", "2"]  # fmt: skip
            procs.append(subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert [p.returncode for p in procs] == [0, 0]
    record, x = _rows(tmp_path / "host0")
    assert (record["processes"], record["devices"], x.shape[0]) == (2, 4, 8)
    assert "8 members" in outs[0] and "members" not in outs[1]
    assert list((tmp_path / "host1").rglob("*")) == []  # process 1 wrote nothing
