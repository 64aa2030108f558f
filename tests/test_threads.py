"""The two directions of an estimate run in two threads only where that changes nothing but the time.

``cbdp_jax._src.infra.threads.map_concurrently`` runs independent calls in threads unless JAX settings local
to the caller's thread are in force (a new thread would not see them) or the caller says not to; the
estimator's two directions then give the same numbers, bit for bit, as run one after the other; and
two threads that need the same stored program compile it once.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbdp_jax._src.estimator import estimate as estimator
from cbdp_jax._src.infra import programs, threads
from cbdp_jax.estimator import EstimatorConfig, estimate_from_samples


def _where(i):
    return i, threading.get_ident()


def test_calls_run_in_other_threads_and_come_back_in_order():
    out = threads.map_concurrently(_where, [(0,), (1,), (2,)])
    assert [i for i, _ in out] == [0, 1, 2]
    # Negative control for the tests below: without thread-local settings the calls leave this thread.
    assert all(ident != threading.get_ident() for _, ident in out)


@pytest.mark.parametrize(
    "context",
    [
        lambda: jax.default_matmul_precision("highest"),
        lambda: jax.default_device(jax.devices("cpu")[0]),
    ],
    ids=["matmul precision", "default device"],
)
def test_thread_local_jax_settings_keep_the_calls_in_the_callers_thread(context):
    # A new thread would start from the global settings, not the caller's: the calls stay here.
    with context():
        assert not threads.settings_carry_over()
        out = threads.map_concurrently(_where, [(0,), (1,)])
    assert [ident for _, ident in out] == [threading.get_ident()] * 2
    assert threads.settings_carry_over()  # and outside the block they carry over again


def test_concurrent_false_and_a_single_call_stay_in_the_callers_thread():
    here = threading.get_ident()
    assert [t for _, t in threads.map_concurrently(_where, [(0,), (1,)], concurrent=False)] == [
        here,
        here,
    ]
    assert threads.map_concurrently(_where, [(0,)]) == [(0, here)]


def test_an_exception_in_one_call_is_raised_to_the_caller():
    def fail(i):
        if i == 1:
            raise ValueError("call 1 failed")
        return i

    with pytest.raises(ValueError, match="call 1 failed"):
        threads.map_concurrently(fail, [(0,), (1,)])


def _both_directions(seed: int):
    rng = np.random.default_rng(seed)
    p, q = rng.laplace(0.0, 1.0, 6000), rng.laplace(1.0, 1.0, 6000)
    cfg = EstimatorConfig(steps=60, ensemble=2, batch_size=256, both_directions=True)
    res = estimate_from_samples(
        jax.random.key(seed), p, q, adversary="mlp", width=8, divergence="renyi", alpha=2.0,
        config=cfg,
    )  # fmt: skip
    return res


def test_both_directions_in_threads_equal_the_same_estimate_run_in_one_thread(monkeypatch):
    seen = []
    run = estimator._run

    def spy(*args, **kwargs):
        seen.append(threading.get_ident())
        return run(*args, **kwargs)

    monkeypatch.setattr(estimator, "_run", spy)
    a = _both_directions(0)
    assert len(set(seen)) == 2 and threading.get_ident() not in seen  # two worker threads ran
    seen.clear()
    monkeypatch.setattr(threads, "settings_carry_over", lambda: False)
    b = _both_directions(0)
    assert set(seen) == {threading.get_ident()}  # the same estimate, one thread
    assert _record(a) == _record(b) and _record(a.reverse) == _record(b.reverse)
    assert a.max_lower_bound == b.max_lower_bound


def _record(res) -> str:
    """Every field of a result but the wall time, the environment and the reverse direction."""
    skip = {"seconds", "environment", "reverse"}
    fields = {f.name: getattr(res, f.name) for f in dataclasses.fields(res) if f.name not in skip}
    return repr(jax.tree.map(lambda v: np.asarray(v).tolist(), fields))


@programs.persistent_jit(static_argnames=("power",))
def _stored(x, *, power: int):
    return jnp.sum(jnp.sin(x) ** power)


def test_two_threads_that_need_the_same_stored_program_compile_it_once(tmp_path, monkeypatch):
    monkeypatch.setenv("CBDP_JAX_CACHE_DIR", str(tmp_path / "jax"))
    monkeypatch.setenv("CBDP_JAX_PROGRAM_CACHE", "1")
    monkeypatch.setattr(programs, "_MEMORY", {})
    compiles = []
    load_or_compile = programs._load_or_compile

    def slow(*args, **kwargs):
        compiles.append(threading.get_ident())
        time.sleep(0.3)  # widen the window in which the other thread looks for the program
        return load_or_compile(*args, **kwargs)

    monkeypatch.setattr(programs, "_load_or_compile", slow)
    x = jnp.arange(4321.0)
    start = threading.Barrier(2)

    def call(power):
        start.wait()
        return float(_stored(x, power=power))

    with programs.enabled():
        out = threads.map_concurrently(call, [(3,), (3,)])
    assert out[0] == out[1] == float(jnp.sum(jnp.sin(x) ** 3))
    # Compiled once, by one thread; the other waited and ran it. (Without the store's lock both
    # threads find nothing in memory and both compile: this assertion then fails.)
    assert len(compiles) == 1
    assert len(list(programs.folder().glob("*.jaxexe"))) == 1
    # Control: two different programs are each compiled.
    compiles.clear()
    with programs.enabled():
        threads.map_concurrently(call, [(5,), (7,)])
    assert len(compiles) == 2
