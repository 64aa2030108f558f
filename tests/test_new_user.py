"""What a new user hit (issue 49): one line naming the user's file and line, a debug switch for the
traceback, a sweep that runs only when asked, sizes refused by memory, and output that says what it
means."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

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
    # An exception no check catches: one line with its place, exit 4 (never a verdict's 1 or 3); the
    # full traceback with --debug
    import cbdp_jax.cli.exact as exact_cli

    def boom(*a, **k):
        return 1.0 / 0.0

    monkeypatch.setattr(exact_cli, "_noise_pair", boom)
    code, _, err = _run(monkeypatch, capsys, "exact")
    assert code == 4 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ZeroDivisionError: float division by zero, at ")
    assert "test_new_user.py" in err and "--debug" in err and "CBDP_DEBUG=1" in err
    monkeypatch.setattr(sys, "argv", ["cbdp", "--debug", "exact"])
    with pytest.raises(ZeroDivisionError):
        cli.main()


def test_exact_gaussian_kl_beyond_float64_is_refused_and_just_inside_it_is_a_number():
    from cbdp_jax import exact
    from cbdp_jax._src.infra.validation import InvalidParameterError

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
    from cbdp_jax._src.infra.validation import InvalidParameterError
    from cbdp_jax._src.training_auditor.problem import load_problem

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


def test_calibrate_gaussian_kl_over_several_steps_is_the_closed_form():
    # T steps of N(0, s^2) vs N(1, s^2), linear class, KL: T / (2 s^2) (log p/q affine in the sum),
    # so the target 1 needs s = sqrt(T / 2). It raised TypeError for T > 1 (the structural value
    # has no solver solution to take a slope from).
    from cbdp_jax.calibration import calibrate

    for steps in (1, 10, 1000):
        res = calibrate("gaussian", 1.0, "linear", "kl", steps=steps)
        assert res.noise == pytest.approx((steps / 2.0) ** 0.5, rel=1e-6)
        assert res.value == pytest.approx(1.0, rel=1e-8)


# ---------------------------------------------------------------------------------------------
# sizes: refused by the memory held at once, never by a count of streamed work
# ---------------------------------------------------------------------------------------------

GIB = 2**30


@pytest.fixture()
def sixteen_gib(monkeypatch):
    from cbdp_jax._src.infra import sizes

    monkeypatch.setattr(sizes, "available_bytes", lambda **_: 16 * GIB)


def test_audit_sizes_refuse_by_memory_and_keep_streamed_training_runs(sixteen_gib):
    from cbdp_jax._src.infra import sizes
    from cbdp_jax._src.infra.validation import InvalidParameterError
    from cbdp_jax.cli.audit_training import _check_runs_fit

    # 10^11 samples per side: 2 x 10^11 x 144 bytes, far beyond 16 GiB
    assert sizes.audit_bytes(10**11) == 2 * 10**11 * 144
    with pytest.raises(InvalidParameterError, match=r"samples=100000000000 is invalid: .* GiB of"):
        sizes.check_memory_for_audit(10**11, 20_000, 1)
    # A training audit streams its runs (chunks of trainings); only the scores are held: 10^7 runs
    # per side hold about 2.7 GiB, allowed on a 16 GiB machine; 10^11 are refused naming --runs.
    assert sizes.audit_bytes(10**7, 1) < 3 * GIB
    _check_runs_fit(10**7)
    with pytest.raises(
        InvalidParameterError, match=r"runs=100000000000 is invalid.*use fewer runs"
    ):
        _check_runs_fit(10**11)
    # The output's width counts: a 10-value output holds 2.5x a 1-value one (360 vs 144 per sample).
    assert sizes.audit_bytes(10**6, 10) == 2.5 * sizes.audit_bytes(10**6, 1)


def test_a_huge_audit_is_refused_before_any_draw(tmp_path, monkeypatch, capsys, sixteen_gib):
    from cbdp_jax._src.mechanism_auditor import loading as audit_io

    (tmp_path / "mech.py").write_text(
        "import numpy as np\n\ndef m(rng, d, n):\n    return np.sum(d) + rng.laplace(0, 2, n)\n"
    )
    monkeypatch.chdir(tmp_path)

    def never(*a, **k):
        raise AssertionError("drew samples")

    monkeypatch.setattr(audit_io.AuditMechanism, "sample", never)
    code, _, err = _run(monkeypatch, capsys, "audit", "mech.py:m", "--claim", "pure:0.5", "--d",
                        "[1,0,1]", "--d-prime", "[1,0,0]", "--samples", "100000000000")  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "samples=100000000000 is invalid" in err and "GiB of memory" in err
    code, _, err = _run(monkeypatch, capsys, "audit", "--suite", "--samples", "100000000000")
    assert code == 2 and "samples=100000000000 is invalid" in err and "case" not in err
    code, _, err = _run(monkeypatch, capsys, "audit-training", "--runs", "100000000000")
    assert code == 2 and "runs=100000000000 is invalid" in err


def test_sweep_sizes_name_the_option_that_holds_the_memory(tmp_path, monkeypatch, capsys,
                                                           sixteen_gib):  # fmt: skip
    from cbdp_jax._src.infra.sizes import sweep_bytes

    monkeypatch.chdir(tmp_path)
    for option in ("--seeds", "--batch-size", "--val-samples", "--eval-chunk"):
        code, _, err = _run(monkeypatch, capsys, "sweep", "--epsilon", "1", "--out", "o", option,
                            "100000000000")  # fmt: skip
        name = option[2:].replace("-", "_")
        assert code == 2 and f"{name}=100000000000 is invalid" in err, err
        assert f"use a smaller {option}" in err and not (tmp_path / "o").exists()
    # Test samples stream chunk by chunk: they do not count (a long sweep stays allowed).
    kw = dict(batch_size=4096, val_samples=8192, eval_chunk=16384, dim=1, units=32)
    assert sweep_bytes(4, **kw) < GIB


@pytest.mark.parametrize("document", ["README.md", "docs/guide/auditing.md"])
def test_the_readme_audit_example_shows_what_the_command_prints(document):
    # docs/make_audit_example.py keeps the command's output (80 columns) in output.txt; the README (an
    # excerpt) and the auditing guide (most rows) show it with rows left out at "...": every other
    # line, in order, is a line of that output.
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    printed = (root / "docs" / "figures" / "audit_example" / "output.txt").read_text().splitlines()
    text = (root / document).read_text()
    block = text.split("cbdp audit: docs/examples/noisy_mean.py:noisy_mean, claim pure:1\n", 1)[1]
    shown = ["cbdp audit: docs/examples/noisy_mean.py:noisy_mean, claim pure:1",
             *block.split("```", 1)[0].splitlines()]  # fmt: skip
    at = 0
    for line in (ln for ln in shown if ln.strip() and ln.strip() != "..."):
        assert line in printed[at:], f"{line!r} is not printed (after line {at})"
        at = printed.index(line, at) + 1
    # the guide's first rows shown are the first printed: eps' = 0.5
    if document.startswith("docs"):
        assert shown[4] == printed[4] and " 0.5 " in shown[4]


# ---------------------------------------------------------------------------------------------
# output that says what it means
# ---------------------------------------------------------------------------------------------

CLAIM = "dpsgd:noise=0.5,rate=0.125,steps=16,delta=1e-05,sampling=poisson,relation=add-remove"


def test_claims_wrap_after_a_comma_never_inside_a_token():
    import textwrap

    from cbdp_jax._src.infra.display import wrap

    text = f"cbdp audit: dp-sgd logreg/synthetic, poisson, claim {CLAIM} = (16.47, 1e-05)-DP"
    lines = wrap(text, 80).splitlines()
    assert max(len(line) for line in lines) <= 80
    tokens = set(CLAIM.split(","))  # every key=value whole on one line
    flat = [piece for line in lines for word in line.split() for piece in word.split(",")]
    assert tokens <= set(flat)
    # Negative control: textwrap cuts the claim inside a token ("de" / "lta=1e-05")
    cut = textwrap.fill(text, 80, subsequent_indent="  ", break_on_hyphens=False).splitlines()
    assert not tokens <= {p for line in cut for word in line.split() for p in word.split(",")}


def test_the_verdict_says_none_where_the_table_does():
    from cbdp_jax import audit as au
    from cbdp_jax._src.mechanism_auditor.verdict import _verdict

    rows = [au.Row("halfspace", "P||Q", 0.25, 0.4479, 0.01, -0.007884, 0.1, False)]
    _, text, *_ = _verdict(rows, au.parse_claim("pure:1"), 1, au.AuditConfig(), 700)
    assert (
        "the strongest certified bound is none (every certified lower bound is at or below 0)"
        in text
    )
    assert "-0.007884" not in text
    # Negative control: a positive bound is printed as a number
    rows = [rows[0]._replace(lower_bound=0.362)]
    _, text, *_ = _verdict(rows, au.parse_claim("pure:1"), 1, au.AuditConfig(), 700)
    assert "the strongest certified bound is 0.362 (halfspace P||Q)" in text


def test_grid_values_are_clean_in_the_json():
    import jax
    import jax.numpy as jnp

    from cbdp_jax import audit as au

    eps = 3.7  # 3.7 * (1 / 3.7) is 0.9999999999999999 in float64
    assert eps * (1.0 / eps) != 1.0
    cfg = au.AuditConfig(samples=2000, classes=("halfspace",), eps_grid=(1.0 / eps, 1.0),
                         tail_bounds=False)  # fmt: skip
    res = au.audit(jax.random.key(0), lambda k, d, n: jnp.sum(d) + jax.random.laplace(k, (n,)),
                   f"pure:{eps}", pair=([1.0], [0.0]), config=cfg)  # fmt: skip
    assert {r.grid for r in res.rows} == {1.0, eps}


def test_the_linear_class_names_its_family_whichever_member_wins():
    import jax
    import numpy as np

    from cbdp_jax._src.mechanism_auditor.hockey_stick import fit_critic

    rng = np.random.default_rng(0)
    xp, xq = rng.laplace(1.0, 1.0, (4000, 1)), rng.laplace(0.0, 1.0, (4000, 1))
    critic = fit_critic(jax.random.key(0), "linear", xp, xq, float(np.e))
    assert critic.label in ("linear (halfspace)", "linear (sigmoid)")
    assert fit_critic(jax.random.key(0), "halfspace", xp, xq, float(np.e)).label == "halfspace"


def test_a_dpsgd_claims_bad_value_is_named():
    from cbdp_jax import audit as au
    from cbdp_jax._src.infra.validation import InvalidParameterError

    with pytest.raises(InvalidParameterError, match=r"noise='abc' must be a number"):
        au.parse_claim("dpsgd:noise=abc,rate=0.1")
    with pytest.raises(
        InvalidParameterError, match=r"missing steps, delta"
    ):  # control: no value bad
        au.parse_claim("dpsgd:noise=1,rate=0.1")


def test_a_training_audit_says_what_d_and_d_prime_are(tmp_path):
    import io
    from contextlib import redirect_stdout

    from cbdp_jax.audit import Row
    from cbdp_jax.cli.audit_training import _emit_training_audit, _pair_text

    problem = SimpleNamespace(name="dp-sgd logreg/synthetic, poisson", sampling_rate=0.125)
    pair = _pair_text(problem, "add-remove")
    assert pair == "D: the canary in; D': its add-remove neighbour, the canary absent"
    training = {"steps": 16, "threat": "gradient", "runs_per_side": 500, "seconds": 3.0,
                "examples": 63, "relation": "add-remove", "pair": pair}  # fmt: skip
    rows = [Row("halfspace", "P||Q", 0.25, 0.4479, 0.3, 0.2, 0.01, False)]
    result = SimpleNamespace(
        mechanism="dp-sgd logreg/synthetic, poisson", claim=CLAIM, pair=([1.0], [0.0]), rows=rows,
        grid_name="epsilon", verdict="no violation certified", violation=False, blind_spots=[],
        to_dict=dict,
    )  # fmt: skip
    buf = io.StringIO()
    with redirect_stdout(buf):
        _emit_training_audit(result, problem, training, "table", None)
    text = buf.getvalue()
    assert f"pair: {pair}" in text and "[1.0]" not in text and "D = " not in text


def test_the_reports_title_is_wrapped_inside_the_page(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from cbdp_jax._src.mechanism_auditor import report as audit_report
    from cbdp_jax.audit import Row

    rows = [Row("halfspace", "P||Q", g, 0.1, 0.05, 0.04, 0.01, False) for g in (0.25, 1.0)]
    result = SimpleNamespace(
        mechanism="my_very_long_experiment_folder/mechanisms/noisy_gradient_release_v2.py:release",
        claim=CLAIM, pair=([1.0], [0.0]), rows=rows, grid_name="epsilon", violation=False,
        confidence=0.95, family_size=4, verdict="no violation certified", samples=1000,
        screened=(), seconds=1.0,
    )  # fmt: skip
    seen = {}

    def keep(fig, path, dpi):
        fig.canvas.draw()
        ax = fig.axes[0]
        seen["title"] = ax.title.get_text()
        seen["inside"] = ax.title.get_window_extent().x0 >= 0 and (
            ax.title.get_window_extent().x1 <= fig.bbox.x1
        )

    orig = audit_report.atomic_savefig
    audit_report.atomic_savefig = keep
    try:
        audit_report.plot_report(result, tmp_path / "report.png", pair_text="D: the canary in")
    finally:
        audit_report.atomic_savefig = orig
    assert "\n" in seen["title"] and seen["inside"]
    assert all(len(line) <= 80 for line in seen["title"].splitlines())


def test_the_step_contract_is_documented_and_true(tmp_path, monkeypatch):
    import jax.numpy as jnp
    import optax

    from cbdp_jax._src.training_auditor.ops import apply_step
    from cbdp_jax._src.training_auditor.problem import TrainingProblem, load_problem

    doc = " ".join(TrainingProblem.__doc__.split())
    guide = Path(__file__).resolve().parents[1] / "docs" / "guide" / "training_audit.md"
    readme = " ".join(guide.read_text().split())  # the README's former section on --problem
    for text in (doc, readme):
        assert (
            "capacity" in text
            and "batch_mask" in text
            and "GradientTransformationExtraArgs" in text
        )
        assert "canary included" in text or "the canary included" in text
    # True: only an extra-args step is passed batch_mask; a plain one is called without it.
    seen = {}

    def plain_update(grads, state, params=None):
        seen["plain"] = True
        return grads, state

    def extra_update(grads, state, params=None, **extra):
        seen["extra"] = extra.get("batch_mask")
        return grads, state

    grads, mask = jnp.zeros((5, 2)), jnp.array([True, True, False, False, False])
    apply_step(optax.GradientTransformation(lambda p: (), plain_update), grads, (), None, mask)
    apply_step(optax.GradientTransformationExtraArgs(lambda p: (), extra_update), grads, (), None,
               mask)  # fmt: skip
    assert seen["plain"] and (seen["extra"] == mask).all()
    # True: the training guide's template's expected batch, 8, is q times D's examples with the canary (64).
    (tmp_path / "my_train.py").write_text(WRONG_WIDTH)
    monkeypatch.chdir(tmp_path)
    problem = load_problem("my_train.py:make_problem")
    assert problem.examples == 64 and problem.sampler.expected_batch(problem.examples) == 8.0
