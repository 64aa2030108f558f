"""JAX's persistent compilation cache, on by default in a user cache folder.

A first ``cbdp estimate`` process spends most of its time compiling; with the cache, a second process
with the same shapes loads the compiled programs from disk instead. The folder is
``$CBDP_JAX_CACHE_DIR``, else ``$XDG_CACHE_HOME/cbdp_jax/jax``, else ``~/.cache/cbdp_jax/jax``.
Opt out with ``CBDP_JAX_COMPILATION_CACHE=0``; a cache folder already configured (by the user or
``JAX_COMPILATION_CACHE_DIR``) is kept. The folder is created private (0700) and used only when no other
user can write into it (:mod:`cbdp_jax._src.infra.store_safety`; otherwise one warning and no cache).
"""

from __future__ import annotations

import os
from pathlib import Path

from cbdp_jax._src.infra import store_safety

MIN_COMPILE_SECONDS = 0.0  # every program, even the small eager ones (each saves its compile)


def cache_folder() -> Path:
    """Where compiled programs are kept."""
    explicit = os.environ.get("CBDP_JAX_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cbdp_jax" / "jax"


def opted_out(variable: str = "CBDP_JAX_COMPILATION_CACHE") -> bool:
    """Whether ``variable``, or ``CBDP_JAX_COMPILATION_CACHE`` (every cache), is 0, false or no."""
    for name in {variable, "CBDP_JAX_COMPILATION_CACHE"}:
        if os.environ.get(name, "1").strip().lower() in ("0", "false", "no"):
            return True
    return False


def enable_compilation_cache() -> Path | None:
    """Turns the persistent cache on unless opted out or already configured; returns its folder."""
    if opted_out():
        return None
    import jax

    if jax.config.jax_compilation_cache_dir:
        return Path(jax.config.jax_compilation_cache_dir)
    folder = cache_folder()
    try:
        if not store_safety.make_private(folder):
            return None  # others could write there: no cache (store_safety warned once)
    except OSError:
        return None  # a read-only home: run without the cache rather than fail
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    return folder
