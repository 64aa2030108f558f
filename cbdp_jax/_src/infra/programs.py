"""Compiled programs kept on disk as executables, so that a later process runs them without tracing.

JAX's persistent compilation cache (:mod:`cbdp_jax._src.infra.cache`) saves the XLA compile, but its key is the
lowered program: a second process still traces every program in Python and lowers it to StableHLO
before it can look the executable up, about a second for one ``cbdp estimate`` of an MLP. This module
skips both. A program decorated with :func:`persistent_jit` is an ordinary ``jax.jit`` function until
the store is switched on (:func:`enabled`: the command line around each estimate, and the library's
``estimate`` / ``estimate_from_samples`` through :func:`served`); then each
call computes a key from

- the program (module and name),
- a fingerprint of every static argument (:func:`fingerprint`),
- the tree structure, shape, dtype, weak type and placement of every dynamic argument,
- the compiler options the program is compiled with (a ``quick`` program's, below),
- the environment: the package's source code (a hash of every file), the versions of Python, JAX,
  jaxlib, Flax, Optax and NumPy, the backend and its devices, ``XLA_FLAGS``, and the JAX settings that
  change a traced program (x64, matmul precision, the default PRNG implementation);

and runs the executable stored under that key (``jax.experimental.serialize_executable``), compiling
and storing it on a miss. A static argument the module cannot fingerprint soundly -- a user's module,
optimiser, callback or function -- sends the call to the plain ``jax.jit`` path: the store never runs a
program it cannot prove is the one the call would have traced. A call inside a user's trace (a tracer
among the arguments) is inlined as usual.

Only executables seen compiled afresh are stored (JAX's persistent cache is set aside for that compile):
on XLA:CPU an executable JAX loaded from its own cache does not survive a second serialisation. A stored
executable that still fails when run is deleted, and the call is traced as usual.

The files live in ``programs/`` inside the package's cache folder (``$CBDP_JAX_CACHE_DIR/programs``, by
default ``~/.cache/cbdp_jax/jax/programs``; JAX's own cache files there are ``*-cache`` and never
collide); deleting it is always safe. ``CBDP_JAX_PROGRAM_CACHE=0`` turns the store off, and so does
``CBDP_JAX_COMPILATION_CACHE=0``. The folder is kept under ``CBDP_JAX_PROGRAM_CACHE_MAX_MB`` (default
1024): past it, the least recently used files go.

A program declared ``quick`` (one that runs once per call, for a millisecond: the adversaries'
initialisation) is compiled on XLA:CPU with LLVM's optimisation turned down (:data:`QUICK_OPTIONS`):
its compile is what a first call waits for, and its run barely changes. Programs a warm call spends
its time in (training, evaluation, the fit) keep XLA's full optimisation. The options are part of
the program (the plain ``jax.jit`` path compiles with the same ones, and the key above includes
them), so a result does not depend on whether the store served it. ``CBDP_JAX_QUICK_COMPILE=0``
compiles every program at the full level; so does an ``xla_backend_optimization_level`` the user set
in ``XLA_FLAGS``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import os
import pickle
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np

from cbdp_jax._src.infra import store_safety
from cbdp_jax._src.infra.cache import cache_folder, opted_out

_PACKAGE = Path(__file__).resolve().parents[2]
_STATE = {"depth": 0}
_MEMORY: dict[str, Any] = {}
_LOADED: dict[str, Path] = {}  # executables read from disk in this process, by key
_REGISTERED: dict[Any, str] = {}

# XLA:CPU options of a quick program: LLVM at its lowest optimisation level. The estimator's
# programs at each level (benchmarks/compile_levels.py, benchmarks/measured/first-call/): the
# initialisation compiles in half the CPU time (0.50 against 1.04 s) and runs once per estimate (1 ms);
# the evaluation, fit and training programs would save 30-50% of their compiles but run 2.5-10x
# longer, which a warm call at 10^5 samples per side pays, so they stay at the full level.
QUICK_OPTIONS: dict[str, Any] = {"xla_backend_optimization_level": 0}


def folder() -> Path:
    """Where executables are stored."""
    return cache_folder() / "programs"


def active() -> bool:
    """Whether calls are served from the store now (inside :func:`enabled`, and not opted out)."""
    return _STATE["depth"] > 0 and not opted_out("CBDP_JAX_PROGRAM_CACHE")


@contextlib.contextmanager
def enabled() -> Iterator[None]:
    """Serves :func:`persistent_jit` programs from the on-disk store inside the block."""
    _STATE["depth"] += 1
    try:
        yield
    finally:
        _STATE["depth"] -= 1


def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with the store on, once more without what it loaded if that failed.

    An executable's run-time error surfaces when its outputs are read, not when it is called. If
    ``fn`` raises a ``JaxRuntimeError`` after executables were loaded from disk, those files are
    deleted and ``fn`` runs again, tracing and storing afresh (the programs are pure, so running them
    twice is safe); an error that remains is raised. Where nothing was loaded the error is raised as is.
    """
    with enabled():
        _LOADED.clear()
        try:
            return fn(*args, **kwargs)
        except jax.errors.JaxRuntimeError:
            if not _LOADED:
                raise
            discard_loaded()
        return fn(*args, **kwargs)


def served(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with the store on for the whole call (:func:`run`): a library entry point's cold start.

    A call made while the store is already on (the command line, or an outer served function) runs
    ``fn`` as is. ``CBDP_JAX_PROGRAM_CACHE=0`` still turns the store off.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _STATE["depth"] > 0:
            return fn(*args, **kwargs)
        return run(fn, *args, **kwargs)

    return wrapper


def discard_loaded() -> int:
    """Deletes the executables loaded from disk in this process (and forgets them); returns how many."""
    n = len(_LOADED)
    for key, path in _LOADED.items():
        _MEMORY.pop(key, None)
        path.unlink(missing_ok=True)
    _LOADED.clear()
    return n


def register(obj: Any, recipe: str) -> None:
    """Declares that the hashable ``obj`` (a trainer, a graph definition) is fully described by ``recipe``.

    Only the library registers objects, for what it builds itself from fingerprintable values (a
    built-in adversary class, a divergence, a dimension, a dtype, a named optimiser).
    """
    _REGISTERED[obj] = recipe


def fingerprint(value: Any) -> str | None:
    """A string that determines ``value`` as a static argument, or None where none is sound.

    Numbers, strings, None, dtypes, tuples, lists and dicts of such, concrete arrays (by their bytes),
    registered objects, frozen dataclasses defined in this package (field by field) and bound methods
    of those. Anything else -- a function, a user's class -- is None: its behaviour is not determined
    by what could be written down here (a function's repr names an address, which another process may
    reuse for other code).
    """
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, (tuple, list)) and not hasattr(value, "_fields"):
        return _joined(type(value).__name__, [fingerprint(v) for v in value])
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: repr(kv[0]))
        return _joined("dict", [_pair(k, v) for k, v in items])
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return f"dtype:{np.dtype(value).name}"
    if isinstance(value, (np.ndarray, np.generic)) or _concrete_array(value):
        a = np.asarray(value)
        return f"array:{a.dtype.name}{a.shape}:{hashlib.sha256(a.tobytes()).hexdigest()}"
    try:
        recipe = _REGISTERED.get(value)
    except TypeError:  # unhashable
        recipe = None
    if recipe is not None:
        return f"registered:{recipe}"
    if inspect.ismethod(value):
        owner = fingerprint(value.__self__)
        name = f"{value.__func__.__module__}.{value.__func__.__qualname__}"
        return None if owner is None or not _ours(value.__func__) else f"{owner}.{name}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and _ours(type(value)):
        fields = [_pair(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
        return _joined(f"{type(value).__module__}.{type(value).__qualname__}", fields)
    return None


def _pair(k: Any, v: Any) -> str | None:
    fv = fingerprint(v)
    return None if fv is None else f"{k!r}={fv}"


def _joined(head: str, parts: list[str | None]) -> str | None:
    return None if any(p is None for p in parts) else f"{head}({','.join(parts)})"


def _ours(obj: Any) -> bool:
    return getattr(obj, "__module__", "").split(".")[0] == "cbdp_jax"


def _concrete_array(value: Any) -> bool:
    return isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer)


@functools.cache
def _environment() -> str:
    """Everything outside a call that decides what its traced program is (computed once)."""
    import flax
    import jaxlib
    import optax

    source = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        source.update(str(path.relative_to(_PACKAGE)).encode())
        source.update(path.read_bytes())
    devices = jax.devices()
    parts = (
        sys.version,
        jax.__version__,
        jaxlib.__version__,
        flax.__version__,
        optax.__version__,
        np.__version__,
        devices[0].platform,
        devices[0].client.platform_version,
        tuple(d.device_kind for d in devices),
        os.environ.get("XLA_FLAGS", ""),
        source.hexdigest(),
    )
    return repr(parts)


def _settings() -> tuple:
    """The JAX settings a traced program depends on, read at each call (they can change in-process)."""
    c = jax.config
    return (
        c.jax_enable_x64,
        str(c.jax_default_matmul_precision),
        str(c.jax_default_prng_impl),
        c.jax_threefry_partitionable,
    )


def _leaf_signature(x: Any) -> tuple | None:
    if isinstance(x, jax.core.Tracer):
        return None
    aval = jax.typeof(x)
    sharding = str(x.sharding) if isinstance(x, jax.Array) else ""
    return (aval.shape, str(aval.dtype), bool(getattr(aval, "weak_type", False)), sharding)


def quick_options() -> dict[str, Any]:
    """The compiler options of a ``quick`` program here and now: :data:`QUICK_OPTIONS` on XLA:CPU.

    Empty on other backends (not measured there), with ``CBDP_JAX_QUICK_COMPILE=0``, and where
    ``XLA_FLAGS`` sets the optimisation level itself (the user's choice wins).
    """
    if os.environ.get("CBDP_JAX_QUICK_COMPILE", "1").strip().lower() in ("0", "false", "no"):
        return {}
    if "xla_backend_optimization_level" in os.environ.get("XLA_FLAGS", ""):
        return {}
    if jax.default_backend() != "cpu":
        return {}
    return dict(QUICK_OPTIONS)


def _top_level() -> bool:
    """Whether no JAX trace is in progress (a jit called here compiles a program of its own)."""
    try:
        from jax._src import core

        return bool(core.trace_state_clean())
    except (ImportError, AttributeError):  # a JAX without the private name: never quick
        return False


def _key(
    name: str, statics: str, args: tuple, kwargs: dict, options: dict | None = None
) -> str | None:
    leaves, tree = jax.tree.flatten((args, kwargs))
    sig = []
    for leaf in leaves:
        s = _leaf_signature(leaf)
        if s is None:
            return None
        sig.append(s)
    compile_options = tuple(sorted((options or {}).items()))
    text = repr(
        (name, statics, str(tree), tuple(sig), compile_options, _settings(), _environment())
    )
    return hashlib.sha256(text.encode()).hexdigest()


def _load(path: Path) -> Any | None:
    from jax.experimental import serialize_executable

    if not store_safety.trusted(cache_folder(), path):
        return None  # a file or folder another user could have written: never unpickled
    try:
        payload, in_tree, out_tree = pickle.loads(path.read_bytes())
        compiled = serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
        os.utime(path)  # recently used: the size limit removes the others first
        return compiled
    except Exception:  # noqa: BLE001 -- a missing, partial or foreign file is a miss, never an error
        return None


def max_bytes() -> int:
    """The store's size limit, ``CBDP_JAX_PROGRAM_CACHE_MAX_MB`` megabytes (default 1024)."""
    try:
        return int(float(os.environ.get("CBDP_JAX_PROGRAM_CACHE_MAX_MB", "1024")) * 2**20)
    except ValueError:
        return 1024 * 2**20


def prune(where: Path, limit: int) -> int:
    """Removes the least recently used executables until ``where`` holds at most ``limit`` bytes.

    Returns the number of files removed. Files other processes remove meanwhile are skipped.
    """
    entries = []
    for path in where.glob("*.jaxexe"):
        try:
            st = path.stat()
        except OSError:
            continue
        entries.append((st.st_mtime, st.st_size, path))
    total = sum(size for _, size, _ in entries)
    removed = 0
    for _, size, path in sorted(entries):
        if total <= limit:
            break
        path.unlink(missing_ok=True)
        total -= size
        removed += 1
    return removed


def _store(path: Path, compiled: Any) -> None:
    from jax.experimental import serialize_executable

    try:
        blob = pickle.dumps(serialize_executable.serialize(compiled))
        if store_safety.write_private(cache_folder(), path, blob):
            prune(path.parent, max_bytes())
    except Exception:  # noqa: BLE001 -- not serialisable (host callbacks) or a read-only folder
        pass


@contextlib.contextmanager
def _without_jax_cache() -> Iterator[bool]:
    """Compiles inside the block bypass JAX's persistent cache; yields whether that was possible.

    An executable JAX loaded from its own cache does not survive a second serialisation on XLA:CPU
    (jax 0.10: the stored copy fails when run, "Function bitcast_concatenate_fusion not found"), so
    only freshly compiled executables are stored. JAX decides once per process whether its cache is
    in use (``jax._src.compilation_cache``); that decision is set aside for the block and restored.
    Where those private names are missing, nothing is bypassed and the caller stores nothing.
    """
    from jax._src import compilation_cache as cc

    names = ("_cache_initialized_mutex", "_cache_checked", "_cache_used")
    if not all(hasattr(cc, n) for n in names):
        yield False
        return
    with cc._cache_initialized_mutex:
        saved = (cc._cache_checked, cc._cache_used)
        cc._cache_checked, cc._cache_used = True, False
    try:
        yield True
    finally:
        with cc._cache_initialized_mutex:
            cc._cache_checked, cc._cache_used = saved


_COMPILES = {"listening": False}
# Per thread: JAX reports a compile in the thread that compiled, and another thread's compiles must
# not count as this one's.
_COMPILED_HERE = threading.local()
_COMPILE_LOCK = threading.Lock()


def _compiles_here() -> int:
    """XLA compilations this thread has done since counting began."""
    return getattr(_COMPILED_HERE, "n", 0)


def _count_compiles() -> None:
    """Counts XLA compilations (JAX's backend-compile events), from the first call on, per thread."""
    if _COMPILES["listening"]:
        return

    def listener(event: str, duration: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            _COMPILED_HERE.n = _compiles_here() + 1

    jax.monitoring.register_event_duration_secs_listener(listener)
    _COMPILES["listening"] = True


def _executable(jitted, key: str, args: tuple, kwargs: dict) -> tuple[Any, bool]:
    """The executable for ``key`` and whether it was loaded from disk (not yet run here).

    Only an executable this call saw compiled afresh is stored. ``compile()`` may instead return one
    JAX already holds in memory, which may have come from JAX's persistent cache, and such an
    executable does not survive a second serialisation (:func:`_without_jax_cache`).
    """
    compiled = _MEMORY.get(key)
    if compiled is not None:
        return compiled, False
    # One load or compile at a time: threads that need the same program (an estimate's two
    # directions) then compile it once, and the compile counter and the bypass of JAX's cache below
    # see one compile at a time.
    with _COMPILE_LOCK:
        compiled = _MEMORY.get(key)
        if compiled is not None:
            return compiled, False
        return _load_or_compile(jitted, key, args, kwargs)


def _load_or_compile(jitted, key: str, args: tuple, kwargs: dict) -> tuple[Any, bool]:
    path = folder() / f"{key}.jaxexe"
    compiled = _load(path)
    loaded = compiled is not None
    if loaded:
        _LOADED[key] = path
    else:
        _count_compiles()
        before = _compiles_here()
        with _without_jax_cache() as bypassed:
            compiled = jitted.lower(*args, **kwargs).compile()
        if bypassed and _compiles_here() > before:
            _store(path, compiled)
    _MEMORY[key] = compiled
    return compiled, loaded


def _run(jitted, key: str, args: tuple, kwargs: dict, statics: dict) -> Any:
    compiled, loaded = _executable(jitted, key, args, {**kwargs, **statics})
    try:
        return compiled(*args, **kwargs)
    except jax.errors.JaxRuntimeError:
        if not loaded:
            raise
        # A stored executable refused at dispatch: forget it and trace as usual (the programs are
        # pure). An error that surfaces later, when outputs are read, is for run() to handle.
        _MEMORY.pop(key, None)
        _LOADED.pop(key, None)
        (folder() / f"{key}.jaxexe").unlink(missing_ok=True)
        return jitted(*args, **kwargs, **statics)


def persistent_jit(
    fun: Callable | None = None, *, static_argnames: tuple[str, ...] = (), quick: bool = False
) -> Callable:
    """``jax.jit(fun, static_argnames=...)`` whose executables a later process loads from disk.

    Outside :func:`enabled` the call is exactly the jitted function's (``.jitted`` is that function,
    compiled at XLA's full optimisation). Inside it, see the module docstring. ``quick``: a program
    that runs for milliseconds, compiled with :func:`quick_options` whether the store is on or not.
    """
    if fun is None:
        return functools.partial(persistent_jit, static_argnames=static_argnames, quick=quick)
    full = jax.jit(fun, static_argnames=static_argnames)
    variants: dict[tuple, Callable] = {(): full}

    def jitted_for(options: dict[str, Any]) -> Callable:
        tag = tuple(sorted(options.items()))
        found = variants.get(tag)
        if found is None:  # setdefault: two threads that race here end up with the same function
            made = jax.jit(fun, static_argnames=static_argnames, compiler_options=options)
            found = variants.setdefault(tag, made)
        return found

    name = f"{fun.__module__}.{fun.__qualname__}"
    positional = [
        p.name
        for p in inspect.signature(fun).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]

    @functools.wraps(fun)
    def call(*args, **kwargs):
        # Inside another trace a program is inlined into the caller's, which JAX compiles with the
        # caller's options (a nested jit may not name its own).
        options = quick_options() if quick and _top_level() else {}
        jitted = jitted_for(options)
        if not active():
            return jitted(*args, **kwargs)
        if any(n in static_argnames for n in positional[: len(args)]):
            # A static passed by position: pass everything by name (the executable keeps that form).
            named = dict(zip(positional[: len(args)], args, strict=True))
            kwargs, args = {**named, **kwargs}, ()
        statics = {k: kwargs.pop(k) for k in static_argnames if k in kwargs}
        static_fp = fingerprint(statics)
        key = None if static_fp is None else _key(name, static_fp, args, kwargs, options)
        if key is None:
            return jitted(*args, **kwargs, **statics)
        return _run(jitted, key, args, kwargs, statics)

    call.jitted = full
    call.quick = quick
    return call


__all__ = [
    "active",
    "discard_loaded",
    "enabled",
    "fingerprint",
    "folder",
    "max_bytes",
    "persistent_jit",
    "prune",
    "quick_options",
    "register",
    "run",
]
