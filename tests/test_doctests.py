"""Every docstring example in the package runs and prints what it shows (doctest, in CI)."""

from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

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
SLOW_MODULES = ("cbdp_jax._src.estimator.estimate", "cbdp_jax._src.estimator.sweep")


class Finder(doctest.DocTestFinder):
    """doctest's finder, also for functions wrapped by a decorator from another module.

    The standard finder keeps a function only if its ``__globals__`` are the module's, so a function
    wrapped with ``functools.wraps`` by a decorator defined elsewhere lost its examples silently (the
    estimator's ``estimate_from_samples`` did); the wrapped function's module decides here.
    """

    def _from_module(self, module, object):  # noqa: A002 - doctest's own signature
        if inspect.isfunction(object):
            object = inspect.unwrap(object)
        return super()._from_module(module, object)


def run_examples(module) -> doctest.TestResults:
    """Runs every docstring example of ``module`` (what ``doctest.testmod`` does, with Finder)."""
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    runner = doctest.DocTestRunner(optionflags=flags, verbose=False)
    for test in Finder().find(module, module.__name__):
        runner.run(test)
    return runner.summarize(verbose=False)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(m, marks=(pytest.mark.slow, pytest.mark.ci) if m in SLOW_MODULES else ())
        for m in MODULES
    ],
)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = run_examples(module)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def test_doctest_runner_catches_a_wrong_example():
    """Negative control: an example whose shown output is wrong fails."""
    import types

    module = types.ModuleType("planted")
    module.f = lambda: None
    module.f.__doc__ = ">>> 1 + 1\n3\n"
    module.__test__ = {"f": module.f.__doc__}
    assert doctest.testmod(module, report=False).failed == 1


EXAMPLE = re.compile(r"^\s*>>> ?(?!\s*#)(?=\S)", re.M)  # an example's first line (not a comment)


def test_every_example_in_the_source_is_collected():
    """Each ``>>>`` line of the package's source starts an example that the tests above run.

    An example doctest cannot see (a wrapped function, an object the finder skips, a module left out
    by SKIP) would otherwise never run; here it is counted in its file and missing from what is found.
    """
    root = Path(cbdp_jax.__file__).resolve().parent
    in_source = {}
    for path in root.rglob("*.py"):
        count = len(EXAMPLE.findall(path.read_text()))
        if count:
            in_source[path] = count
    found, seen = {}, set()
    for name in MODULES:
        for test in Finder().find(importlib.import_module(name), name):
            where = (Path(test.filename).resolve(), test.lineno, test.docstring)
            if test.examples and where not in seen:  # a re-exported object is found twice
                seen.add(where)
                found[where[0]] = found.get(where[0], 0) + len(test.examples)
    assert sum(in_source.values()) >= 100
    assert found == in_source


def test_the_finder_sees_a_function_wrapped_elsewhere():
    """Negative control: doctest's own finder misses the wrapped function's example; Finder runs it."""
    import functools
    import types

    def decorate(f):  # defined here, so the wrapper's globals are this test module's
        @functools.wraps(f)
        def wrapper(*args):
            return f(*args)

        return wrapper

    module = types.ModuleType("planted")
    exec("def f():\n    '''>>> 1 + 1\n    3\n    '''\n", module.__dict__)  # a wrong example
    module.f = decorate(module.f)
    assert doctest.DocTestFinder().find(module) == []  # the standard finder skips it
    assert run_examples(module).failed == 1  # Finder runs it, and its wrong output fails
