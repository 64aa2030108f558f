"""The `cbdp` command line, run as a user would (a subprocess), checked against independent values."""

import io
import json
import math
import os
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


# ---------------------------------------------------------------------------------------------------
# Tables at 80 columns: every number of the JSON record appears in the table, rounded for reading
# ---------------------------------------------------------------------------------------------------

NARROW = {**os.environ, "COLUMNS": "80"}


def run_narrow(*args):
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600, env=NARROW)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _shown(value) -> str:
    """A JSON number as the table must show it: rounded for reading (the JSON keeps every digit)."""
    from cbdp_jax._src.infra.display import number

    return number(value)


def assert_readable(table: str, numbers) -> None:
    lines = table.splitlines()
    assert lines and max(len(line) for line in lines) <= 80, max(len(line) for line in lines)
    assert "…" not in table  # rich's ellipsis: a cut value
    for number in numbers:
        assert _shown(number) in table, f"{_shown(number)} not shown in full in\n{table}"


EXACT_ARGS = ("exact", "--mechanism", "laplace", "--epsilon", "0.7", "--adversary", "poly",
              "--degree", "2", "--divergence", "renyi", "--alpha", "2.5")  # fmt: skip


def test_exact_table_at_80_columns_shows_every_number():
    table = run_narrow(*EXACT_ARGS).stdout
    record = json.loads(run(*EXACT_ARGS, "--format", "json").stdout)
    assert_readable(table, [record["value"], record["alpha"], record["epsilon"],
                            *record["sensitivity"], record["degree"]])  # fmt: skip
    assert "converged" in table and "true" in table


def test_readability_check_catches_the_old_horizontal_table():
    # Negative control: the one-row table drawn before (every field a column) cuts every number at
    # 80 columns, and the check above rejects it.
    from rich.console import Console
    from rich.table import Table

    record = {"value": 0.4382549309311554, "divergence": "renyi", "alpha": 2.5, "adversary": "poly_2",
              "degree": 2, "mechanism": "laplace", "epsilon": 0.7, "sigma": None,
              "sensitivity": [1.0], "convention": "abs", "converged": True, "reason": None,
              "seconds": 2.318}  # fmt: skip
    table = Table(title="cbdp exact")
    for k in record:
        table.add_column(k)
    table.add_row(*[str(v) for v in record.values()])
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(table)
    with pytest.raises(AssertionError):
        assert_readable(console.export_text(), [record["value"]])


def test_a_value_too_wide_for_its_column_is_wrapped_never_cut():
    from cbdp_jax._src.infra.tables import render_record

    reason = (
        "degree 30 is above the largest degree this family's moments certify; the walk stopped at "
        "degree 22, where the orthonormal basis lost 1e-10 of its orthogonality (docs/theory)"
    )
    numbers = [0.123456789012345 + i for i in range(12)]
    text = render_record("t", [("value", 0.25), ("theta", numbers), ("reason", reason)], 80)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "0.25" in text and all(_shown(x) in text for x in numbers)  # every number, rounded
    assert "0.123456789" not in text  # never in full: 4 significant digits for reading
    words = " ".join(line.strip("│ ") for line in text.splitlines())
    assert all(w in words for w in reason.split())  # every word of the prose, in order, none cut
    assert "use --format json" not in text
    wide = render_record("t", [("value", 0.25), ("alpha", 2.0)], 200)
    # horizontal when it fits: the field names form the header row, the values one row
    assert "┃ value ┃ alpha ┃" in wide and "│ 0.25  │ 2     │" in wide


@pytest.fixture(scope="module")
def narrow_estimate(tmp_path_factory):
    """`cbdp estimate --out DIR` as a table at 80 columns, with the result.json it wrote."""
    out = tmp_path_factory.mktemp("estimate")
    proc = run_narrow("estimate", "--mechanism", "laplace", "--adversary", "linear", "--samples",
                      "20000", "--steps", "300", "--ensemble", "2", "--out", str(out))  # fmt: skip
    return out, proc.stdout, json.loads((out / "result.json").read_text())


def _estimate_numbers(rec):
    counts = rec["sample_counts"]
    return [rec["estimate"], rec["lower_bound"], rec["std_error"], rec["confidence"],
            rec["reference"]["value"], counts["train_p"], counts["val_p"], counts["test_p"]]  # fmt: skip


def test_estimate_record_has_the_documented_keys_and_writes_files(narrow_estimate):
    out, _, rec = narrow_estimate
    for key in ("estimate", "lower_bound", "confidence", "std_error", "samples", "device"):
        assert key in rec
    # held-out estimate of (lin, KL) = 0.225987 within 4 SE + optimisation allowance
    assert abs(rec["estimate"] - 0.225987) < 4 * rec["std_error"] + 0.01
    assert (out / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the counts actually used, and no split (it applies only to estimate_from_samples)
    assert rec["sample_counts"] == {"train_p": 20000, "train_q": 20000, "val_p": 5000,
                                    "val_q": 5000, "test_p": 20000, "test_q": 20000}  # fmt: skip
    assert "split" not in rec["config"]


def test_estimate_table_at_80_columns_shows_every_number(narrow_estimate):
    _, table, rec = narrow_estimate
    assert_readable(table, _estimate_numbers(rec))


def test_rerun_table_at_80_columns_shows_every_number_and_says_identical(narrow_estimate):
    out, _, rec = narrow_estimate
    proc = run_narrow("rerun", str(out / "result.json"))
    assert "identical" in proc.stderr and "DIFFERS" not in proc.stderr
    assert_readable(proc.stdout, _estimate_numbers(rec))


def test_curve_reference_is_the_exact_value(narrow_estimate):
    from cbdp_jax import exact
    from cbdp_jax.cli.estimate import curve_values

    _, _, rec = narrow_estimate
    truth = exact.restricted_divergence(exact.laplace_pair(1.0), "kl", "linear").value
    drawn = curve_values(rec)
    assert drawn["reference"] == rec["reference"]["value"] == pytest.approx(truth, rel=1e-9)
    assert rec["reference"]["kind"] == "exact restricted"
    assert (drawn["estimate"], drawn["lower_bound"]) == (rec["estimate"], rec["lower_bound"])
    assert "laplace eps=1" in drawn["title"] and "linear" in drawn["title"]


@pytest.mark.parametrize(
    "mechanism, params, adversary, options, divergence, alpha, kind",
    [
        ("laplace", {"epsilon": 1.0}, "poly", {"degree": 2}, "renyi", 2.0, "exact restricted"),
        ("gaussian", {"sigma": 2.0}, "linear", {}, "kl", None, "exact restricted"),
        ("laplace", {"epsilon": 1.0}, "mlp", {"width": 8}, "renyi", 4.0, "unrestricted"),
        ("gaussian", {"sigma": 1.0}, "linear", {"bound": 1.0}, "kl", None, "unrestricted"),
        ("randomized_response", {"epsilon": 1.0, "k": 2}, "linear", {}, "kl", None, None),
    ],
)
def test_reference_value_is_the_exact_or_the_unrestricted_value(
    mechanism, params, adversary, options, divergence, alpha, kind
):
    from cbdp_jax import analytic, exact
    from cbdp_jax._src.estimator.reference import reference_for
    from cbdp_jax.adversaries import make_adversary

    spec = make_adversary(adversary, **options)
    ref = reference_for(mechanism, params, spec, divergence, alpha, "D")
    if kind is None:
        assert ref is None
        return
    assert ref.kind == kind
    if kind == "exact restricted":
        pair = exact.laplace_pair(1.0) if mechanism == "laplace" else exact.gaussian_pair(2.0)
        want = exact.restricted_divergence(
            pair, divergence, adversary, degree=options.get("degree", 1), alpha=alpha
        ).value
    elif mechanism == "laplace":
        want = analytic.laplace_renyi(alpha, 1.0)
    else:
        want = analytic.gaussian_kl(1.0)
    assert ref.value == pytest.approx(want, rel=1e-9)
    assert kind in ref.label or ("exact" in ref.label and kind.startswith("exact"))


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


# ---------------------------------------------------------------------------------------------------
# --help at 80 columns: prose wraps at the terminal width, not at the docstring's line ends
# ---------------------------------------------------------------------------------------------------


def _help_paragraphs(app, *args) -> list[list[str]]:
    """The description paragraphs of ``--help`` at 80 columns (between Usage and the first panel)."""
    from typer.testing import CliRunner

    out = (
        CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "80"}, terminal_width=80).output
    )
    body = out.split("Usage:", 1)[1].split("╭", 1)[0].splitlines()[1:]
    paragraphs, current = [], []
    for line in body:
        if line.strip():
            current.append(line.rstrip())
        elif current:
            paragraphs, current = paragraphs + [current], []
    return paragraphs + ([current] if current else [])


def _broken_lines(paragraphs) -> list[str]:
    # a line that ends a paragraph may be short; any other must fill most of the 80 columns
    return [line for p in paragraphs for line in p[:-1] if len(line) < 60]


def test_every_command_help_wraps_at_the_terminal_width():
    from cbdp_jax.cli import app

    for command in app.registered_commands:
        paragraphs = _help_paragraphs(app, command.name)
        assert paragraphs, command.name
        assert _broken_lines(paragraphs) == [], (command.name, paragraphs)


def test_help_wrap_check_catches_a_hard_wrapped_docstring():
    # Negative control: a docstring wrapped at 100 columns, as the source is, and shown unchanged
    # (what typer's rich help did before the reflow) breaks lines mid-sentence at 80 columns.
    import typer

    demo = typer.Typer(add_completion=False)

    @demo.command()
    def one() -> None:
        """First line.

        Resumable: every finished unit of work is kept under OUT/.units, and a rerun after a kill continues
        where it stopped. Prints a run-time estimate before it starts and an ETA after each unit.
        """

    @demo.command()
    def two() -> None:
        """Second."""

    assert _broken_lines(_help_paragraphs(demo, "one")) != []


def test_reproduce_lists_its_experiments_and_needs_a_name():
    from cbdp_jax.experiments import EXPERIMENTS

    listed = subprocess.run([*CLI, "reproduce", "--list"], capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    names = [line.split(":")[0] for line in listed.stdout.splitlines() if not line.startswith(" ")]
    assert names == [*EXPERIMENTS, "paper", "all"]
    helped = subprocess.run(
        [*CLI, "reproduce", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert all(f"{name}:" in helped.stdout for name in EXPERIMENTS)
    # Negative control: no name and no --list is bad input (exit 2, one line naming the fix).
    bare = subprocess.run([*CLI, "reproduce"], capture_output=True, text=True)
    assert bare.returncode == 2 and "cbdp reproduce --list" in bare.stderr


def test_audit_help_shows_every_claim_form_and_class_at_80_columns():
    proc = subprocess.run(
        [*CLI, "audit", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
    )
    text = " ".join(proc.stdout.split())  # rich wraps at 80: compare the words
    for form in ("pure:EPS", "approx:EPS:DELTA", "renyi:ALPHA:EPS", "capacity:CLASS:kl:VALUE",
                 "capacity:CLASS:renyi:ALPHA:VALUE", "dpsgd:noise=S,rate=Q,steps=T,delta=D",
                 "halfspace", "Exit status: 0"):  # fmt: skip
        assert form in text, form
    assert "..." not in proc.stdout  # nothing cut


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--samples", "0"], "samples=0 is invalid with --p-samples"),
        (["--test-samples", "0"], "test_samples=0 is invalid with --p-samples"),
        (["--mechanism", "gaussian"], "mechanism='gaussian' is invalid with --p-samples"),
    ],
)
def test_an_option_that_does_not_apply_to_sample_files_is_an_error(tmp_path, extra, needle):
    import numpy as np

    for name, shift in (("P", 0.0), ("Q", 1.0)):
        np.save(tmp_path / f"{name}.npy", np.random.default_rng(0).laplace(shift, 1.0, 300))
    files = ["--p-samples", str(tmp_path / "P.npy"), "--q-samples", str(tmp_path / "Q.npy")]
    proc = subprocess.run([*CLI, "estimate", *files, *extra], capture_output=True, text=True)
    assert proc.returncode == 2 and needle in proc.stderr and proc.stderr.count("\n") == 1


def test_a_space_without_its_range_is_an_error_and_a_csv_may_have_a_header(tmp_path):
    (tmp_path / "m.py").write_text("def f(rng, d, n):\n    return rng.laplace(0, 1, n)\n")
    proc = subprocess.run(
        [*CLI, "audit", "m.py:f", "--claim", "pure:1", "--space", '{"shape": [10]}'],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2 and "must give low, high" in proc.stderr
    from cbdp_jax.audit import load_samples

    (tmp_path / "h.csv").write_text("x,y\n0.5,1\n1.5,2\n")
    assert load_samples("p_samples", tmp_path / "h.csv").tolist() == [[0.5, 1.0], [1.5, 2.0]]
    (tmp_path / "bad.csv").write_text("0.5,1\nx,2\n")  # a name below the first row is not a header
    with pytest.raises(ValueError, match="row 2 field 'x' is not a number"):
        load_samples("p_samples", tmp_path / "bad.csv")


@pytest.mark.parametrize(
    "args, needle",
    [
        # calibrate: a bad target is reported before the missing order
        (["calibrate", "--mechanism", "laplace", "--divergence", "renyi", "--target", "-1"],
         "target=-1.0 is invalid"),
        (["estimate", "--samples", "1000", "--steps", "10", "--patience", "-1"],
         "patience=-1 is invalid"),
    ],
)  # fmt: skip
def test_a_bad_option_value_is_one_line_naming_it(args, needle):
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True)
    assert proc.returncode == 2 and needle in proc.stderr


@pytest.mark.slow
@pytest.mark.ci
def test_the_demo_table_fits_80_columns_without_cutting_a_label():
    # `cbdp demo` piped with COLUMNS=80 (small sizes: the tables' shape, not their numbers): every line
    # fits, no cell is cut with an ellipsis, no header is broken inside a word, and the labels appear
    # whole (tests/test_columns.py checks the same of render_table without training).
    code = "from cbdp_jax._src.estimator.demo import run_demo; run_demo(samples=2000, steps=20)"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=NARROW
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in proc.stdout
    for title in ("Laplace eps=1, KL", "Laplace eps=1, Renyi(alpha=4)", "Gauss sigma=1, KL"):
        assert title in lines, title
    headers = [line for line in lines if line.startswith("┃")]
    for word in ("class", "estimate", "unrestricted", "exact", "lower", "bound"):
        assert all(word in line for line in headers), word
    body = [line.split("│")[1:-1] for line in lines if line.startswith("│")]
    # (KL's rows name poly_2: for KL the estimator reduces poly_3 to the class it equals there)
    # a bound on the bounded class B tanh(H / B) stands on a row of its own, under its class's row
    named = {row[0].strip().split("_")[0] for row in body if not row[0].strip().startswith("└")}
    assert named == {"linear", "poly", "mlp(32x2)"}
    assert all(row[0].strip()[2:].startswith("B=") for row in body if row[0].strip()[:1] == "└")


def test_the_80_column_check_catches_a_table_that_cuts_its_cells():
    # Negative control: the same kind of table without folding, at 80 columns, cuts labels.
    from rich.console import Console
    from rich.table import Table

    table = Table(title="demo")
    for col in ("mechanism", "divergence", "adversary", "estimate", "95% lower bound", "exact (H)",
                "unrestricted"):  # fmt: skip
        table.add_column(col)
    table.add_row("Laplace eps=1", "Renyi(alpha=4)", "mlp(32x2)", "0.8123 ± 0.0061",
                  "0.8001 (refused) *", "0.410577", "0.813689")  # fmt: skip
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(table)
    assert "…" in console.export_text()


@pytest.mark.parametrize(
    "before, after",
    [
        (None, "--xla_gpu_deterministic_ops=true"),
        (
            "--xla_cpu_use_thunk_runtime=true",
            "--xla_cpu_use_thunk_runtime=true --xla_gpu_deterministic_ops=true",
        ),
        # A value the user gave is kept, false too (negative control: the helper must not force it).
        ("--xla_gpu_deterministic_ops=false", "--xla_gpu_deterministic_ops=false"),
    ],
    ids=["unset", "other flags kept", "user's value kept"],
)
def test_cbdp_processes_ask_for_deterministic_gpu_kernels(monkeypatch, before, after):
    from cbdp_jax._src.infra.determinism import request_deterministic_gpu_ops

    if before is None:
        monkeypatch.delenv("XLA_FLAGS", raising=False)
    else:
        monkeypatch.setenv("XLA_FLAGS", before)
    request_deterministic_gpu_ops()
    assert os.environ["XLA_FLAGS"] == after
