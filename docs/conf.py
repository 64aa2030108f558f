"""Sphinx configuration: the documentation site (API reference from the docstrings, guide, theory).

Build it (warnings are errors, so a broken reference fails the build):

    python -m sphinx -W --keep-going -b html docs docs/_build/html

Everything it needs comes from the package index (``pip install -e ".[docs]"``); no inventory or page is
fetched from the network while building.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the working tree's cbdp_jax, also without an install

import cbdp_jax  # noqa: E402

project = "cbdp_jax"
author = "the cbdp_jax authors"
copyright = "the cbdp_jax authors"  # noqa: A001
release = cbdp_jax.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
# docs/examples/*.py and the generators are programs, not pages; figures are reached through pages.
exclude_patterns = ["_build", "examples", "figures/audit_example/*.txt"]

# ------------------------------------------------------------------------------------------------
# Broken references fail the build: nitpicky mode warns on every cross-reference that does not
# resolve (and -W makes that an error). Only types from other libraries are let through: no
# inventory is downloaded (the build needs nothing beyond the package index), so they cannot resolve.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(jax|jnp|jaxlib|np|numpy|optax|flax|nnx|chex|typer|click|rich|matplotlib)(\..*)?"),
    (r"py:.*", r"(dp_accounting|scipy|collections|typing|types|pathlib|os|io|enum)(\..*)?"),
    (r"py:.*", r"(Array|ArrayLike|PRNGKeyArray|KeyArray|Path|Callable|Sequence|Mapping|Iterable)"),
    (r"py:.*", r"(Iterator|Any|Literal|NamedTuple|Self|TypeVar|Optional|Union|PyTree)"),
    (r"py:.*", r"(float|int|str|bool|bytes|dict|list|tuple|None|object|type|complex)"),
    (r"py:.*", r"(ValueError|RuntimeError|TypeError|Exception|KeyboardInterrupt)"),
    (r"py:.*", r"(ArrayImpl|Module|Rngs|Generator|GradientTransformation\w*|Params|Updates)"),
]

# ------------------------------------------------------------------------------------------------
# API reference: Google docstrings (napoleon); the public modules re-export from cbdp_jax._src with an
# explicit __all__, which autodoc follows.
autodoc_default_options = {"members": True, "member-order": "bysource"}
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True  # Attributes as fields of the class, not members described twice
napoleon_custom_sections = [
    ("References", "notes"),
    ("Assumes", "notes"),
    ("Raises", "params_style"),
]

# ------------------------------------------------------------------------------------------------
# Markdown pages (MyST): heading anchors so that links to page#section resolve, and are checked.
myst_heading_anchors = 3
# A page that skips a heading level (H1 to H3) still renders; that is not a broken reference.
suppress_warnings = ["myst.header"]

html_theme = "furo"
html_title = f"cbdp_jax {release}"
html_static_path: list[str] = []


_LITERAL = re.compile(r"(``.+?``)")


def _escape_bars(app, what, name, obj, options, lines):
    """Lets the plain-text ``|x|`` (an absolute value, a norm) of the docstrings through as text.

    reStructuredText reads ``|x|`` as a substitution; the docstrings mean the bars. Code stays as
    written: inline literals, doctest blocks (``>>>`` to the next blank line) and literal blocks
    (after a line ending in ``::``, while indented).
    """
    in_doctest, literal_indent = False, None
    for i, line in enumerate(lines):
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if literal_indent is not None:
            if stripped and indent <= literal_indent:
                literal_indent = None
            else:
                continue
        if stripped.startswith(">>>"):
            in_doctest = True
        elif not stripped:
            in_doctest = False
        if in_doctest:
            continue
        if "|" in line:
            parts = _LITERAL.split(line)
            lines[i] = "".join(p if p.startswith("``") else p.replace("|", r"\|") for p in parts)
        if stripped.endswith("::"):
            literal_indent = indent


def _prose_property(app, what, name, obj, options, lines):
    """Puts back a property's first words that napoleon took for its type (``A: b`` read as type A).

    A property's type is its return annotation, shown in the signature; its docstring is prose such as
    "The number of examples of D: the n data and the canary".
    """
    if what != "property":
        return
    types = [i for i, line in enumerate(lines) if line.startswith(":type: ")]
    if not types:
        return
    words = lines.pop(types[0])[len(":type: ") :]
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        lines.append(words)
    else:
        lines[first] = f"{words}: {lines[first]}"


def _skip_field_aliases(app, what, name, obj, skip, options):
    """Leaves out a NamedTuple's ``Alias for field number k`` members: its Attributes section says it."""
    doc = getattr(obj, "__doc__", None) or ""
    return True if doc.startswith("Alias for field number") else None


def _private_names() -> set[str]:
    """Every name defined under ``cbdp_jax._src``: modules, module attributes and class members."""
    import importlib
    import pkgutil

    import cbdp_jax._src as src

    names = set()
    for info in pkgutil.walk_packages(src.__path__, "cbdp_jax._src."):
        try:
            module = importlib.import_module(info.name)
        except Exception:  # noqa: BLE001 - a module that needs an optional extra
            continue
        names.update({info.name, info.name.rsplit(".", 1)[-1]})
        for attr, value in vars(module).items():
            names.add(attr)
            if isinstance(value, type) and value.__module__ == info.name:
                names.update(vars(value))
    return names


_PRIVATE: set[str] = set()


def _resolve(app, env, node, contnode):
    """Resolves what the Python domain could not: private names to their public documented name.

    Signatures and docstrings name objects where they are defined (``cbdp_jax._src.estimator.estimate.X``, or a
    short ``:class:`Bound``` in a private module); the reference documents them where users import them
    (``cbdp_jax.estimator.X``), and the link goes there. A name that only exists privately (a helper a
    docstring mentions) is shown as code without a link. Any other name -- a misspelt or removed one --
    stays unresolved, and nitpicky mode (with -W) fails the build on it.
    """
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    name = target.rsplit(".", 1)[-1]
    domain = env.get_domain("py")
    public = sorted(
        full
        for full, entry in domain.objects.items()
        if full.rsplit(".", 1)[-1] == name and "._src." not in full and not entry.aliased
    )
    if public and (target.startswith("cbdp_jax._src.") or "." not in target or len(public) == 1):
        same = [p for p in public if p.startswith(node.get("py:module") or "\0")]
        chosen = (same or public)[0]
        ref = domain.resolve_xref(
            env, node.get("refdoc", ""), app.builder, node.get("reftype"), chosen, node, contnode
        )
        if ref is not None:
            return ref
    if target.startswith("cbdp_jax."):
        return contnode if _exists(target) else None
    if not _PRIVATE:
        _PRIVATE.update(_private_names())
    return contnode if name in _PRIVATE else None


def _exists(dotted: str) -> bool:
    """Whether ``a.b.c`` names a module, or an attribute reached from one (private names included)."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def setup(app):
    """Registers the docstring filters and the reference resolver."""
    app.connect("autodoc-process-docstring", _prose_property, priority=550)
    app.connect("autodoc-process-docstring", _escape_bars, priority=600)
    app.connect("autodoc-skip-member", _skip_field_aliases)
    app.connect("missing-reference", _resolve)
