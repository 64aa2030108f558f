"""Runs sharded over devices and processes (cbdp_jax._src.infra.sharded_runs): the same runs for the same key
whatever the devices, the chunking or the processes; short calls with a progress hook."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

from cbdp_jax import training_audit as ta
from cbdp_jax._src.infra import sharded_runs as sr
from cbdp_jax._src.infra.launch import launch

# the probes of the step's noise are tested in tests/test_noise_probes.py; here they are skipped
pytestmark = pytest.mark.usefixtures("no_noise_probes")

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(data="synthetic", n=31, sampler="poisson", rate=0.25, steps=4, noise=1.0, chunk=64)
RUNS = 96


def _run(key, scale):
    x = jax.random.normal(key, (3,))
    return {"sum": x.sum() * scale, "x": x}


@pytest.mark.parametrize("chunk", [None, 7, 512])
def test_sharded_runs_are_the_runs_of_split_keys_whatever_the_chunk(chunk):
    key, n = jax.random.key(5), 1000
    want = jax.vmap(_run, in_axes=(0, None))(jax.random.split(key, n), 2.0)
    seen = []
    got = sr.sharded_runs(_run, key, n, 2.0, chunk=chunk, progress=seen.append)
    np.testing.assert_array_equal(got["x"], np.asarray(want["x"]))  # the same keys, bit for bit
    np.testing.assert_allclose(got["sum"], np.asarray(want["sum"]), rtol=1e-6, atol=1e-6)
    assert [p.done for p in seen] == sorted(p.done for p in seen) and seen[-1].done == n
    assert all(p.total == n for p in seen)
    # negative control: another key gives other runs
    other = sr.sharded_runs(_run, jax.random.key(6), n, 2.0, chunk=chunk)
    assert np.mean(other["x"] == got["x"]) < 0.01


@pytest.mark.parametrize("start,size", [(0, 5), (37, 100), (2**32 - 3, 6)])
def test_block_keys_are_slices_of_jax_random_split(start, size):
    key = jax.random.key(11)
    if start + size > 2**20:  # too many to split here: distinct keys across the 2^32 boundary
        got = np.asarray(jax.random.key_data(sr._block_keys(key, start, size)))
        assert got.shape == (size, 2) and len({tuple(r) for r in got}) == size
        return
    want = jax.random.key_data(jax.random.split(key, start + size + 3))[start : start + size]
    got = jax.random.key_data(sr._block_keys(key, start, size))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_the_host_split_fallback_gives_the_same_runs(monkeypatch):
    key = jax.random.key(2)
    a = sr.sharded_runs(_run, key, 300, 1.0, chunk=16)
    monkeypatch.setattr(sr, "_counter_keys_agree", lambda: False)
    b = sr.sharded_runs(_run, key, 300, 1.0, chunk=16)
    np.testing.assert_array_equal(a["x"], b["x"])


_WORKER = textwrap.dedent(
    """
    import sys, json, time
    import numpy as np
    from cbdp_jax._src.infra.launch import ProcessSpec, exit_with_launcher, initialize
    spec = ProcessSpec.from_env()
    if spec is not None:
        initialize(spec)
        exit_with_launcher()
    import jax
    from cbdp_jax import training_audit as ta
    problem = ta.build_problem(**json.loads(sys.argv[2]))
    prep = ta.prepare(problem)
    out = ta.training_runs(jax.random.key(7), problem, int(sys.argv[3]), prep=prep)
    if jax.process_index() == 0:
        np.save(sys.argv[1], out.score)
        print("devices", len(jax.devices()), "processes", jax.process_count())
    """
)


def _one_device_scores() -> np.ndarray:
    problem = ta.build_problem(**SMALL)
    return ta.training_runs(jax.random.key(7), problem, RUNS, prep=ta.prepare(problem)).score


def _env(**extra) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", **extra}


def test_training_runs_on_two_cpu_devices_equal_one_device(tmp_path):
    import json

    worker = tmp_path / "worker.py"
    worker.write_text(_WORKER)
    out = tmp_path / "two.npy"
    env = _env(XLA_FLAGS="--xla_force_host_platform_device_count=2")
    done = subprocess.run(
        [sys.executable, str(worker), str(out), json.dumps(SMALL), str(RUNS)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "devices 2 processes 1" in done.stdout
    two, one = np.load(out), _one_device_scores()
    # each run is the same computation on either device; only XLA's vectorisation of the block
    # may reassociate float32 sums (1e-6 relative, the tolerance)
    np.testing.assert_allclose(two, one, rtol=1e-6, atol=1e-6)
    assert np.ptp(one) > 1.0  # negative control: the runs differ, so equality is not trivial


@pytest.mark.slow
@pytest.mark.ci
def test_training_runs_in_two_processes_equal_one_process(tmp_path):
    import json

    worker = tmp_path / "worker.py"
    worker.write_text(_WORKER)
    out = tmp_path / "two.npy"
    launch(
        [str(worker), str(out), json.dumps(SMALL), str(RUNS)], 2, devices_per_process=1,
        log_dir=tmp_path / "logs", timeout=600, env={"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip
    assert "devices 2 processes 2" in (tmp_path / "logs" / "process-0.log").read_text()
    np.testing.assert_allclose(np.load(out), _one_device_scores(), rtol=1e-6, atol=1e-6)


def test_audit_training_reports_the_runs_of_both_sides_to_a_progress_hook():
    problem = ta.build_problem(**SMALL)
    seen = []
    config = ta.training_audit_config(2.0, samples=200)
    ta.audit_training(jax.random.key(0), problem, config=config, progress=seen.append)
    done = [p.done for p in seen]
    assert done == sorted(done) and done[-1] == 400 and all(p.total == 400 for p in seen)
    assert any(p.done == 200 for p in seen)  # D's 200 runs, then D''s
    assert all(p.eta >= 0 for p in seen) and seen[-1].eta == 0


_INTERRUPTED = textwrap.dedent(
    """
    import signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (test_interrupt.py)
    import jax, jax.numpy as jnp
    from cbdp_jax._src.infra.sharded_runs import sharded_runs

    def run(key, _):  # about 2 ms a run on a CPU core: a long job of short blocks
        x = jax.random.normal(key, (64, 64))
        return jax.lax.fori_loop(0, 200, lambda i, y: jnp.tanh(y @ x), x).sum()

    def hook(p):
        print("block", p.done, p.total, flush=True)

    try:
        sharded_runs(run, jax.random.key(0), 10**7, 0.0, progress=hook)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
    """
)


def test_ctrl_c_stops_a_long_job_within_about_two_blocks(tmp_path):
    # Blocks are sized to about half a second once compiled; one is in flight while the previous one's
    # outputs come back, so SIGINT lands within about two blocks, 1 s (measured 1.35 s with the
    # process's exit, load 8 on 2 cores). 4 s leaves room for a loaded machine; without the blocks
    # the 10^7 runs would take hours.
    import signal
    import time

    script = tmp_path / "long.py"
    script.write_text(_INTERRUPTED)
    proc = subprocess.Popen(
        [sys.executable, str(script)], env=_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        blocks = 0
        while blocks < 4:  # past the compilations and the sizing
            line = proc.stdout.readline()
            assert line, "the job ended before it was interrupted"
            blocks += line.startswith("block")
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=60)[0]
        waited = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == 130 and "interrupted" in rest
    print(f"stopped {waited:.2f} s after SIGINT")  # shown with -s
    assert waited < 4.0, waited
