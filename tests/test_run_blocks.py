"""Checkpoints of many runs (cbdp_jax._src.infra.run_blocks): blocks written as runs finish, a resume loads
them and runs the rest, bit for bit the runs of a call left alone; a folder of another audit or
version is refused; ``cbdp audit-training`` killed with SIGKILL and resumed gives the same JSON."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from cbdp_jax._src.infra import sharded_runs as sr
from cbdp_jax._src.infra.run_blocks import MANIFEST, SECONDS_VARIABLE, RunBlocks
from cbdp_jax._src.infra.validation import InvalidParameterError

ROOT = Path(__file__).resolve().parents[1]


def _run(key, scale):
    x = jax.random.normal(key, (3,))
    return {"x": x * scale, "bits": jax.random.bits(key, (2,), np.uint32)}


def _blocks(folder) -> list[Path]:
    return sorted(Path(folder).glob("*.npz"))


def test_resumed_call_loads_the_done_runs_and_runs_the_rest(tmp_path):
    key, n = jax.random.key(3), 100
    want = sr.sharded_runs(_run, key, n, 2.0, chunk=8)
    blocks = RunBlocks(tmp_path, {"audit": "toy"}, every_seconds=0.0)
    got = sr.sharded_runs(_run, key, n, 2.0, chunk=8, blocks=blocks.part("D"))
    assert len(_blocks(tmp_path)) == 13  # a block per call of 8 runs: 12 full, 1 of 4
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    # a kill after 5 blocks (the later ones never written), and a gap: only 0 .. 40 count
    files = _blocks(tmp_path)
    for f in files[5:7]:
        f.unlink()
    # the first stored block is rewritten with a sentinel: loaded, it shows; recomputed, it would not
    first = files[0]
    with np.load(first) as data:
        leaves = [data[k].copy() for k in sorted(data.files)]
    leaves[0][:] = 12345  # leaf0 is "bits" (the output's leaves in pytree order: bits, x)
    np.savez(first, **{f"leaf{i}": a for i, a in enumerate(leaves)})
    resumed = RunBlocks(tmp_path, {"audit": "toy"}, resume=True, every_seconds=0.0)
    again = sr.sharded_runs(_run, key, n, 2.0, chunk=8, blocks=resumed.part("D"))
    assert np.all(again["bits"][:8] == 12345)  # the stored runs were loaded, not run
    np.testing.assert_array_equal(again["bits"][8:], want["bits"][8:])
    np.testing.assert_array_equal(again["x"], want["x"])
    assert len(_blocks(tmp_path)) == 13  # the runs after the gap written again


def test_checkpointed_call_without_chunk_keeps_one_fixed_chunk(tmp_path):
    key, n = jax.random.key(4), 600
    blocks = RunBlocks(tmp_path, {"audit": "toy"}, every_seconds=0.0)
    got = sr.sharded_runs(_run, key, n, 1.0, blocks=blocks.part("D"))
    chunks = {f.name.split(".c")[-1] for f in _blocks(tmp_path)}
    assert chunks == {f"{sr.steady_chunk(jax.devices(), 4096)}.npz"}
    want = jax.vmap(_run, in_axes=(0, None))(jax.random.split(key, n), 1.0)
    np.testing.assert_array_equal(got["bits"], np.asarray(want["bits"]))


def test_folder_of_another_audit_or_version_is_refused_with_one_line(tmp_path):
    RunBlocks(tmp_path, {"claim": "approx:1,1e-5"})
    RunBlocks(tmp_path, {"claim": "approx:1,1e-5"}, resume=True)  # the same audit: accepted
    with pytest.raises(InvalidParameterError, match="checkpoint=.*another audit") as err:
        RunBlocks(tmp_path, {"claim": "approx:2,1e-5"}, resume=True)
    assert "\n" not in str(err.value)
    record = json.loads((tmp_path / MANIFEST).read_text())
    (tmp_path / MANIFEST).write_text(json.dumps(record | {"version": "0.0.0", "fingerprint": "x"}))
    with pytest.raises(InvalidParameterError, match="written by cbdp_jax 0.0.0") as err:
        RunBlocks(tmp_path, {"claim": "approx:1,1e-5"}, resume=True)
    assert "\n" not in str(err.value)


def test_without_resume_a_folder_starts_afresh(tmp_path):
    blocks = RunBlocks(tmp_path, {"a": 1}, every_seconds=0.0)
    sr.sharded_runs(_run, jax.random.key(0), 16, 1.0, chunk=8, blocks=blocks.part("D"))
    assert len(_blocks(tmp_path)) == 2
    (tmp_path / "mine.npz").write_bytes(b"a file of the user's")
    RunBlocks(tmp_path, {"a": 2})  # another audit, no resume: the old blocks go
    assert _blocks(tmp_path) == [tmp_path / "mine.npz"]  # and nothing else


CLI = [
    "audit-training", "--data", "synthetic", "--examples", "63", "--sampler", "poisson",
    "--rate", "0.125", "--steps", "16", "--noise", "0.5", "--format", "json",
]  # fmt: skip


def _cli(args, env, **kw):
    cmd = [sys.executable, "-m", "cbdp_jax.cli", *CLI, *args]
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw
    )


def _without_times(record):
    if isinstance(record, dict):
        return {k: _without_times(v) for k, v in record.items() if k != "seconds"}
    if isinstance(record, list):
        return [_without_times(v) for v in record]
    return record


@pytest.mark.slow
def test_audit_killed_with_sigkill_and_resumed_gives_the_same_json(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{SECONDS_VARIABLE: "0"})
    runs = ["--runs", "20000"]
    alone = _cli([*runs, "--checkpoint", str(tmp_path / "alone")], env)
    killed_folder = tmp_path / "killed"
    proc = _cli([*runs, "--checkpoint", str(killed_folder)], env)
    deadline = time.monotonic() + 900
    while len(_blocks(killed_folder)) < 90 and proc.poll() is None:  # D's 79 blocks, then D''s
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len(_blocks(killed_folder))
    assert 0 < done < 158, done  # killed half way: some blocks, not all (2 x 79 of 256 runs)
    resumed = _cli([*runs, "--checkpoint", str(killed_folder), "--resume"], env)
    out_resumed, err = resumed.communicate(timeout=900)
    assert resumed.returncode in (0, 1), err[-2000:]
    out_alone, err = alone.communicate(timeout=900)
    assert alone.returncode in (0, 1), err[-2000:]
    a, b = json.loads(out_alone), json.loads(out_resumed)
    assert _without_times(a) == _without_times(b)
    # negative control: another seed is another audit, refused on resume with one line
    other = _cli([*runs, "--checkpoint", str(killed_folder), "--resume", "--seed", "1"], env)
    _, err = other.communicate(timeout=900)
    assert other.returncode == 2 and "checkpoint=" in err and "another audit" in err, err[-2000:]


def test_resume_without_a_checkpoint_folder_is_refused_before_any_work():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = _cli(["--resume"], env)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 2
    assert err.strip().splitlines() == [
        "error: resume=True is invalid without a checkpoint folder: give --checkpoint FOLDER"
    ]
