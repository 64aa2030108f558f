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


@pytest.mark.parametrize("name", MODULES)
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
