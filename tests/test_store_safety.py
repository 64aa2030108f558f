"""The program store and JAX's cache load nothing another user could have written (issue 42).

A planted ``*.jaxexe`` is a pickle whose ``__reduce__`` creates a marker file when unpickled: it stands
for any code an attacker would run. In a folder others can write to, or one owned by another user, it
is never unpickled (the marker never appears) and one warning names the folder; in a private folder
the same file is unpickled (the marker appears): the check, not the file format, is the defence.
"""

import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cbdp_jax._src.infra import programs, store_safety

pytestmark = pytest.mark.skipif(not hasattr(os, "getuid"), reason="no user ids on this platform")

OTHER_UID = 65534  # 'nobody'


class _Planted:
    """Unpickling this creates ``marker`` (builtins.open in write mode)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _plant(root: Path, marker: Path) -> Path:
    folder = root / "programs"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ("0" * 64 + ".jaxexe")
    path.write_bytes(pickle.dumps(_Planted(marker)))
    return path


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A cache root under a private parent, the store pointed at it, warnings forgotten."""
    parent = tmp_path / "home"
    parent.mkdir(mode=0o700)
    root = parent / "cache"
    root.mkdir(mode=0o700)
    monkeypatch.setenv("CBDP_JAX_CACHE_DIR", str(root))
    monkeypatch.setattr(store_safety, "_WARNED", set())
    return root


def _load_and_warnings(path: Path, capsys) -> list[str]:
    """Loads twice; the warnings printed, each as one string (a warning wraps at 80 columns)."""
    assert programs._load(path) is None  # the planted object is no executable either way
    assert programs._load(path) is None  # a second load: still no second warning
    err = capsys.readouterr().err
    assert all(
        len(line) <= 80 or " " not in line.strip() for line in err.splitlines()
    )  # a long path
    return [" ".join(w.split()) for w in err.split("warning:")[1:]]


def test_a_private_store_loads_the_file(store, tmp_path, capsys):
    # Positive control: the planted pickle does run when the folders are the user's own, so the
    # refusals below are the check's doing.
    marker = tmp_path / "ran"
    path = _plant(store, marker)
    os.chmod(path.parent, 0o700)
    assert _load_and_warnings(path, capsys) == []
    assert marker.exists()


@pytest.mark.parametrize("where", ["root", "programs"])
def test_a_store_folder_others_can_write_is_never_loaded(store, tmp_path, capsys, where):
    marker = tmp_path / "ran"
    path = _plant(store, marker)
    folder = store if where == "root" else path.parent
    os.chmod(folder, 0o777)
    warnings = _load_and_warnings(path, capsys)
    assert not marker.exists()
    assert len(warnings) == 1 and str(folder) in warnings[0] and "0o777" in warnings[0]


def test_a_group_writable_folder_is_refused_too(store, tmp_path, capsys):
    marker = tmp_path / "ran"
    path = _plant(store, marker)
    os.chmod(store, 0o770)
    assert len(_load_and_warnings(path, capsys)) == 1 and not marker.exists()


@pytest.mark.skipif(os.getuid() != 0, reason="only root can give a folder to another user")
@pytest.mark.parametrize("what", ["root", "file"])
def test_a_folder_or_file_owned_by_another_user_is_never_loaded(store, tmp_path, capsys, what):
    marker = tmp_path / "ran"
    path = _plant(store, marker)
    os.chmod(path.parent, 0o700)
    os.chown(store if what == "root" else path, OTHER_UID, -1)
    warnings = _load_and_warnings(path, capsys)
    assert not marker.exists()
    assert len(warnings) == 1 and f"user id {OTHER_UID}" in warnings[0]


def test_a_writable_parent_above_the_root_needs_the_sticky_bit(tmp_path, monkeypatch, capsys):
    # /tmp-like (1777) above the root is fine; the same without the sticky bit lets anyone rename
    # the root away and put their own in its place.
    monkeypatch.setattr(store_safety, "_WARNED", set())
    shared = tmp_path / "shared"
    shared.mkdir()
    root = shared / "mine"
    root.mkdir(mode=0o700)
    monkeypatch.setenv("CBDP_JAX_CACHE_DIR", str(root))
    marker = tmp_path / "ran"
    path = _plant(root, marker)
    os.chmod(path.parent, 0o700)
    os.chmod(shared, 0o1777)
    assert store_safety.problem(root, path) is None
    os.chmod(shared, 0o777)
    warnings = _load_and_warnings(path, capsys)
    assert not marker.exists() and len(warnings) == 1 and "sticky" in warnings[0]


def test_folders_are_created_private_and_files_0600(tmp_path):
    root = tmp_path / "a" / "b" / "cache"
    path = root / "programs" / "x.jaxexe"
    assert store_safety.write_private(root, path, b"data")
    for folder in (tmp_path / "a", tmp_path / "a" / "b", root, root / "programs"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert store_safety.problem(root, path) is None


def test_nothing_is_written_into_a_folder_others_can_write(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(store_safety, "_WARNED", set())
    root = tmp_path / "cache"
    root.mkdir(mode=0o777)
    os.chmod(root, 0o777)
    assert not store_safety.write_private(root, root / "programs" / "x.jaxexe", b"data")
    assert not (root / "programs").exists()
    assert capsys.readouterr().err.count("warning:") == 1


def _jax_cache_dir(root: Path) -> str:
    code = "import cbdp_jax, jax; print(jax.config.jax_compilation_cache_dir)"
    env = {**os.environ, "CBDP_JAX_CACHE_DIR": str(root)}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip() + "\n" + proc.stderr


def test_jax_cache_is_off_in_a_folder_others_can_write(tmp_path):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    out = _jax_cache_dir(root)
    assert out.splitlines()[0] == str(root) and "warning" not in out  # private: on, silent
    os.chmod(root, 0o777)
    out = _jax_cache_dir(root)
    assert out.splitlines()[0] == "None"  # others can write: JAX's cache stays off
    assert out.count("warning:") == 1 and str(root) in " ".join(out.split())


@pytest.mark.slow
@pytest.mark.ci
def test_cbdp_estimate_never_runs_a_planted_program(tmp_path):
    # End to end, as the issue measured it: a first `cbdp estimate` fills the store; every stored
    # executable is then replaced by the planted pickle. With the cache folder writable by others the
    # next run never unpickles one (no marker, one warning, same exit status); made private, the
    # same files are unpickled (the marker appears), so the first run was refused by the check.
    root = tmp_path / "cache"
    # the store on (the test session turns it off: conftest.py)
    env = {**os.environ, "CBDP_JAX_CACHE_DIR": str(root), "CBDP_JAX_PROGRAM_CACHE": "1"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    cmd = [sys.executable, "-m", "cbdp_jax.cli", "estimate", "--adversary", "linear",
           "--samples", "2000", "--steps", "20", "--ensemble", "1", "--format", "json"]  # fmt: skip

    def run():
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stderr

    assert "warning" not in run()
    stored = sorted((root / "programs").glob("*.jaxexe"))
    assert stored and stat.S_IMODE((root / "programs").stat().st_mode) == 0o700
    marker = tmp_path / "ran"
    for path in stored:
        path.write_bytes(pickle.dumps(_Planted(marker)))
    os.chmod(root, 0o777)
    err = run()
    assert not marker.exists()
    assert err.count("warning:") == 1 and str(root) in " ".join(err.split())
    os.chmod(root, 0o700)
    assert "warning" not in run()
    assert marker.exists()
