"""Independent host-side pipelines in threads, where that changes nothing but the wall time.

An estimate in both directions is two independent pipelines (train, plan, evaluate, certify), each
with its own key and samples. On a CPU a small network's training program leaves cores idle (its
small matrix products do not split well across cores), and programs dispatched one after the other
from one thread run one after the other. Two threads run the two pipelines side by side; JAX releases
the GIL while a program runs, so the other direction's work fills the idle cores. The numbers
are the same: each pipeline computes exactly what it computes alone (XLA's partitioning of a program
over cores does not depend on what else runs).

Two things would make a thread differ from its caller, and both send the work back to one thread:

* JAX keeps some settings per thread (``jax.default_device``, ``jax.default_matmul_precision``,
  ``jax.enable_x64`` used as context managers, ...). A new thread starts from the global values, so
  when the caller's settings differ from what a new thread sees, the pipelines run in the caller's
  thread, one after the other.
* Callbacks into user code (a progress callback) may not be safe to call from two threads at once;
  callers pass ``concurrent=False`` then.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def _jax_settings() -> Any:
    """JAX's settings that apply to this thread (those that tracing depends on), or None if unknown."""
    try:
        from jax._src import config
    except ImportError:  # pragma: no cover - a JAX without the private module
        return None
    context = getattr(config, "trace_context", None)
    return None if context is None else context()


def settings_carry_over() -> bool:
    """Whether a new thread would see the same JAX settings as this one (False when unsure)."""
    here = _jax_settings()
    if here is None:
        return False
    seen: list[Any] = []
    thread = threading.Thread(target=lambda: seen.append(_jax_settings()))
    thread.start()
    thread.join()
    return bool(seen) and seen[0] == here


# Set while an interrupt (Ctrl-C) in the calling thread waits for pipelines in other threads to stop:
# long loops (training segments, evaluation chunks) check it between compiled calls.
_CANCEL = threading.Event()


def cancelled() -> bool:
    """Whether pipelines running in threads should stop now (their caller was interrupted)."""
    return _CANCEL.is_set()


def map_concurrently(
    fn: Callable[..., T], items: Sequence[Any], *, concurrent: bool = True
) -> list[T]:
    """``[fn(*item) for item in items]``, the calls in threads when that is safe (module docstring).

    Results come back in the order of ``items``; an exception in any call is raised here. With one
    item, ``concurrent=False`` or thread-local JAX settings in force, the calls run here in order.
    An interrupt (``KeyboardInterrupt``) while waiting tells the threads to stop (:func:`cancelled`)
    and is raised once they have.
    """
    if len(items) < 2 or not concurrent or not settings_carry_over():
        return [fn(*item) for item in items]
    pool = ThreadPoolExecutor(max_workers=len(items), thread_name_prefix="cbdp")
    futures = [pool.submit(fn, *item) for item in items]
    try:
        return [f.result() for f in futures]
    except BaseException:
        _CANCEL.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        _CANCEL.clear()
