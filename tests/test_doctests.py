"""Every docstring example in the package runs and prints what it shows (doctest, in CI)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import cbdp_jax

# The command line and the experiments run programs, not examples; everything else is collected.
SKIP = ("cbdp_jax.cli", "cbdp_jax.experiments", "cbdp_jax.__main__")
MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(cbdp_jax.__path__, "cbdp_jax.")
    if not m.name.startswith(SKIP)
)


# The estimator's and the sweep's examples train adversaries (about 15 s each on 2 cores): they run
# with -m slow and in CI (marker ci); every other module's examples run by default.
SLOW_MODULES = ("cbdp_jax._src.estimator", "cbdp_jax._src.sweep")


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(m, marks=(pytest.mark.slow, pytest.mark.ci) if m in SLOW_MODULES else ())
        for m in MODULES
    ],
)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    result = doctest.testmod(module, optionflags=flags, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def test_doctest_runner_catches_a_wrong_example():
    """Negative control: an example whose shown output is wrong fails."""
    import types

    module = types.ModuleType("planted")
    module.f = lambda: None
    module.f.__doc__ = ">>> 1 + 1\n3\n"
    module.__test__ = {"f": module.f.__doc__}
    assert doctest.testmod(module, report=False).failed == 1
