"""Where an exception came from in the user's own code: the file and line an error message names.

A user's mechanism, training factory, model or loss function that raises is reported in one line
(``InvalidParameterError``), and that line must say where: the innermost frame of the traceback that
lies outside this package, JAX, Flax, NumPy and the standard library (``mech.py:12``). The full
traceback is printed by the command line under ``cbdp --debug`` or ``CBDP_DEBUG=1``
(:func:`debug_enabled`; docs/errors.md).
"""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[2]  # cbdp_jax/
DEBUG_ENV = "CBDP_DEBUG"


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {str(_PACKAGE), paths.get("stdlib", ""), paths.get("platstdlib", ""),
             paths.get("purelib", ""), paths.get("platlib", "")}  # fmt: skip
    return tuple(r for r in roots if r)


def _is_library(filename: str) -> bool:
    if filename.startswith("<"):  # <frozen ...>, <string>
        return True
    path = os.path.realpath(filename)
    if "site-packages" in path or "dist-packages" in path:
        return True
    return any(path.startswith(os.path.realpath(root) + os.sep) for root in _library_roots())


def _shown(filename: str) -> str:
    """A path relative to the working folder when it lies under it, else as it is."""
    try:
        return (
            os.path.relpath(filename)
            if Path(filename).resolve().is_relative_to(Path.cwd())
            else filename
        )
    except (OSError, ValueError):
        return filename


def user_frame(exc: BaseException) -> str | None:
    """``'file.py:LINE'`` of the innermost traceback frame in the user's code, or None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:  # the innermost cause raised it
        seen.add(id(exc))
        frames = traceback.extract_tb(exc.__traceback__)
        for frame in reversed(frames):
            if not _is_library(frame.filename):
                return f"{_shown(frame.filename)}:{frame.lineno}"
        exc = exc.__cause__ or exc.__context__
    return None


def innermost_frame(exc: BaseException) -> str | None:
    """``'file.py:LINE'`` of the frame that raised ``exc`` (library or not), or None."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{_shown(frames[-1].filename)}:{frames[-1].lineno}" if frames else None


def describe(exc: BaseException) -> str:
    """``'TypeError: first line of the message, at my_train.py:12'``: one line, with the place."""
    first = str(exc).strip().splitlines()[0].rstrip(".") if str(exc).strip() else ""
    where = user_frame(exc)
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return f"{text}, at {where}" if where else text


def internal_error_text(exc: BaseException) -> str:
    """One line for an exception no check caught: what, where, and how to see the traceback."""
    where = user_frame(exc)
    if where is None:
        where = innermost_frame(exc)
        whose = "an error inside cbdp_jax (please report it with the traceback)"
    else:
        whose = "raised in your code"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return (
        f"{text}, at {where}: {whose}; rerun with cbdp --debug (or {DEBUG_ENV}=1) for the full "
        "traceback"
    )


_DEBUG = [False]  # ``cbdp --debug`` for this command


def set_debug(on: bool) -> None:
    """Records ``cbdp --debug`` (the command line resets it before each command)."""
    _DEBUG[0] = bool(on)


def debug_enabled() -> bool:
    """Whether the full traceback is wanted: ``--debug``, or ``CBDP_DEBUG`` set (not '', '0', 'false')."""
    return _DEBUG[0] or os.environ.get(DEBUG_ENV, "").strip().lower() not in (
        "",
        "0",
        "false",
        "no",
    )


def print_traceback(exc: BaseException) -> None:
    """The full traceback of ``exc`` and its causes, on standard error."""
    traceback.print_exception(exc, file=sys.stderr)


__all__ = [
    "DEBUG_ENV",
    "debug_enabled",
    "describe",
    "innermost_frame",
    "internal_error_text",
    "print_traceback",
    "set_debug",
    "user_frame",
]
