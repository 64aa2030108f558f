"""What a new user hit (issue 49): one line naming the user's file and line, a debug switch for the
traceback, a sweep that runs only when asked, sizes refused by memory, and output that says what it
means."""

from __future__ import annotations

import sys
import textwrap

import pytest

from cbdp_jax import cli


def _run(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["cbdp", *args])
    with pytest.raises(SystemExit) as info:
        cli.main()
    out, err = capsys.readouterr()
    return info.value.code, out, err


MECH = textwrap.dedent(
    """\
    import numpy as np


    def raises(rng, d, n):
        x = np.sum(d)
        return helper(x, n)


    def helper(x, n):
        raise ValueError("my own bug")
    """
)


def test_a_users_exception_is_one_line_naming_their_file_and_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "mech.py").write_text(MECH)
    monkeypatch.chdir(tmp_path)
    args = ("audit", "mech.py:raises", "--claim", "pure:1", "--d", "[1]", "--d-prime", "[0]",
            "--samples", "1000")  # fmt: skip
    monkeypatch.delenv("CBDP_DEBUG", raising=False)
    code, _, err = _run(monkeypatch, capsys, *args)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert (
        "ValueError: my own bug, at mech.py:10" in err
    )  # the line that raised, in the user's file
    # The debug switch prints the traceback through the user's frames, then the same line.
    code, _, err = _run(monkeypatch, capsys, "--debug", *args)
    assert code == 2 and "Traceback (most recent call last)" in err
    assert 'mech.py", line 6, in raises' in err and 'mech.py", line 10, in helper' in err
    assert err.strip().splitlines()[-1].startswith("error: mechanism mech.py:raises is invalid")
    monkeypatch.setenv("CBDP_DEBUG", "1")  # the same by the environment
    code, _, err = _run(monkeypatch, capsys, *args)
    assert code == 2 and "Traceback (most recent call last)" in err


def test_exact_sigma_1e_300_is_one_line_and_an_unexpected_exception_too(monkeypatch, capsys):
    monkeypatch.delenv("CBDP_DEBUG", raising=False)
    code, _, err = _run(monkeypatch, capsys, "exact", "--mechanism", "gaussian", "--sigma", "1e-300",
                        "--adversary", "linear", "--divergence", "kl")  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1, err  # refused: beyond float64
    assert "sigma=1e-300 is invalid" in err and "float64" in err and "Traceback" not in err
    # An exception no check catches: one line with its place, exit 1; the full traceback with --debug
    import cbdp_jax.cli.exact as exact_cli

    def boom(*a, **k):
        return 1.0 / 0.0

    monkeypatch.setattr(exact_cli, "_noise_pair", boom)
    code, _, err = _run(monkeypatch, capsys, "exact")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ZeroDivisionError: float division by zero, at ")
    assert "test_new_user.py" in err and "--debug" in err and "CBDP_DEBUG=1" in err
    monkeypatch.setattr(sys, "argv", ["cbdp", "--debug", "exact"])
    with pytest.raises(ZeroDivisionError):
        cli.main()


def test_exact_gaussian_kl_beyond_float64_is_refused_and_just_inside_it_is_a_number():
    from cbdp_jax import exact
    from cbdp_jax._src.validation import InvalidParameterError

    with pytest.raises(InvalidParameterError, match=r"sigma=1e-300 is invalid.*sigma >= 1.23e-154"):
        exact.restricted_divergence(exact.gaussian_pair(1e-300, 1.0), "kl", "linear")
    # Negative control: at sigma = 1e-150 the value 1 / (2 sigma^2) = 5e299 is representable.
    got = exact.restricted_divergence(exact.gaussian_pair(1e-150, 1.0), "kl", "linear").value
    assert got == pytest.approx(5e299, rel=1e-12)


WRONG_WIDTH = textwrap.dedent(
    """\
    import numpy as np
    from flax import nnx

    from cbdp_jax import training_audit as ta


    def squared(model, x, y):
        return ((model(x)[:, 0] - y) ** 2).mean()


    def make_problem(width=4):
        x = np.random.default_rng(0).normal(size=(63, 4)).astype(np.float32)
        y = x @ np.array([0.0, 1.0, -0.5, 0.25], np.float32)
        step = ta.dp_sgd(learning_rate=0.1, l2_norm_clip=1.0, noise_multiplier=1.0,
                         expected_batch_size=8.0)
        return ta.TrainingProblem(
            model=nnx.Linear(width, 1, rngs=nnx.Rngs(0)), data=(x, y), step=step,
            sampler=ta.BatchSampler(kind="poisson", rate=0.125), steps=8, noise_multiplier=1.0,
            l2_norm_clip=1.0, loss_fn=squared)


    def wrong_width():
        return make_problem(width=5)
    """
)


def test_a_model_of_another_input_width_is_one_line_naming_the_users_file(tmp_path, monkeypatch):
    from cbdp_jax._src.training_problem import load_problem
    from cbdp_jax._src.validation import InvalidParameterError

    (tmp_path / "my_train.py").write_text(WRONG_WIDTH)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidParameterError) as info:
        load_problem("my_train.py:wrong_width")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("problem='my_train.py:wrong_width' is invalid")
    assert "x [4] per example" in msg and "at my_train.py:8" in msg  # the loss's call of the model
    # Negative control: the right width loads.
    assert load_problem("my_train.py:make_problem").steps == 8


def test_sweep_without_a_grid_refuses_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(monkeypatch, capsys, "sweep")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "epsilon=None, out=None is invalid" in err and "--epsilon 0.5,1,2 --out" in err
    assert list(tmp_path.iterdir()) == []  # no ./sweep/sweep.json, no folder
    code, _, err = _run(monkeypatch, capsys, "sweep", "--mechanism", "gaussian", "--out", "o")
    assert code == 2 and "sigma=None is invalid" in err and not (tmp_path / "o").exists()
    # the example is in its help
    monkeypatch.setattr(sys, "argv", ["cbdp", "sweep", "--help"])
    with pytest.raises(SystemExit):
        cli.main()
    assert "--epsilon 0.5,1,2" in " ".join(capsys.readouterr().out.split())
