"""Every code block of README.md and of the user guide (docs/guide/*.md) runs as written.

* ```python blocks run in a fresh interpreter (a subprocess, from an empty folder); a block followed by
  "prints ..." and a ```text block must print that text: lines with analytic or exact values digit for
  digit, lines with estimates (they contain "estimate") with every number within a tolerance, since an
  estimate moves with the platform and the library's versions; blocks that assert their own numbers
  (the vmap-over-epsilons and custom-class examples) run by default. The sweep and calibration blocks
  run only with ``-m slow`` (20 s or more each).
* ```bash blocks: every ``cbdp ...`` command (also inside ``a && b`` chains) is parsed by the real command-line parser (each option exists
  and has a valid value) without running; the short ones also run: both ``cbdp exact`` lines as written,
  and (with ``-m slow``) ``cbdp estimate`` / ``cbdp rerun`` with the README's options but smaller sizes
  (``--samples 4000 --steps 60``; the default run covers that path in tests/test_cli.py). ``cbdp reproduce`` (an hour, or minutes with ``--quick``; its quick modes run in
  tests/test_paper_figures.py and tests/test_theorem_experiments.py) and the install and test lines
  (``python3 -m venv ...``, ``pip ...``, ``python -m pytest``) are not run; ``cbdp demo`` (a minute) is
  parsed only.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCUMENTS = (README, *sorted((ROOT / "docs" / "guide").glob("*.md")))
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def blocks(text: str) -> list[tuple[str, str, str]]:
    """``(language, code, text after the block up to the next fence)`` for every fenced block."""
    out = []
    pattern = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
    matches = list(pattern.finditer(text))
    for i, m in enumerate(matches):
        following = text[m.end() : matches[i + 1].start()] if i + 1 < len(matches) else ""
        out.append((m.group(1), m.group(2), following))
    return out


def python_blocks() -> list[tuple[str, str | None]]:
    """Each ```python block with the ```text block it says it prints (None if it shows none).

    The README's blocks come first (its first block is the quick example), then the guide's.
    """
    out = []
    for document in DOCUMENTS:
        found = blocks(document.read_text())
        for i, (lang, code, following) in enumerate(found):
            if lang != "python":
                continue
            expected = None
            if "prints" in following and i + 1 < len(found) and found[i + 1][0] == "text":
                expected = found[i + 1][1]
            out.append((code, expected))
    return out


def cbdp_lines() -> list[str]:
    """Every command line of the ```bash blocks (continuations joined, comments dropped)."""
    lines = []
    for lang, code, _ in (b for d in DOCUMENTS for b in blocks(d.read_text())):
        if lang != "bash":
            continue
        joined = code.replace("\\\n", " ")
        for line in joined.splitlines():
            for part in line.split(" #")[0].split("&&"):
                if part.strip():
                    lines.append(part.strip())
    return lines


def run_python(code: str, cwd: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


PLUS_MINUS = re.compile(
    r"estimate ([-+]?\d*\.?\d+(?:[eE][-+]?\d+)?) \+- (\d*\.?\d+(?:[eE][-+]?\d+)?)"
)


def same_output(got: str, want: str, *, allowance: float = 0.01) -> list[str]:
    """Differences between printed and expected output (empty when they agree).

    Lines without "estimate" must match digit for digit. On an estimate line ("estimate X +- S ..."),
    each number that is not an integer (the estimate, a bound) may move by 4 sqrt(S_got^2 + S_want^2)
    + ``allowance`` (two independent estimates, each with its reported standard error, plus a small
    optimisation allowance); the standard errors themselves within a factor 2; integers (sample
    counts) must match exactly.
    """
    problems = []
    got_lines, want_lines = got.strip().splitlines(), want.strip().splitlines()
    if len(got_lines) != len(want_lines):
        return [f"{len(got_lines)} lines printed, {len(want_lines)} shown in the README"]
    for g, w in zip(got_lines, want_lines, strict=True):
        if "estimate" not in w:
            if g != w:
                problems.append(f"printed {g!r}, README shows {w!r}")
            continue
        if NUMBER.sub("#", g) != NUMBER.sub("#", w):
            problems.append(f"printed {g!r}, README shows {w!r} (text differs)")
            continue
        m_g, m_w = PLUS_MINUS.search(g), PLUS_MINUS.search(w)
        if m_g is None or m_w is None:
            problems.append(f"printed {g!r}: an estimate line needs 'estimate X +- SE'")
            continue
        se_g, se_w = float(m_g.group(2)), float(m_w.group(2))
        tol = 4.0 * math.hypot(se_g, se_w) + allowance
        for a, b in zip(NUMBER.findall(g), NUMBER.findall(w), strict=True):
            x, y = float(a), float(b)
            if "." not in b and "e" not in b.lower():
                ok = x == y  # an integer: a sample count
            elif b == m_w.group(2):
                ok = se_w / 2 <= x <= 2 * se_w  # the standard error
            else:
                ok = abs(x - y) <= tol
            if not ok:
                problems.append(
                    f"printed {g!r}, README shows {w!r} ({a} vs {b}, tolerance {tol:.3g})"
                )
    return problems


def test_readme_has_the_blocks_this_test_runs():
    pys = python_blocks()
    assert len(pys) >= 2 and pys[0][1] is not None  # the first block shows what it prints
    lines = cbdp_lines()
    assert any(line.startswith("cbdp exact") for line in lines)
    assert any(line.startswith("cbdp estimate") for line in lines)
    assert any(line.startswith("cbdp rerun") for line in lines)


def test_same_output_rules_catch_a_wrong_value():
    # negative controls for the comparison itself
    want = "exact (lin, Renyi) 0.410577\nlinear KL: estimate 0.226 +- 0.007"
    assert same_output(want, want) == []
    assert same_output("exact (lin, Renyi) 0.410578\nlinear KL: estimate 0.226 +- 0.007", want)
    assert same_output("exact (lin, Renyi) 0.410577\nlinear KL: estimate 0.9 +- 0.007", want)
    assert same_output("exact (lin, Renyi) 0.410577", want)
    assert (
        same_output("exact (lin, Renyi) 0.410577\nlinear KL: estimate 0.23 +- 0.0071", want) == []
    )
    # 0.226 -> 0.29 moves by 0.064, beyond 4 sqrt(2) 0.007 + 0.01 = 0.050: it fails, as does an SE
    # three times the README's, or a changed sample count.
    assert same_output("exact (lin, Renyi) 0.410577\nlinear KL: estimate 0.29 +- 0.007", want)
    assert same_output("exact (lin, Renyi) 0.410577\nlinear KL: estimate 0.226 +- 0.021", want)
    counts = "x: estimate 0.5 +- 0.01, samples {'test_p': 5000}"
    assert same_output(counts.replace("5000", "5001"), counts)


def test_first_python_block_runs_and_prints_what_the_readme_shows(tmp_path):
    code, expected = python_blocks()[0]
    got = run_python(code, tmp_path)
    assert not same_output(got, expected), same_output(got, expected)


def _other_blocks():
    """Every python block after the first; the sweep and calibration blocks (20 s or more) are slow."""
    out = []
    for i, (code, _) in enumerate(python_blocks()[1:], start=1):
        slow = "estimate_sweep" in code or "calibrate(" in code
        # slow, and run by CI on every landing: a printed number that drifts is caught there
        marks = (pytest.mark.slow, pytest.mark.ci) if slow else ()
        out.append(pytest.param(i, marks=marks, id=f"block{i}" + ("-slow" if slow else "")))
    return out


@pytest.mark.parametrize("index", _other_blocks())
def test_other_python_blocks_run(tmp_path, index):
    code, expected = python_blocks()[index]
    got = run_python(code, tmp_path)
    if expected is not None:
        assert not same_output(got, expected), same_output(got, expected)


def _parse_only(line: str) -> None:
    """Parses a ``cbdp`` line with the real parser (click), without running the command."""
    import typer

    from cbdp_jax.cli import app

    group = typer.main.get_command(app)
    name, *rest = shlex.split(line)[1:]
    ctx = group.context_class(group, info_name="cbdp")
    cmd = group.get_command(ctx, name)
    assert cmd is not None, f"no command {name!r} in {line!r}"
    cmd.make_context(name, rest, parent=ctx)  # parses and validates every option; runs nothing


def test_every_cbdp_line_parses():
    lines = [line for line in cbdp_lines() if line.startswith("cbdp ")]
    assert len(lines) >= 6
    for line in lines:
        _parse_only(line)
    import typer

    # click's UsageError, found through typer (which may vendor click): version-proof
    usage_error = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
    with pytest.raises(usage_error):  # negative control: a misspelt option does not parse
        _parse_only("cbdp exact --epsilonn 1")
    with pytest.raises(typer.BadParameter):  # nor does a value of the wrong type
        _parse_only("cbdp exact --epsilon one")
    with pytest.raises(AssertionError):  # nor an unknown command
        _parse_only("cbdp exactly --epsilon 1")


def _cbdp(line: str, cwd: Path) -> subprocess.CompletedProcess:
    args = shlex.split(line)[1:]
    return subprocess.run(
        [sys.executable, "-m", "cbdp_jax.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )


def test_cbdp_exact_lines_run_as_written(tmp_path):
    for line in [x for x in cbdp_lines() if x.startswith("cbdp exact")]:
        proc = _cbdp(line, tmp_path)
        assert proc.returncode == 0, (line, proc.stderr[-2000:])
        if "--format json" in line:
            assert json.loads(proc.stdout)["value"] > 0
        else:
            assert "value" in proc.stdout


@pytest.mark.slow  # 30-80 s; tests/test_cli.py runs `cbdp estimate --out` and `cbdp rerun` by default
def test_cbdp_estimate_and_rerun_lines_run_with_smaller_sizes(tmp_path):
    estimate = next(x for x in cbdp_lines() if x.startswith("cbdp estimate"))
    small = re.sub(r"--samples \d+", "--samples 4000", estimate)
    small = re.sub(r"--steps \d+", "--steps 60", small)
    assert small != estimate and "--steps 60" in small
    proc = _cbdp(small, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(proc.stdout)
    assert record["sample_counts"]["train_p"] == 4000
    rerun = next(x for x in cbdp_lines() if x.startswith("cbdp rerun"))
    again = _cbdp(rerun, tmp_path)  # the README's path, relative to the folder the estimate wrote
    assert again.returncode == 0, again.stderr[-2000:]
    assert "identical" in again.stderr
