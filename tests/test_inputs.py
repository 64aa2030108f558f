"""Inputs a new user gave (issue 42): defaults that run, defaults that say so, values that cannot be.

The bad inputs that end in one error line are in tests/test_reliability.py (and docs/errors.md); here
are the ones whose point is what a good run prints, or that need a file.
"""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

CLI = [sys.executable, "-m", "cbdp_jax.cli"]


def _run(*args, **kw):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600, **kw)


def _help_words(command: str) -> str:
    """The command's help at 80 columns as one line of words (the panel's borders removed)."""
    text = _run(command, "--help", env={**os.environ, "COLUMNS": "80"}).stdout
    return " ".join(text.replace("│", " ").split())


def test_calibrate_runs_on_its_own_defaults_and_shows_the_order_it_used():
    proc = _run("calibrate", "--format", "json")
    assert proc.returncode == 0, proc.stderr  # was: "alpha=None is invalid"
    rec = json.loads(proc.stdout)
    assert rec["divergence"] == "renyi" and rec["alpha"] == 2.0
    # the unrestricted Gaussian: Renyi(2) of N(0, s^2) vs N(1, s^2) is 2 / (2 s^2) = 1 at s = 1
    assert rec["unrestricted_sigma"] == pytest.approx(1.0, rel=1e-6)
    table = _run("calibrate", env={**os.environ, "COLUMNS": "80"}).stdout
    assert "alpha" in table and "│ 2 " in table.replace("│ 2.0", "│ 2 ")
    help_text = _help_words("calibrate")
    assert "default 2 with --divergence renyi" in help_text


def test_an_explicit_alpha_and_kl_still_behave():
    kl = json.loads(_run("calibrate", "--divergence", "kl", "--format", "json").stdout)
    assert kl["alpha"] is None
    # KL of the unit-shift Gaussian is 1 / (2 s^2) = 1 at s = 1 / sqrt(2)
    assert kl["unrestricted_sigma"] == pytest.approx(2**-0.5, rel=1e-6)
    four = json.loads(_run("calibrate", "--alpha", "4", "--format", "json").stdout)
    assert four["alpha"] == 4.0 and four["unrestricted_sigma"] == pytest.approx(2**0.5, rel=1e-6)


def test_estimate_says_when_sigma_is_its_default():
    args = ("estimate", "--mechanism", "gaussian", "--adversary", "linear", "--samples", "2000",
            "--steps", "10", "--ensemble", "1", "--format", "json")  # fmt: skip
    default = json.loads(_run(*args).stdout)
    assert default["mechanism_label"].startswith("gaussian sigma=1 (default),")
    given = json.loads(_run(*args, "--sigma", "1").stdout)
    assert given["mechanism_label"].startswith("gaussian sigma=1,")  # given: no "(default)"
    help_text = _help_words("estimate")
    assert "Gaussian noise std (default 1)" in help_text


@pytest.mark.parametrize("dtype, value, refused", [("float32", 1e300, True), ("float32", 1e30, False),
                                                   ("float64", 1e300, False)])  # fmt: skip
def test_sample_files_beyond_the_dtype_are_refused_naming_the_option(
    tmp_path, dtype, value, refused
):
    rng = np.random.default_rng(0)
    p = rng.normal(size=400)
    p[:3] = value
    np.save(tmp_path / "P.npy", p)
    np.save(tmp_path / "Q.npy", rng.normal(1.0, 1.0, size=400))
    args = ("estimate", "--p-samples", str(tmp_path / "P.npy"), "--q-samples",
            str(tmp_path / "Q.npy"), "--adversary", "linear", "--steps", "10", "--ensemble", "1",
            "--dtype", dtype, "--format", "json")  # fmt: skip
    proc = _run(*args)
    if refused:
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith("error: p_samples=") and "3 of its rows" in proc.stderr
        assert "float32's range" in proc.stderr and "RuntimeWarning" not in proc.stderr
    else:  # negative control: values the dtype holds are estimated as before
        assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_out_of_memory_line_names_the_fix_and_only_for_xla_out_of_memory():
    from cbdp_jax._src.infra.sizes import out_of_memory_text

    class JaxRuntimeError(RuntimeError):
        pass

    exc = JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 12000000772 bytes.\nmore")
    text = out_of_memory_text(exc)
    assert text.startswith("out of memory: RESOURCE_EXHAUSTED") and "\n" not in text
    assert "--samples" in text
    assert out_of_memory_text(JaxRuntimeError("INTERNAL: something else")) is None
    assert out_of_memory_text(RuntimeError("RESOURCE_EXHAUSTED")) is None


def test_the_memory_count_matches_the_measured_growth():
    # Measured (module docstring of _src/infra/sizes.py): 780 bytes per training sample at the default
    # mlp(64x2), ensemble 4, float32; the count must be within 10% of it, and the samples alone
    # (18 bytes) are not enough (the negative control: what the count missed before).
    from cbdp_jax._src.infra.sizes import estimate_bytes

    per = (estimate_bytes(2_000_000, None, 1, 4, ensemble=4, units=64)
           - estimate_bytes(500_000, None, 1, 4, ensemble=4, units=64)) / 1.5e6  # fmt: skip
    assert per == pytest.approx(780, rel=0.1)
    alone = (estimate_bytes(2_000_000, None, 1, 4) - estimate_bytes(500_000, None, 1, 4)) / 1.5e6
    assert alone < 0.1 * 780


def test_the_canary_message_is_grammatical():
    from cbdp_jax._src.training_auditor.setups import build_problem

    problem = build_problem(
        model="logreg", data="synthetic", sampler="poisson", noise=1.0, clip=1.0, rate=0.1,
        batch_size=None, steps=2, learning_rate=0.5, threat="gradient", step="dp-sgd", bug="none",
        n=None, seed=0, chunk=16,
    )  # fmt: skip
    with pytest.raises(ValueError) as info:
        dataclasses.replace(problem, threat="white-box")
    assert "needs an input canary" in str(info.value)
    inputs = dataclasses.replace(problem, threat="white-box", canary=input_canary(problem))
    with pytest.raises(ValueError) as info:  # the other way round: the other article
        dataclasses.replace(inputs, threat="gradient")
    assert "needs a gradient canary" in str(info.value)


def input_canary(problem):
    from cbdp_jax._src.training_auditor.setups import input_canary as make

    return make(*(np.asarray(a) for a in problem.data))


def test_a_broken_dp_accounting_install_names_the_package_not_an_extra(monkeypatch):
    # dp-accounting is a core dependency: the message says to reinstall it, not to add an extra.
    from cbdp_jax import InvalidParameterError
    from cbdp_jax._src.privacy import accounting

    accounting._dp_accounting("pld")  # negative control: the installed package imports
    for name in ("dp_accounting", "dp_accounting.pld", "dp_accounting.rdp"):
        monkeypatch.setitem(sys.modules, name, None)  # import of a None entry raises ImportError
    with pytest.raises(InvalidParameterError) as info:
        accounting._dp_accounting("pld")
    message = str(info.value)
    assert "dp-accounting" in message and "[audit]" not in message and "reinstall" in message
