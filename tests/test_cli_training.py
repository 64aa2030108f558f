"""``cbdp audit-training``'s options, run as a user would: relations, canary norm, bugs, --problem, --init.

The short runs go through the CLI's own entry point (``cli.main``, what the ``cbdp`` executable runs)
in ONE fresh process (not this one, whose JAX runs in float64 under tests/conftest.py), a few hundred
trainings each: they check that each option reaches the problem, the claim and the output, not
statistical power. Bad values of each option are in tests/test_reliability.py (``CLI_OPTION_CASES``,
documented in docs/errors.md). The full-default ``--bug no-clip`` run (10^4 runs per side) is slow.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

# The noise probes (tests/test_noise_probes.py tests them, its exit-3 case through the command) are
# skipped here: these cases check what each option reaches, and the probes would compile per case.
RUNNER = """
import contextlib, io, json, sys
from cbdp_jax import cli
from cbdp_jax._src.training_auditor import runs as training_runs
training_runs.noise_defects = lambda *args, **kwargs: ()
out = []
for args in json.load(sys.stdin):
    stdout, stderr = io.StringIO(), io.StringIO()
    sys.argv = ["cbdp", "audit-training", *args]
    code = 0
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            cli.main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out.append([code, stdout.getvalue(), stderr.getvalue()])
sys.__stdout__.write(json.dumps(out))
"""

# A user's file outside the repository: linear regression with a squared loss (a custom loss_fn),
# the library's DP-SGD, and a twin with a planted bug (the positive control).
USER_FILE = textwrap.dedent(
    """
    import numpy as np
    from flax import nnx

    from cbdp_jax import training_audit as ta


    def squared(model, x, y):
        return ((model(x)[:, 0] - y) ** 2).mean()


    def make_problem(bug="none"):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(63, 4)).astype(np.float32)
        x[:, 0] = 0.0  # a feature no example uses: the gradient canary's coordinate
        y = (x @ np.array([0.0, 1.0, -0.5, 0.25], np.float32)).astype(np.float32)
        step = ta.dp_sgd(learning_rate=0.1, l2_norm_clip=1.0, noise_multiplier=1.0,
                         expected_batch_size=8.0, bug=bug)
        return ta.TrainingProblem(
            model=nnx.Linear(4, 1, rngs=nnx.Rngs(0)), data=(x, y), step=step,
            sampler=ta.BatchSampler(kind="poisson", rate=0.125), steps=8, noise_multiplier=1.0,
            l2_norm_clip=1.0, loss_fn=squared, name="my regression",
        )


    def make_buggy_problem():
        return make_problem("noise-after-averaging")
    """
)

SMALL = ["--data", "synthetic", "--rate", "0.125", "--steps", "3", "--runs", "200"]
JSON = ["--format", "json"]
CASES = {
    "relation-zero-out": [*SMALL, *JSON, "--relation", "zero-out"],
    "relation-replace-one": [*SMALL, *JSON, "--relation", "replace-one"],
    "rdp": [*SMALL, *JSON, "--accountant", "rdp"],
    "no-clip": [*SMALL, *JSON, "--bug", "no-clip"],
    "canary-norm-1-no-clip": [*SMALL, *JSON, "--canary-norm", "1", "--bug", "no-clip"],
    "mean-over-batch-table": [*SMALL, "--bug", "mean-over-batch"],
    "worst-case-relation-bug": [
        "--data", "worst-case", "--sampler", "poisson", "--steps", "4", "--batch-size", "8",
        "--relation", "zero-out", "--bug", "mean-over-dataset", "--runs", "200", *JSON,
    ],
    "cnn": ["--model", "cnn", "--examples", "64", "--steps", "2", "--runs", "200", *JSON],
    "init": [
        "--init", "average-case", "--examples", "100", "--steps", "3", "--noise", "2",
        "--runs", "200", *JSON,
    ],
    "problem": ["--problem", "{FILE}:make_problem", "--runs", "300", *JSON],
    "problem-buggy": ["--problem", "{FILE}:make_buggy_problem", "--runs", "300", *JSON],
}  # fmt: skip


FAST = ("relation-zero-out", "problem")  # the rest compile a program each: 2 min cold, -m slow


def _run(tmp_path_factory, names) -> dict:
    """Each case's (exit status, stdout, stderr), all run in one fresh process."""
    folder = tmp_path_factory.mktemp("user")  # not in the repository
    path = folder / "my_train.py"
    path.write_text(USER_FILE)
    cases = [[str(path) + a[len("{FILE}") :] if a.startswith("{FILE}") else a for a in CASES[n]]
             for n in names]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER], input=json.dumps(cases), capture_output=True, text=True,
        timeout=1200, cwd=folder,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(zip(names, json.loads(proc.stdout), strict=True))


@pytest.fixture(scope="module")
def fast(tmp_path_factory):
    return _run(tmp_path_factory, FAST)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return _run(tmp_path_factory, [n for n in CASES if n not in FAST])


def _json(runs, name, code=0):
    status, out, err = runs[name]
    assert status == code, (name, status, err[-2000:])
    return json.loads(out)


def test_relation_reaches_the_runs_and_the_accounted_claim(fast):
    rec = _json(fast, "relation-zero-out")
    assert rec["relation"] == "zero-out" and rec["training"]["relation"] == "zero-out"
    assert rec["claim"].endswith("relation=zero-out")
    assert rec["claimed"]["source"]["relation"] == "zero-out"
    assert rec["training"]["pair"] == (
        "D: the canary in; D': its zero-out neighbour, the canary's gradient zeroed"
    )


def test_problem_from_a_users_file_with_a_custom_loss(fast):
    rec = _json(fast, "problem")  # the correct step: no violation (the negative control)
    assert rec["mechanism"] == "my regression" and rec["training"]["problem"].endswith(
        "my_train.py:make_problem"
    )
    assert rec["samples_per_side"] == 300 and rec["relation"] == "add-remove"
    assert rec["claim"].startswith("dpsgd:noise=1,rate=0.125,steps=8,")  # the problem's own claim


@pytest.mark.slow
@pytest.mark.ci
def test_problem_with_a_planted_bug_is_certified(runs):
    buggy = _json(runs, "problem-buggy", code=1)  # effective noise S / 8: the positive control
    assert buggy["violation"] and buggy["violation_point"]["grid"] == "epsilon"
    assert "the runs certify delta >=" in buggy["verdict"]


@pytest.mark.slow
@pytest.mark.ci
def test_replace_one_and_the_default_relation(runs):
    replace = _json(runs, "relation-replace-one")
    assert replace["relation"] == "replace-one" and replace["claim"].endswith(
        "relation=replace-one"
    )
    assert "its replace-one neighbour" in replace["training"]["pair"]
    default = json.loads(runs["no-clip"][1])  # the claim's relation: dp_accounting's default
    assert default["relation"] == "add-remove" and "canary absent" in default["training"]["pair"]
    # replace-one is accounted as its own pair: its delta at eps 0.25 is above add-remove's
    assert replace["certified_bounds"][0]["claimed"] > default["certified_bounds"][0]["claimed"]


@pytest.mark.slow
@pytest.mark.ci
def test_accountant_rdp_accounts_the_default_claim_with_rdp(runs):
    rdp, pld = _json(runs, "rdp"), json.loads(runs["no-clip"][1])
    assert (
        rdp["claim"].endswith("accountant=rdp") and "RDP" in rdp["claimed"]["source"]["accountant"]
    )
    assert rdp["claimed"]["epsilon"] > pld["claimed"]["epsilon"]  # RDP is looser than PLD
    assert rdp["training"]["accountant"] == "rdp" and pld["training"]["accountant"] == "pld"


@pytest.mark.slow
@pytest.mark.ci
def test_canary_norm_decides_whether_no_clip_is_a_blind_spot(runs):
    # At --canary-norm 1 clipping does not bind on the canary: the output names it. At the default
    # 4 C it binds, and a step that does not clip is seen (the negative control: nothing named).
    blind = _json(runs, "canary-norm-1-no-clip")
    assert [b["kind"] for b in blind["blind_spots"]] == ["clip-not-binding"]
    assert blind["training"]["canary_norm"] == 1.0
    status, out, err = runs["no-clip"]  # 200 runs: certified or not, the output is what is checked
    assert status in (0, 1), err[-2000:]
    rec = json.loads(out)
    assert rec["blind_spots"] == [] and rec["training"]["canary_norm"] == 4.0


@pytest.mark.slow
@pytest.mark.ci
def test_bug_blind_spots_are_named_after_the_table(runs):
    status, table, err = runs["mean-over-batch-table"]
    assert status == 0, err[-2000:]
    assert "blind spot (batch-normalisation):" in table and "add-remove" in table
    assert "not seen" not in table and "-0x" not in table


@pytest.mark.slow
@pytest.mark.ci
def test_worst_case_data_takes_relation_and_bug(runs):
    rec = _json(runs, "worst-case-relation-bug")
    assert rec["relation"] == "zero-out" and rec["training"]["bug"] == "mean-over-dataset"
    assert rec["training"]["sampling_rate"] == 0.25  # Poisson at q = 1 / steps: --rate not given
    # zero-out keeps the data set's size on both sides: the output says it cannot see that bug
    assert [b["kind"] for b in rec["blind_spots"]] == ["dataset-size"]


@pytest.mark.slow
@pytest.mark.ci
def test_model_cnn_trains_and_is_named(runs):
    rec = _json(runs, "cnn")
    assert rec["training"]["model"] == "cnn" and "cnn/digits" in rec["mechanism"]


@pytest.mark.slow
@pytest.mark.ci
def test_init_average_case_is_a_black_box_audit_with_its_start(runs):
    rec = _json(runs, "init")
    assert rec["training"]["threat"] == "black-box" and rec["training"]["init"] == "average-case"
    assert rec["training"]["start"]["init"] == "average-case" and rec["training"]["steps"] == 3
    assert rec["training"]["sampling_rate"] == 1.0  # the construction's full batch by default


def test_the_bug_help_lists_every_library_bug_and_the_blind_spot_table():
    from typer.testing import CliRunner

    from cbdp_jax._src.training_auditor.planted_bugs import visibility_text
    from cbdp_jax.cli import app
    from cbdp_jax.training_audit import BUGS

    text = CliRunner().invoke(app, ["audit-training", "--help"], terminal_width=4000).output
    flat = " ".join(line.strip(" │") for line in text.splitlines())
    flat = " ".join(flat.split())
    for bug in BUGS:
        assert bug in flat
    assert " ".join(visibility_text().split()) in flat
    assert "cnn" in flat and "--canary-norm" in flat and "--problem" in flat


@pytest.mark.slow
@pytest.mark.ci  # 20-42 s: end to end (docs/guide/testing.md)
def test_the_blind_spot_table_is_what_the_probes_report():
    # The help's table (planted_bugs.BLIND_AT_DEFAULTS) against the audit's probes on the command
    # line's defaults (only T is smaller: the probes do not train), every bug and threat.
    from cbdp_jax._src.training_auditor.crafted_init import INITS
    from cbdp_jax._src.training_auditor.planted_bugs import BLIND_AT_DEFAULTS, BUGS, THREAT_ORDER
    from cbdp_jax._src.training_auditor.problem import DEFAULT_CANARY_NORM, THREATS
    from cbdp_jax.cli import audit_training as cmd
    from cbdp_jax.training_audit import build_problem, prepare

    assert THREAT_ORDER == THREATS and cmd.INITS == ("default", *INITS)
    import inspect

    default = inspect.signature(cmd.audit_training_cmd).parameters["canary_norm"].default
    assert default == DEFAULT_CANARY_NORM
    for bug in BUGS:
        for threat in THREATS:
            problem = build_problem(bug=bug, threat=threat, steps=2)
            spots = prepare(problem, noise_probes=False).blind_spots
            want = BLIND_AT_DEFAULTS[bug].get(threat, ())
            assert tuple(b.kind for b in spots) == want, (bug, threat, spots)
    # negative control: a change of option the table does not describe changes the probes' answer
    spots = prepare(build_problem(bug="no-clip", canary_norm=1.0, steps=2), noise_probes=False)
    assert (
        [b.kind for b in spots.blind_spots]
        == ["clip-not-binding"]
        != list(BLIND_AT_DEFAULTS["no-clip"])
    )


@pytest.mark.slow  # 10^4 trainings per side, 100 steps: 89 s at load 4-10 cold, 44 s at load 2 cached
def test_no_clip_is_certified_at_every_other_default():
    proc = subprocess.run(
        [sys.executable, "-m", "cbdp_jax.cli", "audit-training", "--bug", "no-clip", "--format",
         "json"], capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    rec = json.loads(proc.stdout)
    assert rec["violation"] and rec["blind_spots"] == [] and rec["relation"] == "add-remove"
    assert rec["violation_point"]["certified"] > rec["violation_point"]["claimed"]
