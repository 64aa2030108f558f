"""The program store (cold start): stored executables give the programs' own results, and only programs
the store can identify are stored.

The suite runs with the store off (tests/conftest.py), so that a test that patches library code is never
served an executable of the unpatched code; the tests here switch it on with a folder of their own.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbdp_jax._src.infra import keys, programs
from cbdp_jax._src.privacy.divergences import Divergence
from cbdp_jax.estimator import EstimatorConfig, estimate
from cbdp_jax.mechanisms import LaplaceMechanism

TRACES = {"n": 0}
LENGTHS = iter(range(100, 10_000))


def fresh():
    """An input of a length no other test uses: JAX holds no compiled program for it yet (the store
    keeps only programs it sees compiled)."""
    return jnp.arange(float(next(LENGTHS)))


@programs.persistent_jit(static_argnames=("power",))
def _powered(x, shift, *, power: int):
    TRACES["n"] += 1
    return jnp.sum(x**power) + shift


@pytest.fixture
def store(tmp_path, monkeypatch):
    """The store on, in a fresh folder, with an empty in-process table."""
    monkeypatch.setenv("CBDP_JAX_CACHE_DIR", str(tmp_path / "jax"))
    monkeypatch.setenv("CBDP_JAX_PROGRAM_CACHE", "1")
    monkeypatch.setattr(programs, "_MEMORY", {})
    with programs.enabled():
        yield programs.folder()


def _files(folder):
    return sorted(folder.glob("*.jaxexe")) if folder.exists() else []


def test_a_stored_program_is_loaded_not_traced_and_gives_the_same_result(store):
    x = fresh()
    first = _powered(x, 1.0, power=3)
    assert len(_files(store)) == 1
    programs._MEMORY.clear()  # as a new process: only the file is left
    before = TRACES["n"]
    second = _powered(x, 1.0, power=3)
    assert TRACES["n"] == before  # loaded from the file, not traced
    assert float(second) == float(first) == float(jnp.sum(x**3) + 1.0)
    assert first.dtype == second.dtype and first.shape == second.shape


def test_each_static_value_and_shape_is_its_own_program(store):
    x, y = fresh(), fresh()
    _powered(x, 0.0, power=2)
    _powered(x, 0.0, power=3)
    _powered(y, 0.0, power=3)
    _powered(x, 0.0, power=2)  # the same as the first
    assert len(_files(store)) == 3
    assert float(_powered(x, 0.0, power=2)) == float(jnp.sum(x**2))


def test_a_program_under_another_environment_is_not_reused(store, monkeypatch):
    x = fresh()
    _powered(x, 0.0, power=2)
    (stored,) = _files(store)
    asked = []
    load = programs._load
    monkeypatch.setattr(programs, "_load", lambda path: asked.append(path) or load(path))
    programs._MEMORY.clear()
    _powered(x, 0.0, power=2)
    assert asked == [stored]  # the same environment finds the stored file
    monkeypatch.setattr(programs, "_environment", lambda: "another package source")
    programs._MEMORY.clear()
    _powered(x, 0.0, power=2)
    assert len(asked) == 2 and asked[1] != stored  # another one looks under another key


def test_a_static_the_store_cannot_identify_is_traced_as_usual(store):
    @programs.persistent_jit(static_argnames=("fn",))
    def applied(x, *, fn):
        return fn(x)

    assert float(applied(jnp.ones(3), fn=lambda v: jnp.sum(v) * 2)) == 6.0
    assert _files(store) == []


def test_a_damaged_file_is_a_miss_and_a_failing_executable_is_dropped(store, monkeypatch):
    x = fresh()
    expected = float(_powered(x, 2.0, power=2))
    (path,) = _files(store)
    path.write_bytes(b"not an executable")
    programs._MEMORY.clear()
    assert float(_powered(x, 2.0, power=2)) == expected

    class Broken:
        def __call__(self, *args, **kwargs):
            raise jax.errors.JaxRuntimeError("NOT_FOUND: Function fusion not found")

    programs._MEMORY.clear()
    monkeypatch.setattr(programs, "_load", lambda path: Broken())
    assert float(_powered(x, 2.0, power=2)) == expected
    assert not path.exists()  # the file that failed is removed


def test_run_retries_without_the_loaded_executables_when_an_error_surfaces_later(store):
    # An executable's run-time error can surface when its outputs are read, after the call returned:
    # programs.run then deletes what this call loaded and runs the function once more.
    x = fresh()
    expected = float(_powered(x, 1.0, power=2))
    (path,) = _files(store)
    programs._MEMORY.clear()
    attempts = []

    def work():
        out = float(_powered(x, 1.0, power=2))  # loaded from the file on the first attempt
        attempts.append(out)
        if len(attempts) == 1:
            raise jax.errors.JaxRuntimeError("INTERNAL: Function slice_bitcast_fusion not found")
        return out

    assert programs.run(work) == expected
    assert len(attempts) == 2 and not path.exists()

    # Negative control: with nothing loaded, the error is the caller's and is raised as is.
    def failing():
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: out of memory")

    with pytest.raises(jax.errors.JaxRuntimeError, match="out of memory"):
        programs.run(failing)


def test_opting_out_and_tracing_use_the_plain_compiled_function(store, monkeypatch):
    x, y = fresh(), fresh()
    want = float(jnp.sum(x**2))
    # Inside a user's jit the arguments are tracers: the program is inlined, nothing stored.
    assert float(jax.jit(lambda v: _powered(v, 0.0, power=2))(x)) == want
    assert _files(store) == []
    monkeypatch.setenv("CBDP_JAX_PROGRAM_CACHE", "0")
    assert not programs.active()
    assert float(_powered(x, 0.0, power=2)) == want
    assert _files(store) == []
    # Negative control: switched back on, a call is stored.
    monkeypatch.setenv("CBDP_JAX_PROGRAM_CACHE", "1")
    _powered(y, 0.0, power=2)
    assert len(_files(store)) == 1


@dataclasses.dataclass(frozen=True)
class _UsersConfig:
    """A user's frozen dataclass: its methods may do anything, so the store does not identify it."""

    scale: float = 1.0


def test_fingerprints_are_values_never_addresses():
    fp = programs.fingerprint
    assert fp((1, 2.5, "a", None, np.dtype("float32"))) == fp((1, 2.5, "a", None, np.float32))
    assert fp(1) != fp(1.0) and fp(True) != fp(1)
    assert fp(np.arange(3.0)) == fp(np.arange(3.0)) != fp(np.arange(3.0) + 1)
    assert fp(Divergence.renyi(2.0)) == fp(Divergence.renyi(2.0)) != fp(Divergence.renyi(4.0))
    assert fp(LaplaceMechanism(epsilon=1.0)) != fp(LaplaceMechanism(epsilon=2.0))
    for unknown in (lambda x: x, np.sum, _UsersConfig(), (1, lambda x: x), {"f": print}):
        assert fp(unknown) is None, unknown


@pytest.mark.slow
@pytest.mark.ci
def test_an_estimate_from_stored_programs_equals_one_traced(store, max_traces, monkeypatch):
    from cbdp_jax._src.estimator import adversary_fitting, evaluation

    cfg = EstimatorConfig(steps=100, ensemble=2, batch_size=512, eval_chunk=4096)

    def run():
        res = estimate(
            jax.random.key(3), LaplaceMechanism(epsilon=1.0), samples=5_000, test_samples=9_000,
            adversary="mlp", width=8, divergence="renyi", alpha=2.0, config=cfg,
        )  # fmt: skip
        return res.estimate, res.lower_bound, res.std_error, res.tail_index_q

    first = run()  # compiled afresh (JAX's persistent cache set aside) and stored
    assert len(_files(store)) >= 5
    programs._MEMORY.clear()  # as a new process
    max_traces(adversary_fitting, "_train_body", 0)
    max_traces(evaluation, "_chunk_body", 0)
    assert run() == first  # bit-identical, and nothing traced
    monkeypatch.setenv("CBDP_JAX_PROGRAM_CACHE", "0")
    assert run() == first  # the ordinary compiled functions agree


def test_an_executable_jax_already_holds_is_used_but_not_stored(store, monkeypatch):
    # compile() can return an executable JAX holds in memory, perhaps loaded from its persistent
    # cache; re-serialised, such an executable can fail when run (XLA:CPU), so only a compilation
    # seen to happen is stored.
    x = fresh()
    monkeypatch.setenv("CBDP_JAX_PROGRAM_CACHE", "0")
    _powered.jitted.lower(x, 0.5, power=5).compile()  # JAX now holds this program in memory
    monkeypatch.setenv("CBDP_JAX_PROGRAM_CACHE", "1")
    assert float(_powered(x, 0.5, power=5)) == float(jnp.sum(x**5) + 0.5)
    assert _files(store) == []
    # Negative control: a program JAX does not hold yet is compiled here, and stored.
    _powered(x, 0.5, power=6)
    assert len(_files(store)) == 1


def test_keys_give_the_bits_of_the_eager_calls(store):
    for seed in (0, 7, -3, 2**31 - 1, 2**40):
        got = jax.random.key_data(keys.from_seed(seed))
        np.testing.assert_array_equal(got, jax.random.key_data(jax.random.key(seed)))
    key = jax.random.key(11)
    for num in (2, 4):
        parts = keys.split(key, num=num)
        want = jax.random.split(key, num)
        assert len(parts) == num
        for i, k in enumerate(parts):
            np.testing.assert_array_equal(jax.random.key_data(k), jax.random.key_data(want[i]))
    np.testing.assert_array_equal(
        jax.random.key_data(keys.split_array(key, num=3)),
        jax.random.key_data(jax.random.split(key, 3)),
    )
    np.testing.assert_array_equal(
        jax.random.key_data(keys.fold_in(key, 5)),
        jax.random.key_data(jax.random.fold_in(key, 5)),
    )


def _cbdp(args, env, tmp_path):
    return subprocess.run(
        [sys.executable, "-m", "cbdp_jax.cli", *args],
        capture_output=True,
        text=True,
        env={**env, "CBDP_JAX_CACHE_DIR": str(tmp_path / "jax"), "CBDP_JAX_PROGRAM_CACHE": "1"},
        timeout=600,
    )


@pytest.mark.slow
@pytest.mark.ci
def test_a_second_cbdp_process_runs_stored_programs_and_prints_the_same_numbers(tmp_path):
    import os

    args = [
        "estimate", "--mechanism", "laplace", "--epsilon", "1", "--adversary", "linear",
        "--divergence", "kl", "--samples", "4000", "--steps", "100", "--format", "json",
    ]  # fmt: skip
    first = _cbdp(args, dict(os.environ), tmp_path)
    assert first.returncode == 0, first.stderr
    stored = _files(tmp_path / "jax" / "programs")
    assert len(stored) >= 5
    second = _cbdp(args, dict(os.environ), tmp_path)
    assert second.returncode == 0, second.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    for field in ("estimate", "lower_bound", "std_error", "tail_index_q", "sample_counts"):
        assert a[field] == b[field], field
    assert _files(tmp_path / "jax" / "programs") == stored  # nothing new: all were loaded


LIBRARY_CALL = """
import json, jax, numpy as np
from cbdp_jax.estimator import EstimatorConfig, estimate_from_samples
rng = np.random.default_rng(0)
p, q = rng.laplace(0.0, 1.0, 4000), rng.laplace(1.0, 1.0, 4000)
r = estimate_from_samples(jax.random.key(0), p, q, adversary="linear", divergence="kl",
                          config=EstimatorConfig(steps=100))
print(json.dumps([r.estimate, r.lower_bound, r.std_error]))
"""


def _library_call(tmp_path, store: str) -> subprocess.CompletedProcess:
    import os

    env = {
        **os.environ,
        "CBDP_JAX_CACHE_DIR": str(tmp_path / "jax"),
        "CBDP_JAX_PROGRAM_CACHE": store,
    }
    return subprocess.run(
        [sys.executable, "-c", LIBRARY_CALL], capture_output=True, text=True, env=env, timeout=600
    )


@pytest.mark.slow
@pytest.mark.ci
def test_a_library_users_second_process_runs_stored_programs_with_the_same_numbers(tmp_path):
    # estimate_from_samples is served by the store like the command line: a library user's second
    # process loads the first one's executables (nothing new is stored) and gets the same numbers.
    first = _library_call(tmp_path, "1")
    assert first.returncode == 0, first.stderr[-2000:]
    stored = _files(tmp_path / "jax" / "programs")
    assert len(stored) >= 5
    second = _library_call(tmp_path, "1")
    assert second.returncode == 0, second.stderr[-2000:]
    assert json.loads(second.stdout) == json.loads(first.stdout)
    assert _files(tmp_path / "jax" / "programs") == stored
    # negative control: opted out, the same call stores nothing
    off = _library_call(tmp_path / "off", "0")
    assert off.returncode == 0 and json.loads(off.stdout) == json.loads(first.stdout)
    assert not _files(tmp_path / "off" / "jax" / "programs")


def test_the_executable_exits_at_once_with_main_s_status(tmp_path):
    import os

    ok = _cbdp(["exact", "--mechanism", "laplace", "--epsilon", "1", "--adversary", "linear",
                "--divergence", "kl", "--format", "json"], dict(os.environ), tmp_path)  # fmt: skip
    assert ok.returncode == 0 and json.loads(ok.stdout)["value"] > 0.2
    bad = _cbdp(
        ["estimate", "--mechanism", "laplace", "--epsilon", "-1"], dict(os.environ), tmp_path
    )
    assert bad.returncode == 2 and "epsilon=-1.0 is invalid" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_the_store_keeps_under_its_size_limit_removing_the_least_recently_used(store, monkeypatch):
    import os
    import time

    x = fresh()
    for power in (1, 2, 3):
        _powered(x, 0.0, power=power)
    paths = _files(store)
    assert len(paths) == 3
    now = time.time()
    for age, path in zip((300, 200, 100), sorted(paths), strict=True):
        os.utime(path, (now - age, now - age))
    oldest = min(paths, key=lambda p: p.stat().st_mtime)
    sizes = sum(p.stat().st_size for p in paths)
    # A limit that fits all but the smallest share: exactly the oldest file goes.
    removed = programs.prune(store, sizes - 1)
    assert removed == 1 and not oldest.exists() and len(_files(store)) == 2
    # Negative control: a limit above the folder's size removes nothing.
    assert programs.prune(store, 10 * sizes) == 0 and len(_files(store)) == 2
    # Through the environment: a 0 MB limit empties the folder as soon as a new file is stored.
    monkeypatch.setenv("CBDP_JAX_PROGRAM_CACHE_MAX_MB", "0")
    _powered(x, 0.0, power=7)
    assert _files(store) == []


def _contracted(key):
    """Arithmetic whose last float32 bits depend on LLVM's optimisation level (multiply-adds)."""
    x = jax.random.normal(key, (4096,))
    return jnp.tanh(x * 1.7 + 0.3) * x + jnp.exp(-x * x * 0.5)


_contracted_quick = programs.persistent_jit(_contracted, quick=True)
_contracted_full = programs.persistent_jit(_contracted)


def _bits(fn, key):
    return np.asarray(fn(key)).view(np.uint32)


def test_a_quick_program_compiles_at_the_low_level_whether_the_store_serves_it_or_not(
    store, monkeypatch
):
    if jax.default_backend() != "cpu":
        pytest.skip("quick options apply on XLA:CPU only")
    monkeypatch.delenv("CBDP_JAX_QUICK_COMPILE", raising=False)
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    key = jax.random.key(3)
    # Served first (a program JAX already holds in memory is run but not stored): two files, as the
    # compiler options are part of the key.
    served = _bits(_contracted_quick, key)
    served_full = _bits(_contracted_full, key)
    assert len(_files(store)) == 2
    programs._MEMORY.clear()  # as a new process: the quick program comes back from its file
    np.testing.assert_array_equal(_bits(_contracted_quick, key), served)
    low = _bits(jax.jit(_contracted, compiler_options=programs.QUICK_OPTIONS), key)
    full = _bits(jax.jit(_contracted), key)
    # Negative control: the two levels give different bits here, so the equalities are informative.
    assert np.any(low != full)
    np.testing.assert_array_equal(served, low)
    np.testing.assert_array_equal(served_full, full)
    with monkeypatch.context() as m:  # the store off: the plain path compiles with the same options
        m.setenv("CBDP_JAX_PROGRAM_CACHE", "0")
        np.testing.assert_array_equal(_bits(_contracted_quick, key), low)


def test_quick_options_give_way_to_the_user(monkeypatch):
    if jax.default_backend() != "cpu":
        pytest.skip("quick options apply on XLA:CPU only")
    monkeypatch.delenv("CBDP_JAX_QUICK_COMPILE", raising=False)
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert programs.quick_options() == programs.QUICK_OPTIONS
    monkeypatch.setenv("CBDP_JAX_QUICK_COMPILE", "0")
    assert programs.quick_options() == {}
    key = jax.random.key(4)
    np.testing.assert_array_equal(_bits(_contracted_quick, key), _bits(jax.jit(_contracted), key))
    monkeypatch.setenv("CBDP_JAX_QUICK_COMPILE", "1")
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=2")
    assert programs.quick_options() == {}


def test_a_quick_program_inside_a_trace_is_inlined_without_options():
    key = jax.random.key(5)
    outer = jax.jit(lambda k: _contracted_quick(k) * 2.0)
    np.testing.assert_allclose(
        np.asarray(outer(key)), 2.0 * np.asarray(_contracted(key)), rtol=1e-6
    )
