"""Shared test configuration.

The suite runs with x64 off, as users run JAX by default: the library must give its documented accuracy
without the global flag (the exact layer computes in float64 on its own). Tests that need float64 arrays
from JAX itself carry the ``x64`` marker and run with ``jax.enable_x64(True)`` around them; run only
those with ``python -m pytest -q -m x64``.

The program store (``cbdp_jax/_src/infra/programs.py``: compiled programs kept on disk for the next ``cbdp``
process) is off for the whole suite, subprocesses included: a test that patches library code must never
be served an executable stored from the unpatched code. ``tests/test_programs.py`` switches it on in a
folder of its own.

Compiled programs are released (``jax.clear_caches()``) after a test module that leaves the process with
more than 30,000 memory mappings. Every XLA:CPU executable held in memory keeps mappings of its own; one
process running the whole suite reached about 65,000 of them near the 1,100th test, Linux's default
``vm.max_map_count`` (65,530), and died with a segmentation fault inside XLA (four runs of four, at the
same test; every file passed on its own). Releasing only then keeps the programs that later modules
share compiled. JAX's persistent compilation cache is off in this
process too (the crash first showed inside its serialisation); subprocesses (the CLI tests) keep it, as a
user's ``cbdp`` process has it.

Hypothesis runs derandomized (a fixed sequence of examples, the same on every run and machine): a
property test that fails once fails every time, and CI cannot be red by the luck of a draw. Set
``HYPOTHESIS_PROFILE=explore`` to draw fresh examples locally.

On a GPU the suite asks XLA for deterministic kernels (``--xla_gpu_deterministic_ops=true`` in
``XLA_FLAGS``, unless the flag is set already; ``cbdp_jax._src.infra.determinism``), as the ``cbdp`` command
does for its processes: the
tests that compare two runs bit for bit (the two directions in threads against one thread, the same key
twice) test the library's promise under the setting that makes it (docs/guide/scaling.md, "On a GPU").
Without it, XLA's autotuning and atomic reductions change the last bits from one compilation or run to
the next, and a trained critic amplifies them (an H100 run on 2026-11-27:
benchmarks/measured/h100-2026-11-27/). CPU programs are unaffected.
"""

import os

import chex
import jax
import pytest
from hypothesis import settings

from cbdp_jax._src.infra.determinism import request_deterministic_gpu_ops

request_deterministic_gpu_ops()  # before any test initialises JAX's backend

os.environ["CBDP_JAX_PROGRAM_CACHE"] = "0"
jax.config.update("jax_enable_compilation_cache", False)

settings.register_profile("derandomized", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "derandomized"))


MAX_MAPPINGS = 30_000


def memory_mappings() -> int:
    """This process's memory mappings (Linux; 0 where /proc is not there)."""
    try:
        with open("/proc/self/maps") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return 0


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drops every compiled program after a module that leaves many mappings (module docstring)."""
    yield
    if memory_mappings() > MAX_MAPPINGS:
        jax.clear_caches()


@pytest.fixture(autouse=True)
def _x64_for_marked_tests(request):
    """x64 on for the duration of a test marked ``x64``, off (JAX's default) for every other test; an
    unmarked test that finds x64 on fails (a test switched it on globally and leaked it)."""
    if request.node.get_closest_marker("x64") is None:
        assert not jax.config.jax_enable_x64, "x64 is on outside an x64-marked test (leaked)"
        yield
        return
    with jax.enable_x64(True):
        yield


@pytest.fixture
def max_traces(monkeypatch):
    """``max_traces(module, name, n)``: the body ``module.name`` of a compiled program may be traced at
    most ``n`` more times in this test (``chex.assert_max_traces``; the programs look their bodies up
    when traced, so the wrapper sees every trace and nothing else)."""

    def wrap(module, name: str, n: int) -> None:
        chex.clear_trace_counter()
        monkeypatch.setattr(module, name, chex.assert_max_traces(getattr(module, name), n=n))

    return wrap


@pytest.fixture(scope="module")
def no_noise_probes():
    """Training problems prepared in this module skip the probes of the step's noise (``defects`` stays
    empty), as ``prepare(problem, noise_probes=False)`` does; for modules whose subject is not the
    probes and that reach ``prepare`` through ``audit_training`` or ``training_mechanism``
    (``pytestmark = pytest.mark.usefixtures("no_noise_probes")``). The probes compile and run programs
    of their own in every ``prepare`` (a few CPU seconds each); tests/test_noise_probes.py tests them,
    end to end included. Module-scoped, so the module's tests still share the mechanisms (and compiled
    programs) ``audit_training`` keeps; those are dropped before and after the module, so no test is
    served a mechanism prepared under the other setting."""
    from cbdp_jax._src.training_auditor import audit_training as training_audit
    from cbdp_jax._src.training_auditor import prepare

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prepare, "noise_defects", lambda *args, **kwargs: ())
        training_audit._MECHANISMS.clear()
        yield
        training_audit._MECHANISMS.clear()


def pytest_collection_modifyitems(config, items):
    """A test marked ``ci`` (a slow test CI runs on every landing) must also be marked ``slow``: the
    marker says which slow tests CI adds, and a ``ci`` test in the default run would run twice there."""
    loose = [
        i.nodeid for i in items if i.get_closest_marker("ci") and not i.get_closest_marker("slow")
    ]
    if loose:
        raise pytest.UsageError(f"marked ci but not slow: {', '.join(loose[:5])}")
