"""The test suite's own guards fire when they should: each is shown failing on a planted fault.

Every check runs pytest in a subprocess on a small test file written here, with this repository's
configuration (``pyproject.toml``, ``tests/conftest.py`` copied beside it), and asserts the outcome.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _pytest(
    tmp_path: Path, body: str, *args: str, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Runs pytest on one test file in a folder holding copies of the suite's configuration.

    In this process (``-n 0``): the suite's addopts start worker processes, which print nothing of a
    test's own output even with ``-s``.
    """
    (tmp_path / "tests").mkdir(exist_ok=True)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "tests" / "conftest.py")
    (tmp_path / "tests" / "test_planted.py").write_text(textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "tests/test_planted.py", *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_a_deprecation_warning_from_the_library_fails_the_run_and_a_third_party_one_does_not(
    tmp_path,
):
    body = """
    import warnings

    def test_ours():
        warnings.warn_explicit("old API", DeprecationWarning, "x.py", 1, module="cbdp_jax._src.x")

    def test_theirs():
        warnings.warn_explicit("old API", DeprecationWarning, "y.py", 1, module="jax._src.y")
    """
    proc = _pytest(tmp_path, body)
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "1 failed, 1 passed" in proc.stdout, proc.stdout[-2000:]
    assert "test_ours" in proc.stdout


@pytest.mark.slow
@pytest.mark.ci
def test_the_x64_guard_fails_a_test_that_finds_x64_left_on(tmp_path):
    # conftest's autouse fixture: an unmarked test that finds x64 on fails (a test leaked it).
    body = """
    import jax

    def test_a_leak():
        jax.config.update("jax_enable_x64", True)

    def test_after_the_leak():
        pass
    """
    proc = _pytest(tmp_path, body)
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "x64 is on outside an x64-marked test" in proc.stdout
    # Negative control: without the leak both pass.
    proc = _pytest(tmp_path, body.replace('jax.config.update("jax_enable_x64", True)', "pass"))
    assert proc.returncode == 0, proc.stdout[-2000:]


@pytest.mark.slow
@pytest.mark.ci
@pytest.mark.parametrize("profile, identical", [("derandomized", True), ("explore", False)])
def test_the_hypothesis_profile_reaches_every_property_test(tmp_path, profile, identical):
    # HYPOTHESIS_PROFILE=explore must draw fresh examples in every property test (no test may pin
    # derandomize itself): two runs print the same examples only under the default profile.
    body = """
    from hypothesis import given, settings, strategies as st

    @settings(max_examples=5, deadline=None, database=None)
    @given(st.floats(0, 1))
    def test_draws(x):
        print("example", repr(x))
    """
    runs = [
        _pytest(tmp_path, body, "-s", env={"HYPOTHESIS_PROFILE": profile}).stdout for _ in range(2)
    ]
    drawn = [sorted(line for line in r.splitlines() if line.startswith("example")) for r in runs]
    assert drawn[0] and (drawn[0] == drawn[1]) is identical, drawn


def test_no_property_test_pins_derandomize():
    pinned = "derandomize" + "=True"  # spelt so that this file does not match itself
    for path in (ROOT / "tests").glob("test_*.py"):
        assert pinned not in path.read_text(), path.name


def test_the_mapping_count_that_releases_compiled_programs_is_read_on_linux():
    # conftest releases compiled programs only past MAX_MAPPINGS; the count must be readable here
    # (a 0 would silently disable the release, and the suite would crash at vm.max_map_count again).
    import sys as _sys

    conftest = _sys.modules.get("conftest") or __import__("conftest")
    assert conftest.MAX_MAPPINGS < 65_530  # below Linux's default vm.max_map_count
    if Path("/proc/self/maps").exists():
        assert conftest.memory_mappings() > 100
