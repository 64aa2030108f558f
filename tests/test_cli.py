"""The `cbdp` command line, run as a user would (a subprocess), checked against independent values."""

import json
import math
import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "cbdp_jax.cli"]


def run(*args, check=True):
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(proc.stderr)
    return proc


def test_exact_json_matches_closed_form():
    out = json.loads(
        run(
            "exact",
            "--mechanism",
            "laplace",
            "--epsilon",
            "1",
            "--adversary",
            "linear",
            "--divergence",
            "kl",
            "--format",
            "json",
        ).stdout
    )
    e = 1.0
    closed = math.log(1 - ((1 - math.sqrt(1 + e * e)) / e) ** 2) + math.sqrt(1 + e * e) - 1
    assert out["value"] == pytest.approx(closed, rel=1e-6)
    for key in ("value", "divergence", "adversary", "mechanism", "epsilon", "sensitivity"):
        assert key in out


def test_exact_unrestricted_renyi_gaussian():
    out = json.loads(
        run(
            "exact",
            "--mechanism",
            "gaussian",
            "--sigma",
            "2",
            "--adversary",
            "unrestricted",
            "--divergence",
            "renyi",
            "--alpha",
            "3",
            "--format",
            "json",
        ).stdout
    )
    assert out["value"] == pytest.approx(3 / (2 * 4), rel=1e-6)  # alpha / (2 sigma^2)


def test_estimate_json_has_the_documented_keys_and_writes_files(tmp_path):
    proc = run(
        "estimate",
        "--mechanism",
        "laplace",
        "--adversary",
        "linear",
        "--samples",
        "20000",
        "--steps",
        "300",
        "--ensemble",
        "2",
        "--format",
        "json",
        "--out",
        str(tmp_path),
    )
    rec = json.loads(proc.stdout)
    for key in ("estimate", "lower_bound", "confidence", "std_error", "samples", "device"):
        assert key in rec
    # held-out estimate of (lin, KL) = 0.225987 within 4 SE + optimisation allowance
    assert abs(rec["estimate"] - 0.225987) < 4 * rec["std_error"] + 0.01
    assert (tmp_path / "result.json").exists() and (tmp_path / "curve.png").exists()
    # rerun from the saved JSON reproduces the numbers bit for bit
    again = run("rerun", str(tmp_path / "result.json"), "--format", "json")
    assert "identical" in again.stderr
    assert json.loads(again.stdout)["estimate"] == rec["estimate"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["exact", "--epsilon", "0"], "epsilon"),
        (["exact", "--mechanism", "gaussian", "--sigma", "-1"], "sigma"),
        (["exact", "--divergence", "renyi", "--alpha", "0.5"], "alpha"),
        (["exact", "--divergence", "renyi", "--alpha", "1"], "KL"),
        (["exact", "--adversary", "poly", "--degree", "0"], "degree"),
        (["exact", "--mechanism", "cauchy"], "mechanism"),
        (["exact", "--sensitivity", "1,a"], "sensitivity"),
        (["estimate", "--adversary", "transformer"], "adversary"),
        (["estimate", "--divergence", "kl2"], "divergence"),
        (["estimate", "--samples", "1"], "samples"),
        (["reproduce", "fig9", "--out", "x"], "experiment"),
    ],
)
def test_bad_input_is_one_line_exit_2_without_traceback(args, needle):
    proc = run(*args, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0]
    assert "Traceback" not in proc.stderr
